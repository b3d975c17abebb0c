"""Typed run records: what a run writes to ``record.json`` and every reader reads back.

A record is a :class:`RunRecord` holding the validated :class:`~creditaudit.config.RunConfig`,
one :class:`EpochEntry` per evaluated epoch, the :class:`FinalResults`, the end-of-run
:class:`EndOfRun` credit-quality block, the :class:`ProtocolState` of the four-diagnostic
protocol, and the :class:`DataIdentity` of the data it trained on. JSON keys are the field
names (the per-epoch keys of the original study, such as ``hidden_norms`` and
``bp_grad_norms_per_sample_med``, are kept). Field documentation lives in each field's
metadata; ``docs/records.md`` is generated from it (``scripts/gen_records_doc.py``).

Readers never index the JSON: they use the accessors here (``final_acc``, ``deep_cos``,
``series``, ``recipe_key``, …), so a change of layout is made in one place.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from creditaudit.config import NON_SEMANTIC, RunConfig, config_from_dict
from creditaudit.data import n_classes_of
from creditaudit.data.identity import DataIdentity
from creditaudit.errors import CreditAuditError, RunRecordError
from creditaudit.protocol import (
    FIRED,
    NOT_EVALUATED,
    DiagnosticReport,
    Thresholds,
    depth_utility_diagnostic,
    verdict_from,
    verdict_of,
    verdict_phrase,
)

SCHEMA = "creditaudit.run/2"
LEGACY_SCHEMAS = ("creditaudit.run/1",)
STATUSES = ("running", "completed", "diverged", "interrupted", "failed")
FINISHED = ("completed", "diverged")
DIAGNOSTIC_IDS = ("a", "b", "c", "d")
# Per-epoch fields that depend on wall-clock time, not on what was computed.
TIMING_KEYS = ("seconds",)


def doc(text: str, default: Any = None, *, factory: Any = None) -> Any:
    """A dataclass field documented by ``text`` (rendered into docs/records.md)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"doc": text})
    return field(default=default, metadata={"doc": text})


