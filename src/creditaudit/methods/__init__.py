"""Credit rules behind one interface (:class:`CreditRule`), built by name from the registry.

Importing this package registers the built-in rules; rules of other packages come from the
``creditaudit.rules`` entry points (:mod:`creditaudit.methods.registry`).
"""

from __future__ import annotations

import importlib
import pkgutil

from creditaudit.config import MethodConfig
from creditaudit.methods.base import CreditRule, StepResult, rms_normalise
from creditaudit.methods.bp import BP, bp_state_gradients
from creditaudit.methods.credit_bridge import CreditBridge
from creditaudit.methods.dfa import DFA
from creditaudit.methods.ep import EP
from creditaudit.methods.fa import FA
from creditaudit.methods.feedback import feedback_generator
from creditaudit.methods.frozen import Frozen
from creditaudit.methods.registry import (
    ENTRY_POINT_GROUP,
    check_method,
    credit_formula,
    find_rule,
    rule_class,
    rule_label,
    rule_names,
)
from creditaudit.methods.state_bridge import StateBridge
from creditaudit.models.contract import ResidualNet, set_trainable_blocks

# Every module of this package is imported, so a new built-in rule is one file: its class
# registers itself with @register.
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")


def build_rule(model: ResidualNet, config: MethodConfig, *, n_classes: int, seed: int
               ) -> CreditRule:
    """Bind the configured rule to ``model``: freezes blocks as asked, draws feedback.

    Feedback matrices come from their own generator derived from ``config.feedback_seed``
    (default: the run seed; :func:`~creditaudit.methods.feedback.feedback_generator`), so
    they never consume the training RNG and never repeat the model's initial draws.
    ConfigError when the rule is not installed.
    """
    cls = rule_class(config.name)
    set_trainable_blocks(model, config.trainable_blocks)
    feedback_seed = config.feedback_seed if cls.draws_feedback() else None
    generator = feedback_generator(seed if feedback_seed is None else feedback_seed)
    return cls(model, config, n_classes=n_classes, generator=generator)


__all__ = ["CreditRule", "StepResult", "BP", "FA", "DFA", "Frozen", "StateBridge",
           "CreditBridge", "EP", "build_rule", "bp_state_gradients", "rms_normalise",
           "rule_class", "rule_names", "rule_label", "credit_formula", "find_rule",
           "check_method", "ENTRY_POINT_GROUP"]
