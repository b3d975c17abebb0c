"""The run-level parts of a run record, one of each per run (beside the per-epoch
:class:`~creditaudit.records.parts.EpochEntry`): the final results, the end-of-run
credit-quality block, the protocol state, the reference-gradient check — and one
:class:`ResumedPart` per time the run was resumed.

Their fields are declared like the entry's, documentation and domain in each field
(:func:`creditaudit.descriptions.fields.doc`), from which ``docs/records.md`` is generated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from creditaudit.descriptions.fields import (
    ACCURACY,
    CORRELATION,
    COSINE,
    FLAG,
    FRACTION,
    NONNEGATIVE,
    REAL,
    ListOf,
    doc,
)
from creditaudit.errors import RunRecordError
from creditaudit.registry import ARCHITECTURES
from creditaudit.version import OWN_PACKAGE


# --- result blocks ---------------------------------------------------------
@dataclass
class FinalResults:
    """The headline numbers of the last evaluated epoch (of a diverged run: the last whose
    evaluation was finite)."""

    epochs_completed: int = doc("last evaluated epoch", 0, domain=NONNEGATIVE)
    from_epoch: int | None = doc(
        "diverged runs whose last evaluated epoch was not finite: the epoch the numbers "
        "below are from, the last whose evaluation was finite (a network that overflowed "
        "predicts one class; its own numbers stay in the log). Absent otherwise: the numbers "
        "are those of `epochs_completed`", domain=NONNEGATIVE)
    test_acc: float | None = doc("test accuracy (fraction)", domain=ACCURACY)
    test_loss: float | None = doc("test cross-entropy (nats)", domain=NONNEGATIVE)
    h_L_norm: float | None = doc("median ‖h_L‖", domain=NONNEGATIVE)
    g_L_norm: float | None = doc("median ‖g_L‖ (1/128 scale)", domain=NONNEGATIVE)
    deep_cos: float | None = doc("deep cosine", domain=COSINE)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (``from_epoch`` only where it is set)."""
        out = dataclasses.asdict(self)
        if out["from_epoch"] is None:
            del out["from_epoch"]
        return out