def _number(value: Any) -> float | None:
    """A float for int/float values (NaN and inf kept), None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _finite(value: Any) -> float | None:
    number = _number(value)
    return number if number is not None and math.isfinite(number) else None


def deep_mean(values: Sequence[Any] | None) -> float | None:
    """Mean over layers l ≥ 1 of the finite values; None when there is none."""
    if not values or len(values) < 2:
        return None
    kept = [v for v in (_finite(x) for x in values[1:]) if v is not None]
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
            if value is not None and _number(value) is None:
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
        "per state: cos, median ‖g_l‖ and `valid_reference` (‖g_l‖ ≥ floor)")
    cosine_controls: dict[str, list[float]] | None = doc(
        "cosines of the BP credit (`bp`, = 1) and a random credit (`random`)")
    gamma: dict[str, float] | None = doc(
        "aggregate alignment Γ under four aggregations: layers_then_samples, "
        "samples_then_layers (the headline), pooled, deep_only")
    perturbation_rho: list[float] | None = doc(
        "perturbation correlation ρ_l of the credit (float64)")
    rho_controls: dict[str, list[float]] | None = doc("ρ of the BP and of a random credit")
    rho_measurable: list[bool] | None = doc("per state: BP control ρ ≥ 0.9")
    rho_samples: int | None = doc("samples used for ρ")
    rho_directions: int | None = doc("random directions per sample for ρ")
    nudging: dict[str, list[float]] | None = doc(
        "Δ mean loss after h_l ← h_l − η·a_l/RMS(a_l), per η (key) and deep state 1 … L "
        "(nats; negative = the credit is a descent direction)")
    nudging_controls: dict[str, dict[str, list[float]]] | None = doc(
        "the same for the BP credit (`bp`) and a random credit (`random`)")
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


# --- the run -------------------------------------------------------------------------------
@dataclass
class RunRecord:
    """One run: config, status, per-epoch log and results (``record.json``)."""

    run_id: str = doc("OUT/RUN_ID folder name: method-arch-dataset-seed-hash of everything "
                      "that changes what the run computes, data fingerprint included", "")
    config: RunConfig = doc("the resolved run config", factory=RunConfig)
    status: str = doc("running, completed, diverged, interrupted or failed", "running")
    log: list[EpochEntry] = doc("one entry per evaluated epoch", factory=list)
    final: FinalResults | None = doc("headline numbers of the last epoch (finished runs)")
    diagnostics: EndOfRun = doc("end-of-run credit-quality metrics", factory=EndOfRun)
    protocol: ProtocolState = doc("protocol evaluated during training", factory=ProtocolState)
    data: DataIdentity | None = doc("identity of the data the run trained on")
    environment: dict[str, Any] = doc("package versions, device, threads", factory=dict)
    created: str | None = doc("time the run started (ISO 8601)")
    updated: str | None = doc("time the record was last written")
    error: str | None = doc("failed runs: the error")
    divergence: dict[str, Any] | None = doc("diverged runs: epoch, step and reason")
    stopped_early: dict[str, Any] | None = doc("runs stopped by --stop-on-walkback: epoch, "
                                               "reason")
    schema: str = doc("record format version", SCHEMA)

    # --- identity ---------------------------------------------------------------------------
    @property
    def method(self) -> str:
        return self.config.method.name

    @property
    def penalty(self) -> float:
        return self.config.method.penalty

    @property
    def seed(self) -> int:
        return self.config.run.seed

    @property
    def dataset(self) -> str:
        return self.config.data.name

    @property
    def epochs(self) -> int:
        return self.config.optim.epochs

    @property
    def n_classes(self) -> int:
        return n_classes_of(self.dataset)

    @property
    def chance(self) -> float:
        """Accuracy of uniform guessing, 1/C."""
        return 1.0 / self.n_classes

    @property
    def is_finished(self) -> bool:
        """Completed or diverged: the trajectory is final (a diverged run keeps its epochs)."""
        return self.status in FINISHED

    @property
    def is_failed(self) -> bool:
        return self.status == "failed"

    @property
    def is_frozen_baseline(self) -> bool:
        """A frozen-blocks run without penalty on real labels: the baseline of (d)."""
        return (self.method == "frozen" and self.penalty == 0
                and not self.config.data.random_targets)

    @property
    def is_plain(self) -> bool:
        """No penalty, all blocks trainable, real labels: the canonical run of its method."""
        method = self.config.method
        return (method.penalty == 0 and method.trainable_blocks is None
                and not self.config.data.random_targets)

    @property
    def is_standard(self) -> bool:
        """Not a control variant (depth ladder, random labels, no residual stream)."""
        c = self.config
        return (c.method.trainable_blocks is None and not c.data.random_targets
                and c.model.residual)

    @property
    def arch_variant(self) -> str:
        """``resmlp``, ``resmlp-noLN``, ``student``, ``vit`` … (+ ``-no-residual``)."""
        model = self.config.model
        name = model.arch
        if name != "student" and not model.out_ln:
            name += "-noLN"
        if not model.residual:
            name += "-no-residual"
        return name

    @property
    def recipe_key(self) -> str:
        """Equal for runs that share how the network was trained apart from the credit rule
        and the seed: the data (its identity, not its folder), the model, the optimiser and
        the precision. A frozen-blocks run of the same recipe is the baseline of (d)."""
        return recipe_key(self.config, self.data.source if self.data else None)

    # --- epochs -----------------------------------------------------------------------------
    def last_entry(self) -> EpochEntry | None:
        """The last log entry with diagnostics (norms, gradients, cosines)."""
        return next((e for e in reversed(self.log) if e.has_diagnostics), None)

    def last_value(self, key: str) -> Any:
        """The last non-None value of per-epoch ``key`` (a field or a rule extra)."""
        for entry in reversed(self.log):
            value = entry.value(key)
            if value is not None:
                return value
        return None

    def series(self, key: str, index: int | None = None) -> tuple[list[int], list[float]]:
        """(epochs, values) of per-epoch ``key`` (``value[index]`` for per-layer lists);
        missing values are skipped, non-numbers read as NaN."""
        epochs, values = [], []
        for entry in self.log:
            value = entry.value(key)
            if value is None:
                continue
            if index is not None:
                if not isinstance(value, list) or not -len(value) <= index < len(value):
                    continue
                value = value[index]
            number = _number(value)
            epochs.append(entry.epoch)
            values.append(math.nan if number is None else number)
        return epochs, values

    def entry(self, epoch: int) -> EpochEntry | None:
        return next((e for e in reversed(self.log) if e.epoch == epoch), None)

    # --- headline numbers -------------------------------------------------------------------
    @property
    def final_acc(self) -> float | None:
        """Headline test accuracy: the final results', else the last logged epoch's."""
        if self.final is not None and _finite(self.final.test_acc) is not None:
            return float(self.final.test_acc)  # type: ignore[arg-type]
        return _finite(self.last_value("acc_eval"))

    @property
    def deep_cos(self) -> float | None:
        """Deep cosine (mean over l ≥ 1): end of run, else the last evaluated epoch."""
        for value in (self.diagnostics.deep_cos,
                      self.final.deep_cos if self.final else None):
            if _finite(value) is not None:
                return float(value)  # type: ignore[arg-type]
        last = self.last_entry()
        if last is None:
            return None
        if _finite(last.deep_cos) is not None:
            return float(last.deep_cos)  # type: ignore[arg-type]
        return deep_mean(last.cos_per_layer)

    @property
    def deep_cos_valid(self) -> bool | None:
        """Whether the deep cosine was measured against valid reference gradients."""
        table = self.diagnostics.cosine_table
        if table:
            return all(bool(row.get("valid_reference")) for row in table[1:])
        last = self.last_entry()
        return None if last is None else last.deep_cos_valid

    @property
    def headline_gamma(self) -> float | None:
        """Headline Γ (samples then layers): end of run, else the last epoch's cosines
        averaged over layers (the same aggregation)."""
        gamma = self.diagnostics.gamma or {}
        value = _finite(gamma.get("samples_then_layers"))
        if value is not None:
            return value
        last = self.last_entry()
        kept = [v for v in (_finite(x) for x in (last.cos_per_layer or []))
                if v is not None] if last else []
        return sum(kept) / len(kept) if kept else None

    @property
    def deep_rho(self) -> float | None:
        return deep_mean(self.diagnostics.perturbation_rho)

    def nudging_at(self, eta: str | None = None) -> list[float] | None:
        """Nudging Δ per deep state at step ``eta`` (default: the smallest recorded)."""
        nudging = self.diagnostics.nudging or {}
        if not nudging:
            return None
        key = eta if eta is not None else min(nudging, key=float)
        return nudging.get(key)

    # --- protocol ---------------------------------------------------------------------------
    def recorded_statuses(self) -> dict[str, str]:
        """(a)…(d) statuses of the run's last training-time protocol evaluation."""
        diagnostics = (self.protocol.report or {}).get("diagnostics") or {}
        if diagnostics:
            return {i: diagnostics[i]["status"] for i in DIAGNOSTIC_IDS if i in diagnostics}
        for entry in reversed(self.log):
            if entry.protocol:
                return dict(entry.protocol)
        return {}

    def recorded_value(self, diagnostic: str) -> float | None:
        """The statistic of ``diagnostic`` at the run's last protocol evaluation."""
        diagnostics = (self.protocol.report or {}).get("diagnostics") or {}
        return _number((diagnostics.get(diagnostic) or {}).get("value"))

    def first_fired(self) -> dict[str, int | None]:
        """First epoch each diagnostic fired during training (None = never)."""
        out: dict[str, int | None] = dict.fromkeys(DIAGNOSTIC_IDS)
        for entry in self.log:
            for i in DIAGNOSTIC_IDS:
                if out[i] is None and (entry.protocol or {}).get(i) == "fired":
                    out[i] = entry.epoch
        for i, epoch in self.protocol.first_fired.items():
            if i in out and out[i] is None and epoch is not None:
                out[i] = int(epoch)
        return out

    def verdict(self, frozen_acc: float | None = None, frozen_runs: int = 0,
                thresholds: Thresholds | None = None) -> Verdict:
        """The verdict: (a)–(c) as recorded at the last protocol evaluation; (d) against
        ``frozen_acc`` when given (the mean accuracy of ``frozen_runs`` frozen-blocks runs of
        this recipe), else as recorded. A frozen baseline itself is not judged on (d)."""
        statuses = self.recorded_statuses()
        for i in DIAGNOSTIC_IDS:
            statuses.setdefault(i, NOT_EVALUATED)
        margin = self.recorded_value("d")
        if frozen_acc is not None and not self.is_frozen_baseline:
            d = depth_utility_diagnostic(self.final_acc, frozen_acc, thresholds or Thresholds())
            statuses["d"], margin = d.status, d.value
        fired = [i for i in DIAGNOSTIC_IDS if statuses[i] == FIRED]
        skipped = [i for i in DIAGNOSTIC_IDS if statuses[i] == NOT_EVALUATED]
        return Verdict(statuses, fired, skipped, verdict_from(fired, skipped),
                       verdict_phrase(fired, skipped), margin, frozen_acc, frozen_runs)

    def protocol_report(self, frozen_acc: float | None = None, frozen_runs: int = 0
                        ) -> DiagnosticReport | None:
        """The run's last protocol report, with Γ, per-layer cosines and the credit-quality
        metrics filled in from the end-of-run block, and (d) re-evaluated against
        ``frozen_acc`` when given (``metadata["frozen_from_runs"]`` = ``frozen_runs``)."""
        if not self.protocol.report:
            return None
        report = DiagnosticReport.from_dict(json.loads(json.dumps(self.protocol.report)))
        end = self.diagnostics
        if report.gamma is None and end.gamma:
            report.gamma = dict(end.gamma)
        if report.layer_cosines is None and end.cosine_table:
            report.layer_cosines = list(end.cosine_table)
        if report.metrics is None and end.bp_cosine is not None:
            metrics = end.to_dict()
            for key in ("drift", "cosine_table"):
                metrics.pop(key, None)
            report.metrics = metrics
        if frozen_acc is not None and not self.is_frozen_baseline:
            headline = report.metadata.get("headline_acc")
            if headline is None:
                headline = self.final_acc
            d = depth_utility_diagnostic(headline, frozen_acc, report.thresholds)
            d.details["frozen_runs"] = frozen_runs
            report.diagnostics = [d if r.id == "d" else r for r in report.diagnostics]
            report.verdict, report.fired, report.not_evaluated = verdict_of(report.diagnostics)
            report.metadata["frozen_acc"] = frozen_acc
            report.metadata["frozen_from_runs"] = frozen_runs
        return report

    # --- serialisation ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.schema, "run_id": self.run_id, "config": self.config.to_dict(),
            "data": None if self.data is None else dataclasses.asdict(self.data),
            "environment": self.environment, "status": self.status,
            "created": self.created, "updated": self.updated,
            "log": [e.to_dict() for e in self.log],
            "final": None if self.final is None else dataclasses.asdict(self.final),
            "diagnostics": self.diagnostics.to_dict(),
            "protocol": self.protocol.to_dict(),
            "error": self.error,
            **({"divergence": self.divergence} if self.divergence else {}),
            **({"stopped_early": self.stopped_early} if self.stopped_early else {}),
        }

    @classmethod
    def from_dict(cls, raw: Any, where: str = "<record>") -> RunRecord:
        """Validate and build a record (older schemas are migrated)."""
        return _from_dict(raw, where)


