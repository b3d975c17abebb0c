"""The parts of a run record: one epoch's entry, the final results, the end-of-run block,
the protocol state, and the verdict readers report.

Each part is a dataclass whose fields carry their documentation (:func:`doc`), from which
``docs/records.md`` is generated; :mod:`creditaudit.records.schema` assembles them into a
:class:`~creditaudit.records.schema.RunRecord`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from creditaudit.errors import RunRecordError


def doc(text: str, default: Any = None, *, factory: Any = None) -> Any:
    """A dataclass field documented by ``text`` (rendered into docs/records.md)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"doc": text})
    return field(default=default, metadata={"doc": text})


def as_number(value: Any) -> float | None:
    """A float for int/float values (NaN and inf kept), None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def finite_number(value: Any) -> float | None:
    number = as_number(value)
    return number if number is not None and math.isfinite(number) else None


def deep_mean(values: Sequence[Any] | None) -> float | None:
    """Mean over layers l ≥ 1 of the finite values; None when there is none."""
    if not values or len(values) < 2:
        return None
    kept = [v for v in (finite_number(x) for x in values[1:]) if v is not None]
    return sum(kept) / len(kept) if kept else None


@dataclass
class Verdict:
    """A run's protocol outcome as readers report it.

    ``statuses``: (a)…(d) → fired / passed / not evaluated; ``verdict``: needs walk-back,
    trustworthy (all four evaluated) or incomplete; ``text``: what a table prints;
    ``margin_pp``: (d)'s statistic; ``frozen_acc``: the baseline it was compared with.
    """

    statuses: dict[str, str]
    fired: list[str]
    not_evaluated: list[str]
    verdict: str
    text: str
    margin_pp: float | None = None
    frozen_acc: float | None = None
    frozen_runs: int = 0

    @property
    def walked_back(self) -> bool:
        return bool(self.fired)


# --- one epoch ----------------------------------------------------------------------------
@dataclass
class EpochEntry:
    """One evaluated epoch (epoch 0 = at initialisation).

    Norms are medians over the evaluation samples of per-sample L2 norms; gradients follow
    the (1/128)·∂CE_i/∂h_l scale convention (the batch-mean loss of a batch of 128).
    """

    epoch: int = doc("epoch number (0 = initialisation, before any training)", 0)
    test_loss: float | None = doc("mean cross-entropy on the whole test split (nats)")
    acc_eval: float | None = doc("test accuracy on the whole test split (fraction); also "
                                 "written as `test_acc`")
    train_loss: float | None = doc("mean training cross-entropy over the epoch (nats)")
    train_acc: float | None = doc("training accuracy over the epoch (fraction)")
    lr: float | None = doc("learning rate at the end of the epoch")
    seconds: float | None = doc("wall-clock seconds of the epoch (training + evaluation)")
    hidden_norms: list[float] | None = doc("median ‖h_l‖ per state l = 0 … L")
    hidden_norms_cls: list[float] | None = doc("token models: the same, of the CLS token")
    bp_grad_norms_per_sample_med: list[float] | None = doc(
        "median ‖g_l‖ per state (g_l = backprop gradient, 1/128 scale)")
    h_L_norm: float | None = doc("median ‖h_L‖ (deepest state)")
    g_L_norm: float | None = doc("median ‖g_L‖ (statistic of diagnostic (b))")
    g_2_norm: float | None = doc("median ‖g_2‖ (the original study's mid-depth gradient)")
    g_L_zero_fraction: float | None = doc("fraction of samples whose g_L is exactly 0")
    g_L_nonzero_median: float | None = doc("median ‖g_L‖ over the samples where it is not 0")
    max_block_growth: float | None = doc(
        "max_l ‖h_{l+1}‖/‖h_l‖ of the median norms (statistic of diagnostic (a))")
    cos_per_layer: list[float] | None = doc(
        "cos(a_l, g_l) per state: per sample, then mean over samples")
    cos_valid: list[bool] | None = doc(
        "per state: whether the reference ‖g_l‖ is at or above the floor (1e-7); a cosine "
        "against a gradient below the floor is measured against numerical noise")
    cos_defined: list[float] | None = doc(
        "per state: the fraction of samples cos_per_layer averages over (a sample whose "
        "credit or gradient is exactly zero has no direction and is left out)")
    deep_cos: float | None = doc("mean of cos_per_layer over the deep states l ≥ 1")
    deep_cos_valid: bool | None = doc("whether every deep state's reference is valid")
    feedback_layers: list[str] | None = doc(
        "rules whose feedback matrix B stands in for one weight matrix W in the backward "
        "pass (fa-linear, usf, brsf, frsf, kp): the names of those layers, in module order")
    feedback_angle: list[float] | None = doc(
        "per feedback layer: the angle between B and W in degrees, of the flattened "
        "matrices (Lillicrap's angle between B and Wᵀ; BioTorch's layer alignment): 0 = B ∝ W, "
        "90 = unrelated")
    feedback_norm_ratio: list[float] | None = doc(
        "per feedback layer: ‖B‖/‖W‖ (Frobenius norms; BioTorch's weight ratio)")
    protocol: dict[str, str] | None = doc(
        "status of each diagnostic at this epoch: fired, passed or not evaluated")
    verdict: str | None = doc("protocol verdict at this epoch")
    extras: dict[str, float] = doc(
        "rule-specific per-epoch values written beside the others, e.g. `state_pred_error`, "
        "`bridge_consistency_error`, `ep_relax_grad_ratio`", factory=dict)

    @property
    def test_acc(self) -> float | None:
        return self.acc_eval

    @property
    def has_diagnostics(self) -> bool:
        return self.hidden_norms is not None

    def value(self, key: str) -> Any:
        """A field or rule extra by its record key (None when absent)."""
        if key == "test_acc":
            return self.acc_eval
        if key in _ENTRY_FIELDS:
            return getattr(self, key)
        return self.extras.get(key)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"epoch": self.epoch}
        for name in _ENTRY_FIELDS:
            value = getattr(self, name)
            if name in ("epoch", "extras") or value is None:
                continue
            out[name] = value
            if name == "acc_eval":
                out["test_acc"] = value
        out.update(self.extras)
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "log entry") -> EpochEntry:
        if not isinstance(raw, Mapping):
            raise RunRecordError(f"{where} is not an object")
        epoch = raw.get("epoch")
        if isinstance(epoch, bool) or not isinstance(epoch, int):
            raise RunRecordError(f"{where} has no integer 'epoch'")
        known = {k: raw[k] for k in _ENTRY_FIELDS if k in raw and k != "extras"}
        extras = {k: v for k, v in raw.items()
                  if k not in _ENTRY_FIELDS and k != "test_acc"}
        for key, value in extras.items():
            if value is not None and as_number(value) is None:
                raise RunRecordError(f"{where}: {key!r} must be a number, got "
                                     f"{type(value).__name__}")
        return cls(**known, extras=extras)


_ENTRY_FIELDS = tuple(f.name for f in dataclasses.fields(EpochEntry))


# --- result blocks ---------------------------------------------------------
@dataclass
class FinalResults:
    """The headline numbers of the last evaluated epoch."""

    epochs_completed: int = doc("last evaluated epoch", 0)
    test_acc: float | None = doc("test accuracy (fraction)")
    test_loss: float | None = doc("test cross-entropy (nats)")
    h_L_norm: float | None = doc("median ‖h_L‖")
    g_L_norm: float | None = doc("median ‖g_L‖ (1/128 scale)")
    deep_cos: float | None = doc("deep cosine")


@dataclass
class EndOfRun:
    """The end-of-run credit-quality block (JSON key ``diagnostics``).

    Per-layer lists run over the states l = 0 … L unless noted. Every metric has its
    positive (BP credit) and negative (random credit) control measured on the same model.
    """

    bp_cosine: list[float] | None = doc("cos(a_l, g_l) per state on the evaluation set")
    deep_cos: float | None = doc("mean of bp_cosine over l ≥ 1")
    cosine_table: list[dict[str, Any]] | None = doc(
        "per state: cos, median ‖g_l‖, `valid_reference` (‖g_l‖ ≥ floor) and `defined` "
        "(the fraction of samples the cosine averages over: a zero credit has no direction)")
    cosine_controls: dict[str, list[float]] | None = doc(
        "cosines of the BP credit (`bp`, = 1) and a random credit (`random`)")
    gamma: dict[str, float] | None = doc(
        "aggregate alignment Γ under four aggregations: layers_then_samples, "
        "samples_then_layers (the headline), pooled, deep_only")
    perturbation_rho: list[float] | None = doc(
        "perturbation correlation ρ_l of the credit (float64)")
    rho_controls: dict[str, list[float]] | None = doc("ρ of the BP and of a random credit")
    rho_measurable: list[bool] | None = doc("per state: BP control ρ ≥ 0.9")
    rho_samples: int | None = doc(
        "samples used for ρ: rho_samples_asked, or ⌊rho_budget_flops / rho_sample_flops⌋ "
        "where that is fewer (never below 8)")
    rho_directions: int | None = doc("random directions per sample for ρ")
    rho_se: list[float] | None = doc(
        "per state: standard error of perturbation_rho (jackknife over the samples, each "
        "with its directions)")
    rho_samples_asked: int | None = doc(
        "samples asked for ρ: `diagnostics.rho_samples`, at most the evaluation samples")
    rho_sample_flops: int | None = doc(
        "floating-point operations of one sample's perturbed forwards for ρ (1 + "
        "rho_directions forwards from each state, counted on the model: matrix products, "
        "convolutions, attention); depends on the model's shapes only")
    rho_budget_flops: float | None = doc(
        "ρ's compute budget in floating-point operations (`diagnostics.rho_flops`; absent: "
        "none)")
    nudging: dict[str, list[float]] | None = doc(
        "Δ mean loss after h_l ← h_l − η·a_l/RMS(a_l), per η (key) and deep state 1 … L "
        "(nats; negative = the credit is a descent direction)")
    nudging_controls: dict[str, dict[str, list[float]]] | None = doc(
        "the same for the BP credit (`bp`) and a random credit (`random`)")
    nudging_samples: int | None = doc(
        "samples the nudging means run over: every evaluation sample, or ρ's when ρ's "
        "compute budget held fewer than asked")
    fresh_b_null: dict[str, Any] | None = doc(
        "rules with fixed random feedback: deep cosine with n freshly drawn feedback sets "
        "(mean, std, values) against the training feedback (training_value, z)")
    drift: dict[str, float] | None = doc("‖W_final − W_init‖/‖W_init‖ per parameter")
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