@dataclass
class EndOfRun:
    """The end-of-run credit-quality block (JSON key ``diagnostics``).

    Per-layer lists run over the states l = 0 … L unless noted. Every metric has its
    positive (BP credit) and negative (random credit) control measured on the same model.
    """

    bp_cosine: list[float] | None = doc("cos(a_l, g_l) per state on the evaluation set",
                                        domain=COSINE)
    deep_cos: float | None = doc("mean of bp_cosine over l ≥ 1", domain=COSINE)
    cosine_table: list[dict[str, Any]] | None = doc(
        "per state: cos, median ‖g_l‖, `valid_reference` (‖g_l‖ ≥ floor), `defined` "
        "(the fraction of samples the cosine averages over: a zero credit has no direction) "
        "and `cos_invalid` (why the cosine is not valid, null where it is: as the epochs' "
        "`cos_invalid`; rows from before it lack it)",
        domain={"layer": NONNEGATIVE, "cos": COSINE, "g_norm": NONNEGATIVE,
                "valid_reference": FLAG, "defined": FRACTION})
    cosine_controls: dict[str, list[float]] | None = doc(
        "cosines of the BP credit (`bp`, = 1) and a random credit (`random`)", domain=COSINE)
    gamma: dict[str, float] | None = doc(
        "aggregate alignment Γ under four aggregations: layers_then_samples, "
        "samples_then_layers (the headline), pooled, deep_only", domain=COSINE)
    perturbation_rho: list[float] | None = doc(
        "perturbation correlation ρ_l of the credit (float64)", domain=CORRELATION)
    rho_controls: dict[str, list[float]] | None = doc("ρ of the BP and of a random credit",
                                                      domain=CORRELATION)
    rho_measurable: list[bool] | None = doc(
        "per state: whether perturbation_rho measures the credit there: the BP control's ρ "
        "≥ 0.9 (else the precision or the reference fails) and the credit's ρ is a number "
        "(a credit zero at every sample, as at a block the rule leaves untrained, predicts "
        "no loss change: its ρ is NaN); records from before the second condition state "
        "only the first")
    rho_samples: int | None = doc(
        "samples used for ρ: rho_samples_asked, or ⌊rho_budget_flops / rho_sample_flops⌋ "
        "where that is fewer (never below 8)", domain=NONNEGATIVE)
    rho_directions: int | None = doc("random directions per sample for ρ", domain=NONNEGATIVE)
    rho_se: list[float] | None = doc(
        "per state: standard error of perturbation_rho (jackknife over the samples, each "
        "with its directions)", domain=NONNEGATIVE)
    rho_samples_asked: int | None = doc(
        "samples asked for ρ: `diagnostics.rho_samples`, at most the evaluation samples",
        domain=NONNEGATIVE)
    rho_sample_flops: int | None = doc(
        "floating-point operations of one sample's perturbed forwards for ρ (1 + "
        "rho_directions forwards from each state, counted on the model: matrix products, "
        "convolutions, attention); depends on the model's shapes only", domain=NONNEGATIVE)
    rho_budget_flops: float | None = doc(
        "ρ's compute budget in floating-point operations (`diagnostics.rho_flops`; absent: "
        "none)", domain=NONNEGATIVE)
    nudging: dict[str, list[float]] | None = doc(
        "Δ mean loss after h_l ← h_l − η·a_l/RMS(a_l), per η (key) and deep state 1 … L "
        "(nats; negative = the credit is a descent direction; NaN = not measurable: even "
        "the BP step moved the mean loss by no more than 64 of its float steps, which the "
        "working precision does not resolve — not a Δ of 0)")
    nudging_controls: dict[str, dict[str, list[float]]] | None = doc(
        "the same for the BP credit (`bp`) and a random credit (`random`), NaN where "
        "`nudging` is not measurable")
    nudging_samples: int | None = doc(
        "samples the nudging means run over: every evaluation sample, or ρ's when ρ's "
        "compute budget held fewer than asked", domain=NONNEGATIVE)
    fresh_b_null: dict[str, Any] | None = doc(
        "rules with fixed random feedback: deep cosine with n freshly drawn feedback sets "
        "(mean, std, values) against the training feedback (training_value, z)",
        domain={"mean": COSINE, "std": NONNEGATIVE, "values": ListOf(COSINE),
                "training_value": COSINE, "z": REAL, "n": NONNEGATIVE})
    drift: dict[str, float] | None = doc("‖W_final − W_init‖/‖W_init‖ per parameter",
                                         domain=NONNEGATIVE)
    credit_quality_error: str | None = doc("why the block is missing (e.g. diverged model)")
    extras: dict[str, Any] = doc("rule-specific end-of-run metrics (e.g. EP convergence)",
                                 factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = {f: getattr(self, f) for f in _END_FIELDS
               if f != "extras" and getattr(self, f) is not None}
        out.update(self.extras)
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> EndOfRun:
        known = {k: raw[k] for k in _END_FIELDS if k in raw and k != "extras"}
        return cls(**known, extras={k: v for k, v in raw.items() if k not in _END_FIELDS})

    def update(self, values: Mapping[str, Any]) -> None:
        """Set fields (unknown keys go to ``extras``)."""
        for key, value in values.items():
            if key in _END_FIELDS and key != "extras":
                setattr(self, key, value)
            else:
                self.extras[key] = value

    @property
    def is_empty(self) -> bool:
        return not self.to_dict()


_END_FIELDS = tuple(f.name for f in dataclasses.fields(EndOfRun))


@dataclass
class ProtocolState:
    """The four-diagnostic protocol as evaluated during training."""

    first_fired: dict[str, int | None] = doc(
        "first epoch each diagnostic fired (None = never)", factory=dict)
    epoch: int | None = doc("epoch of the last protocol evaluation")
    verdict: str | None = doc("verdict at that epoch")
    fired: list[str] = doc("diagnostics that fired at that epoch", factory=list)
    report: dict[str, Any] | None = doc("the full protocol report of that epoch")

    def to_dict(self) -> dict[str, Any]:
        if self.epoch is None and not self.first_fired:
            return {}
        return dataclasses.asdict(self)


def own_architecture(name: str, factory: Any = None) -> bool:
    """Whether architecture ``name`` (with ``factory``, the ``model.factory`` of a ``module``
    model) builds from creditaudit's own modules: a built-in architecture, or the ``module``
    architecture with a factory of creditaudit's own package (its test networks and the
    literature experiment's, whose reference gradients the test suite checks) — not a
    plugin's, not a user's factory or loop. What a record written before the reference check
    says of its reference (:class:`ReferenceState`). Read from the record's own strings:
    nothing is imported."""
    cls = ARCHITECTURES.find(name)
    origin = ARCHITECTURES.origin(name) if cls is not None else None
    if origin is None or not origin.builtin:
        return False
    if not cls.adapted:
        return True
    return isinstance(factory, str) and factory.split(".")[0].split(":")[0] == OWN_PACKAGE


# --- the reference gradient ------------------------------------------------------------------
HOW_NOT_CHECKED, HOW_FAILED, HOW_SKIPPED = "not checked", "failed", "skipped"
HOW_BUILT_IN = "built-in"
VERIFIED_HOWS = ("states", "modules")
REFERENCE_HOWS = (*VERIFIED_HOWS, HOW_FAILED, HOW_SKIPPED, HOW_NOT_CHECKED, HOW_BUILT_IN)
NOT_CHECKED_DETAIL = "reference not checked (recorded before creditaudit checked it)"
BUILT_IN_DETAIL = ("reference not checked (recorded before creditaudit checked it) on a "
                   "creditaudit architecture: its backward is autograd through creditaudit's "
                   "own modules, whose gradients creditaudit's tests check")
UNCHECKED_DETAIL = "reference not checked (the run stopped before its model was checked)"


@dataclass
class ReferenceState:
    """Whether the reference gradient g_l = ∂CE/∂h_l every cosine, Γ and diagnostic (b)
    compare with was checked to be the gradient of the model's forward, when the run
    started (JSON key ``reference``). Read only: what it means for a verdict is decided by
    the protocol."""

    verified: bool = doc("the model's backward agreed with float64 central differences of "
                         "its forward: the reference is the true gradient", False)
    how: str = doc("`states` (the loss's directional derivatives at h_0 and h_L), `modules` "
                   "(each module between the states), `failed` (the check found a backward "
                   "that is not the gradient — as the run started or, for a network from "
                   "outside creditaudit, checked again at each epoch, from the epoch "
                   "`detail` names — and the run was allowed to go on: "
                   "`diagnostics.allow_unverified_reference`), `skipped` (nothing could be "
                   "compared), `not checked` (records written before creditaudit checked "
                   "it, of a model built from outside code; read as such) or `built-in` "
                   "(records written before the check, of one of creditaudit's own "
                   "architectures, whose backward is autograd through its own modules)",
                   HOW_NOT_CHECKED)
    where: str | None = doc("`failed`: the module (`blocks.1.w2`) or the segment (`between "
                            "h_2 and h_3`) whose backward is not the gradient, when it "
                            "could be placed; `training mode` for a backward that is the "
                            "gradient only in eval mode")
    detail: str = doc("one line: what was compared, or what was found", UNCHECKED_DETAIL)

    @property
    def failed(self) -> bool:
        return self.how == HOW_FAILED

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: Any, where: str = "run record", *, own_model: bool = False
                  ) -> ReferenceState:
        """The block as stored, checked (RunRecordError naming ``where`` otherwise); a record
        without one (written before the check existed) says the reference was not checked —
        never that it was verified — and, when ``own_model`` (the run's architecture is one
        of creditaudit's own, built from its own modules), that it was such a model."""
        if raw is None:
            if own_model:
                return cls(how=HOW_BUILT_IN, detail=BUILT_IN_DETAIL)
            return cls(detail=NOT_CHECKED_DETAIL)
        if not isinstance(raw, dict):
            raise RunRecordError(f"{where}: reference must be an object, got "
                                 f"{type(raw).__name__}")
        unknown = sorted(set(raw) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise RunRecordError(f"{where}: reference has an unexpected field {unknown[0]!r}")
        state = cls(**raw)
        for name, kind in (("verified", bool), ("how", str), ("where", (str, type(None))),
                           ("detail", str)):
            if not isinstance(getattr(state, name), kind):
                raise RunRecordError(f"{where}: reference.{name} has the wrong type "
                                     f"({type(getattr(state, name)).__name__})")
        if state.how not in REFERENCE_HOWS:
            raise RunRecordError(f"{where}: reference.how {state.how!r} is not one of "
                                 f"{', '.join(REFERENCE_HOWS)}")
        if state.verified != (state.how in VERIFIED_HOWS):
            raise RunRecordError(f"{where}: reference.verified={str(state.verified).lower()} "
                                 f"contradicts how {state.how!r}")
        return state


# --- the parts of a resumed run ------------------------------------------------------------
@dataclass
class ResumedPart:
    """One resumed part of a run (an item of the record's ``resumed``): the epoch it went on
    from and what it ran on. The record's ``environment`` and ``config`` are those of the
    part that started the run."""

    epoch: int = doc("the first epoch this part trained (it resumed from the checkpoint of "
                     "the epoch before)", 1, domain=NONNEGATIVE)
    started: str | None = doc("time this part started (ISO 8601)")
    environment: dict[str, Any] = doc(
        "what this part ran on, with the keys of the record's `environment`: `source` (the "
        "creditaudit commit), package versions, `components`, device, `torch_threads`, "
        "`execution`", factory=dict)
    settings: dict[str, Any] = doc(
        "the options of role `place` (device, threads, folders, loggers, progress) this part "
        "was given where they differ from the record's `config`, which holds the first "
        "part's: dotted key → value", factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> ResumedPart:
        """The part as stored, checked (one-line RunRecordError naming ``where``)."""
        if not isinstance(raw, dict):
            raise RunRecordError(f"{where} must be an object, got {type(raw).__name__}")
        unknown = sorted(set(raw) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise RunRecordError(f"{where} has an unexpected field {unknown[0]!r}")
        if "epoch" not in raw:
            raise RunRecordError(f"{where} lacks the key 'epoch'")
        part = cls(**raw)
        if isinstance(part.epoch, bool) or not isinstance(part.epoch, int) or part.epoch < 0:
            raise RunRecordError(f"{where}.epoch must be an epoch number, got {part.epoch!r}")
        for name, kind in (("started", (str, type(None))), ("environment", dict),
                           ("settings", dict)):
            if not isinstance(getattr(part, name), kind):
                raise RunRecordError(f"{where}.{name} has the wrong type "
                                     f"({type(getattr(part, name)).__name__})")
        return part