# --- recipes --------------------------------------------------------------------------------
def recipe(config: RunConfig, source: str | None = None) -> dict[str, dict[str, Any]]:
    """The recipe of a run: data (minus its folder), model, optimiser and precision;
    ``source`` identifies the data's content (seed aside) when known."""
    raw = config.to_dict()
    data = {k: v for k, v in raw["data"].items() if ("data", k) not in NON_SEMANTIC}
    if source:
        data["source"] = source
    return {"data": data, "model": raw["model"], "optim": raw["optim"],
            "run": {"precision": raw["run"]["precision"]}}


def recipe_key(config: RunConfig, source: str | None = None) -> str:
    """See :attr:`RunRecord.recipe_key`."""
    return json.dumps(recipe(config, source), sort_keys=True)


def recipe_difference(a: RunRecord, b: RunRecord) -> str | None:
    """The first recipe field where ``a`` and ``b`` differ (``"model.n_blocks: 3 vs 2"``),
    or None when they share a recipe."""
    ra = recipe(a.config, a.data.source if a.data else None)
    rb = recipe(b.config, b.data.source if b.data else None)
    for section, values in ra.items():
        for key, value in values.items():
            other = rb[section].get(key)
            if value != other:
                name = "the data" if key == "source" else f"{section}.{key}"
                return f"{name}: {value!r} vs {other!r}" if key != "source" else name
    return None


