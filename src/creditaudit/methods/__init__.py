"""Credit rules behind one interface (:class:`CreditRule`), built by name."""

from __future__ import annotations

import torch

from creditaudit.config import MethodConfig
from creditaudit.errors import ConfigError
from creditaudit.methods.base import CreditRule, StepResult, rms_normalise
from creditaudit.methods.bp import BP, Frozen, bp_state_gradients
from creditaudit.methods.credit_bridge import CreditBridge
from creditaudit.methods.dfa import DFA
from creditaudit.methods.ep import EP
from creditaudit.methods.fa import FA
from creditaudit.methods.state_bridge import StateBridge
from creditaudit.models.contract import ResidualNet, set_trainable_blocks

RULES: dict[str, type[CreditRule]] = {
    "bp": BP, "fa": FA, "dfa": DFA, "frozen": Frozen, "state-bridge": StateBridge,
    "credit-bridge": CreditBridge, "ep": EP,
}


def build_rule(model: ResidualNet, config: MethodConfig, *, n_classes: int, seed: int
               ) -> CreditRule:
    """Bind the configured rule to ``model``: freezes blocks as asked, draws feedback.

    Feedback matrices come from their own generator seeded by ``config.feedback_seed``
    (default: the run seed), so they never consume the training RNG.
    """
    if config.name not in RULES:
        raise ConfigError(f"method.name={config.name!r} is not allowed; choose one of "
                          f"{', '.join(RULES)}")
    trainable = 0 if config.name == "frozen" else config.trainable_blocks
    set_trainable_blocks(model, trainable)
    feedback_seed = seed if config.feedback_seed is None else config.feedback_seed
    generator = torch.Generator().manual_seed(feedback_seed)
    return RULES[config.name](model, config, n_classes=n_classes, generator=generator)


__all__ = ["CreditRule", "StepResult", "BP", "FA", "DFA", "Frozen", "StateBridge",
           "CreditBridge", "EP", "RULES", "build_rule", "bp_state_gradients", "rms_normalise"]
