"""Credit rules behind one interface (:class:`CreditRule`), built by name from the registry.

Importing this package registers the built-in rules; rules of other packages come from the
``creditaudit.rules`` entry points (:mod:`creditaudit.methods.registry`).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any

import torch
from torch import nn

from creditaudit.config import MethodConfig, config_from_dict
from creditaudit.config.sections import MAX_SEED
from creditaudit.errors import ConfigError, ModelContractError
from creditaudit.methods.adapted import set_trainable
from creditaudit.methods.base import CreditRule, StepResult
from creditaudit.methods.bp import BP, BackpropRule, bp_state_gradients
from creditaudit.methods.credit_bridge import CreditBridge
from creditaudit.methods.dfa import DFA, DirectFeedbackRule
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
from creditaudit.methods.surrogate import rms_normalise
from creditaudit.models.adapted import AdaptedModel
from creditaudit.models.contract import ResidualNet, check_contract

# Every module of this package is imported, so a new built-in rule is one file: its class
# registers itself with @register.
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")


def check_binding(cls: type[CreditRule], model: nn.Module) -> None:
    """ModelContractError (one line) when rule ``cls`` cannot train ``model``: an adapted
    model (:func:`creditaudit.adapt`, ``model.arch = "module"``) and a rule that does not
    declare ``adapted_models``. A run plan asks this of the model built on the meta device,
    so a sweep refuses such a run before any run trains. Also a residual network without
    blocks: every rule and diagnostic reads states h_0 … h_L with L ≥ 1."""
    if not isinstance(model, AdaptedModel) and hasattr(model, "blocks") \
            and len(model.blocks) == 0:  # no blocks attribute: the contract check says so
        raise ModelContractError(
            f"{type(model).__name__} has no blocks (n_blocks=0): credit rules and the "
            "diagnostics need states h_0 … h_L with L ≥ 1; build it with at least one block")
    if isinstance(model, AdaptedModel) and not cls.adapted_models:
        able = [name for name in rule_names() if rule_class(name).adapted_models]
        raise ModelContractError(
            f"{cls.name} needs a residual network (embed, blocks returning branches, readout): "
            f"{cls.residual_reason}; adapted models support {', '.join(able)}")


def no_effect_options(cls: type[CreditRule], config: MethodConfig) -> dict[str, str]:
    """The ``method.*`` options ``config`` sets that change nothing with rule ``cls``, by
    name, each with why (one clause, e.g. ``method.penalty=0.1 has no effect with
    method.name='frozen', where no block trains (…)``), in the order :func:`check_options`
    refuses them. A sweep's grid leaves such a value out of the runs it changes nothing in
    (:mod:`creditaudit.sweep.grid`), as it leaves out an option another rule reads.

    The frozen-blocks baseline trains no block, so ``trainable_blocks`` would be recorded
    and never applied (and would make its runs a depth-ladder variant, no baseline for
    (d)); where no block trains (that baseline, ``trainable_blocks=0``) the residual-branch
    ``penalty`` has no branch to act on (it penalises trainable blocks only), so it too
    would be recorded, name a run of its own and change nothing; so would an option the
    rule says its other options leave unread (:meth:`CreditRule.ignored_options`)."""
    out: dict[str, str] = {}
    if cls.baseline and config.trainable_blocks is not None:
        out["trainable_blocks"] = (
            f"method.trainable_blocks={config.trainable_blocks} has no effect with "
            f"method.name={cls.name!r}, which trains no block")
    for key, why in cls.ignored_options(config).items():
        out.setdefault(key, f"method.{key}={getattr(config, key)!r} has no effect with "
                            f"method.name={cls.name!r}: {why}")
    if config.penalty > 0 and (cls.baseline or config.trainable_blocks == 0):
        where = (f"method.name={cls.name!r}" if cls.baseline
                 else "method.trainable_blocks=0")
        out["penalty"] = (f"method.penalty={config.penalty:g} has no effect with {where}, "
                          "where no block trains (the penalty acts on trainable blocks' "
                          "branches only)")
    return out


# How check_options ends each refusal (default: "; leave it out").
_ADVICE = {"trainable_blocks": ": leave it out (the depth ladder trains the last k blocks "
                               "with another rule)",
           "penalty": ": leave it out"}


def check_options(cls: type[CreditRule], config: MethodConfig) -> None:
    """ConfigError (one line) when ``config`` asks of rule ``cls`` what it cannot do: an
    option that would be recorded, name a run of its own and change nothing
    (:func:`no_effect_options`), or options that together would train no block
    (:meth:`CreditRule.refused_options`)."""
    for key, why in no_effect_options(cls, config).items():
        raise ConfigError(why + _ADVICE.get(key, "; leave it out"))
    for key, why in cls.refused_options(config).items():
        raise ConfigError(f"method.{key}={getattr(config, key)!r} {why}")


def build_rule(model: ResidualNet, config: MethodConfig, *, n_classes: int, seed: int,
               cls: type[CreditRule] | None = None, check: bool = True) -> CreditRule:
    """Bind the configured rule to ``model``: freezes blocks as asked, draws feedback.

    ``cls``: the rule's class when the caller has resolved it (a run plan); by default the
    one ``config.name`` names. Feedback matrices come from their own generator, seeded as
    the rule says (:meth:`CreditRule.generator_seed`: its ``feedback_seed``, default the run
    seed; :func:`~creditaudit.methods.feedback.feedback_generator`), so they never consume the
    training RNG and never repeat the model's initial draws. ConfigError when the rule is
    not installed; ModelContractError when ``model`` is an adapted model
    (:func:`creditaudit.adapt`) and the rule does not declare ``adapted_models``.
    ``check=False``: ``config`` is not refused by :func:`check_options` — a run plan checked
    it already, or it is the config of a trained run being rebuilt (which keeps its options).
    """
    cls = rule_class(config.name) if cls is None else cls
    if check:
        check_options(cls, config)
    check_binding(cls, model)
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    set_trainable(model, config.trainable_blocks)
    own_seed = cls.generator_seed(config, seed)
    generator = feedback_generator(seed if own_seed is None else own_seed)
    bound = cls(model, config, n_classes=n_classes, generator=generator)
    # What binding froze is the rule's doing; anything else frozen is the caller's
    # (CreditRule.frozen_outside), which a record must say.
    bound.frozen_by_binding = frozenset(id(p) for p in model.parameters()
                                        if id(p) in trainable and not p.requires_grad)
    device = accelerator_device(model)
    if device is not None:  # what binding drew on the CPU goes where the model is
        bound.to(device)
    return bound


def accelerator_device(model: nn.Module) -> torch.device | None:
    """The one device other than the CPU (and PyTorch's meta device) that every parameter
    and buffer of ``model`` is on, else None: where :func:`build_rule` moves what binding
    made on the CPU (feedback matrices, auxiliary nets), as a run's ``rule.to(device)``
    does — a rule bound to a model already on a GPU otherwise kept them on the CPU, and its
    step or credits failed ("Expected all tensors to be on the same device")."""
    devices = {t.device for t in (*model.parameters(), *model.buffers())}
    if len(devices) != 1:
        return None
    device = devices.pop()
    return None if device.type in ("cpu", "meta") else device


def rule(name: str, model: nn.Module, n_classes: int | None = None, *, seed: int = 0,
         **method_options: Any) -> CreditRule:
    """Credit rule ``name`` bound to ``model``, for a training loop of your own.

    ``model``: an adapted model (:func:`creditaudit.adapt`) or a contract model
    (:class:`~creditaudit.models.ResidualNet`); ``n_classes`` defaults to its number of
    logits. ``method_options`` are ``method.*`` settings (``penalty=1e-3``,
    ``trainable_blocks=2``, ``feedback_scale``, ``feedback_seed``, ``normalise_credit``, …),
    validated like a config's; feedback is drawn from ``feedback_seed``, default ``seed``.
    Then, per batch, ``rule.train_step(x, y, optimizer)`` with an optimizer over
    ``rule.trainable_parameters()``; ``diagnose(model, x, y, credit=rule)`` audits it.
    ConfigError or ModelContractError (one line) for what cannot work.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"seed={seed!r} must be an integer in 0 … {MAX_SEED} (the seed the "
                          "feedback is drawn from)")
    if n_classes is not None and (isinstance(n_classes, bool) or not isinstance(n_classes, int)
                                  or n_classes < 1):
        raise ConfigError(f"n_classes={n_classes!r} must be a positive integer (the number of "
                          "logits) or None (the model's)")
    config = config_from_dict({"method": {"name": name, **method_options}}).method
    if rule_class(name).draws_feedback() and hasattr(config, "feedback_seed") \
            and config.feedback_seed is None:
        # The seed the feedback is drawn from is part of the rule's options, so a record of
        # it (Recorder) says which feedback trained — not the run seed of its config.
        config = dataclasses.replace(config, feedback_seed=seed)
    if not isinstance(model, AdaptedModel):
        try:
            check_contract(model)
        except ModelContractError:
            raise ModelContractError(
                f"rule() trains a ResidualNet or a model built by creditaudit.adapt(model, "
                f"states=[…]); wrap your {type(model).__name__} with adapt()") from None
    classes = int(model.n_classes)  # type: ignore[arg-type]
    if n_classes is not None and n_classes != classes:
        raise ConfigError(f"n_classes={n_classes} but {type(model).__name__} has {classes} "
                          "logits: leave n_classes out or give the number of logits")
    # outside the caller's inference mode: feedback drawn inside it would be inference
    # tensors, which the training step's autograd refuses to save
    with torch.inference_mode(False):
        return build_rule(model, config, n_classes=classes, seed=seed)  # type: ignore[arg-type]


__all__ = ["CreditRule", "StepResult", "BP", "FA", "DFA", "Frozen", "StateBridge",
           "BackpropRule", "DirectFeedbackRule",
           "CreditBridge", "EP", "build_rule", "check_binding", "rule", "bp_state_gradients",
           "rms_normalise", "check_options", "no_effect_options",
           "rule_class", "rule_names", "rule_label", "credit_formula", "find_rule",
           "check_method", "ENTRY_POINT_GROUP"]