# --- validation and migration ----------------------------------------------------------------
_REQUIRED: dict[str, Any] = {
    "schema": str, "run_id": str, "config": dict, "status": str, "log": list,
    "final": (dict, type(None)), "diagnostics": dict, "protocol": dict,
}


def _from_dict(raw: Any, where: str) -> RunRecord:
    if not isinstance(raw, dict):
        raise RunRecordError(f"run record {where} must be a JSON object")
    schema = raw.get("schema")
    if schema not in (SCHEMA, *LEGACY_SCHEMAS):
        raise RunRecordError(f"run record {where} has schema {schema!r}; this version of "
                             f"creditaudit reads {SCHEMA!r} (and migrates "
                             f"{', '.join(map(repr, LEGACY_SCHEMAS))})")
    for key, kind in _REQUIRED.items():
        if key not in raw:
            raise RunRecordError(f"run record {where} lacks the key {key!r}")
        if not isinstance(raw[key], kind):
            raise RunRecordError(f"run record {where}: {key!r} has the wrong type "
                                 f"({type(raw[key]).__name__})")
    if raw["status"] not in STATUSES:
        raise RunRecordError(f"run record {where}: status {raw['status']!r} is not one of "
                             f"{', '.join(STATUSES)}")
    try:
        config = config_from_dict(raw["config"])
    except CreditAuditError as err:
        raise RunRecordError(f"run record {where} holds an invalid config: {err}") from None
    log = [EpochEntry.from_dict(e, f"run record {where}: log entry {i}")
           for i, e in enumerate(raw["log"])]
    try:
        final = None if raw["final"] is None else FinalResults(**raw["final"])
        data = raw.get("data")
        data = None if data is None else DataIdentity(**data)
        protocol = ProtocolState(**raw["protocol"])
    except TypeError as err:
        raise RunRecordError(f"run record {where} has an unexpected field ({err})") from None
    return RunRecord(
        run_id=raw["run_id"], config=config, status=raw["status"], log=log, final=final,
        diagnostics=EndOfRun.from_dict(raw["diagnostics"]), protocol=protocol, data=data,
        environment=dict(raw.get("environment") or {}), created=raw.get("created"),
        updated=raw.get("updated"), error=raw.get("error"),
        divergence=raw.get("divergence"), stopped_early=raw.get("stopped_early"),
        schema=SCHEMA)


def comparable(record: RunRecord | dict[str, Any]) -> dict[str, Any]:
    """The record without wall-clock fields, as a dict: equal for equal computations (tests,
    resume). NaN values are replaced by the string "NaN" so equal records compare equal."""
    raw = record.to_dict() if isinstance(record, RunRecord) else dict(record)
    out = {k: v for k, v in raw.items()
           if k not in ("environment", "created", "updated", "timing")}
    out["config"] = {section: {k: v for k, v in values.items()
                               if (section, k) not in NON_SEMANTIC}
                     for section, values in raw["config"].items()}
    out["log"] = [{k: v for k, v in e.items() if k not in TIMING_KEYS} for e in raw["log"]]
    return _nan_safe(out)


def _nan_safe(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, dict):
        return {k: _nan_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_safe(v) for v in value]
    return value
