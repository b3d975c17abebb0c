"""The options several credit rules share; a rule's ``Options`` combines them with its
own (importable from :mod:`creditaudit.methods.base` too)."""

from __future__ import annotations

from dataclasses import dataclass

from creditaudit.config import MAX_SEED, opt


class RuleOptions:
    """Base of a rule's ``Options``: declares, for readers and type checkers, the keys of
    ``[method]`` every rule reads beside its own options. They are not fields of ``Options``:
    :class:`~creditaudit.config.MethodConfig` holds them, and the section a rule is given
    (:attr:`CreditRule.options`) is composed of both."""

    name: str
    penalty: float  # the residual-branch penalty λ
    trainable_blocks: int | None


@dataclass(frozen=True)
class NoRuleOptions(RuleOptions):
    """The options of a rule that has none of its own (BP, the frozen baseline)."""


@dataclass
class SeededOptions(RuleOptions):
    """Rules that draw anything (feedback, auxiliary nets' weights, noise) from their own
    generator."""

    feedback_seed: int | None = opt(
        None, "seed the rule's generator (feedback, auxiliary nets, noise) is derived from "
        "(None = run seed)", min=0, max=MAX_SEED)


@dataclass
class ScaleOptions(RuleOptions):
    """Rules whose feedback has a scale."""

    feedback_scale: float = opt(1.0, "feedback entries ~ N(0, scale²/fan_in) (FA, DFA, DRTP, "
                                "fa-linear, KP; the magnitudes of uSF, brSF, frSF)", min=0.0)


@dataclass
class FeedbackOptions(SeededOptions, ScaleOptions):
    """Rules with random feedback drawn from their generator."""


@dataclass
class LocalOptions(RuleOptions):
    """Rules that train every module on the local surrogate with their credit."""

    normalise_credit: bool = opt(
        True, "train on the per-sample RMS-normalised credit â = a/(RMS(a)+1e-6); false = the "
        "raw credit on the batch-mean scale")


__all__ = ["RuleOptions", "NoRuleOptions", "SeededOptions", "ScaleOptions", "FeedbackOptions",
           "LocalOptions"]
