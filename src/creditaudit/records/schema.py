"""Typed run records: what a run writes to ``record.json`` and every reader reads back.

A record is a :class:`RunRecord` holding the validated :class:`~creditaudit.config.RunConfig`,
one :class:`~creditaudit.records.parts.EpochEntry` per evaluated epoch (holding the
epoch's :class:`~creditaudit.descriptions.EpochMeasures`), the final results,
the end-of-run credit-quality block and the protocol state of the four-diagnostic protocol
(:mod:`creditaudit.records.run_parts`), and the :class:`DataIdentity` of the data it
trained on. JSON keys are the field names (the per-epoch keys of the original study, such as
``hidden_norms`` and ``bp_grad_norms_per_sample_med``, are kept). Field documentation lives
in each field's metadata; ``docs/records.md`` is generated from it
(``scripts/gen_records_doc.py``). How a record's JSON is checked and older schemas migrated:
:mod:`creditaudit.records.reading`; a run's recipe: :mod:`creditaudit.records.recipes`; how
two records compare: :mod:`creditaudit.records.compare`.

Readers never index the JSON: they use the accessors here (``final_acc``, ``deep_cos``,
``series``, ``recipe_key``, …), so a change of layout is made in one place.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from creditaudit.config import RunConfig
from creditaudit.deep_layers import deep_mean
from creditaudit.descriptions import (
    BELOW_FLOOR,
    DataIdentity,
    EpochMeasures,
    ModelDescription,
    deep_invalid,
)
from creditaudit.descriptions.fields import as_number, doc, finite_number
from creditaudit.records.copies import stored_final, stored_protocol
from creditaudit.records.parts import EpochEntry
from creditaudit.records.reading import FINISHED, SCHEMA, record_parts
from creditaudit.records.recipes import recipe_key
from creditaudit.records.run_parts import (
    EndOfRun,
    FinalResults,
    ProtocolState,
    ReferenceState,
    ResumedPart,
)
from creditaudit.registry import DATASETS


# --- the run -------------------------------------------------------------------------------
@dataclass
class RunRecord:
    """One run: config, status, per-epoch log and results (``record.json``)."""

    run_id: str = doc("OUT/RUN_ID folder name: method-arch-dataset-seed-hash of everything "
                      "that changes what the run computes, data fingerprint included", "")
    config: RunConfig = doc("the resolved run config", factory=RunConfig)
    status: str = doc("running, completed, diverged, interrupted or failed", "running")
    log: list[EpochEntry] = doc("one entry per evaluated epoch", factory=list)
    final: FinalResults | None = doc("headline numbers of the last epoch (finished runs): "
                                     "the epoch entry they are read from")
    diagnostics: EndOfRun = doc("end-of-run credit-quality metrics", factory=EndOfRun)
    protocol: ProtocolState = doc("protocol evaluated during training", factory=ProtocolState)
    reference: ReferenceState = doc(
        "whether the reference gradient was checked when the run started, how, and what "
        "failed (records without it: not checked)", factory=ReferenceState)
    data: DataIdentity | None = doc("identity of the data the run trained on")
    model: ModelDescription | None = doc(
        "the model as built: architecture, label, terminal LayerNorm, width, depth, input "
        "shape, state layout, parameters (records before schema 3 lack it)")
    environment: dict[str, Any] = doc(
        "package versions, `source` (the git commit of the creditaudit source, `+dirty` when "
        "its tracked files under src/ differ; null for an installed wheel), `components` (the "
        "rule's, model's and dataset's name, id_version and origin: creditaudit or a plugin's "
        "dist==version; for a plugin or an outside model factory its `code_digest` and the "
        "conformance `checks` it passed before training; for a `Recorder` run the "
        "`code_digest` of the user's network and `code_digest_of`: `source` (its source "
        "files) or `structure` (its module tree, for a network of installed classes only) — "
        "null with `code_digest_reason` when its class has no source file), device, threads, "
        "`execution` "
        "(`device_data`, `cuda_graphs`: on, or off and why; `stacked_runs`: how many runs "
        "trained in its stack) — of the part that started the run: a resumed run lists its "
        "other parts' in `resumed`", factory=dict)
    resumed: list[ResumedPart] = doc(
        "one entry per time the run was resumed, in order: the epoch that part went on from, "
        "its own environment and its `place` options that differ from `config`. Written only "
        "for a resumed run", factory=list)
    created: str | None = doc("time the run started (ISO 8601)")
    updated: str | None = doc("time the record was last written")
    error: str | None = doc("failed runs: the error")
    divergence: dict[str, Any] | None = doc("diverged runs: epoch, step and reason")
    credit_not_finite: dict[str, Any] | None = doc(
        "runs whose rule returned NaN/Inf credits on the evaluation set (so no cosine of them "
        "is valid; the run's training and accuracy are its own): the first `epoch` it did "
        "(the last one when only the end-of-run block met them), the `states` where, the "
        "`rule` as creditaudit names it (a plugin: with its distribution) and whether it is "
        "a `guest`'s code (a plugin, or a user's own class) rather than creditaudit's. "
        "Absent otherwise")
    stopped_early: dict[str, Any] | None = doc("runs stopped by --stop-on-walkback: epoch, "
                                               "reason")
    not_recorded: list[str] = doc(
        "config keys (`optim.schedule`, `run.seed`, …) a run recorded from a user's own loop "
        "(creditaudit.Recorder) was not told: `config` holds their defaults, which say nothing "
        "about the run; readers show them as not recorded. Written only when not empty",
        factory=list)
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
        """The number of classes, as the dataset declared it (records before schema 3: asked
        of the dataset's class, 10 when it is not installed)."""
        if self.data is not None and self.data.n_classes:
            return self.data.n_classes
        spec = DATASETS.find(self.dataset)
        return spec(self.config.data).n_classes() if spec is not None else 10

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

    # --- parts (a resumed run has several) --------------------------------------------------
    def parts(self) -> list[tuple[int, dict[str, Any]]]:
        """(first epoch trained, environment) of each part of the run, in order: the part
        that started it, then each resumed part."""
        return [(1, self.environment), *((p.epoch, p.environment) for p in self.resumed)]

    @property
    def torch_threads(self) -> int | None:
        """The torch thread count the run's latest part ran on (None: not recorded)."""
        threads = self.parts()[-1][1].get("torch_threads")
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            return None
        return threads

    def code_versions(self) -> list[tuple[int, str]]:
        """(first epoch, creditaudit code) of each part that ran other code than the part
        before it: one entry when the whole run ran one version. The code is named by its
        source commit (``+dirty``: with changes), or ``creditaudit VERSION`` for an
        installed package."""
        out: list[tuple[int, str]] = []
        for epoch, environment in self.parts():
            code = environment.get("source") or (
                f"creditaudit {environment['creditaudit']}" if environment.get("creditaudit")
                else "unknown")
            if not out or out[-1][1] != code:
                out.append((epoch, str(code)))
        return out

    @property
    def is_plain(self) -> bool:
        """No penalty, all blocks trainable, real labels: the canonical run of its method."""
        method = self.config.method
        return (method.penalty == 0 and method.trainable_blocks is None
                and not self.config.data.random_targets)

    @property
    def is_standard(self) -> bool:
        """Not a control variant (depth ladder, random labels, no residual stream). Whether
        the model has skips is asked of its description (records before schema 3: of the
        config; unknown, as for an adapted model, counts as standard)."""
        c = self.config
        residual = (self.model.residual if self.model is not None
                    else getattr(c.model, "residual", None))
        return (c.method.trainable_blocks is None and not c.data.random_targets
                and residual is not False)

    @property
    def recipe_key(self) -> str:
        """Equal for runs that share how the network was trained apart from the credit rule
        and the seed: the data (its identity, not its folder), the model (with the digest of
        its code, when the record has one, and how it was held: a dtype other than float32,
        parameters frozen outside the rule), the optimiser and the precision. A
        frozen-blocks run of the same recipe is the baseline of (d)."""
        return recipe_key(self.config, self.data.source if self.data else None,
                          self.not_recorded, self.model_code_digest, self.model)

    @property
    def model_code_digest(self) -> str | None:
        """The digest of the network's code where it is not creditaudit's (a ``module``
        factory's, a plugin architecture's, a ``Recorder`` run's network):
        ``environment.components.model.code_digest``; None for built-ins and records
        without it."""
        components = self.environment.get("components")
        model = components.get("model") if isinstance(components, dict) else None
        digest = model.get("code_digest") if isinstance(model, dict) else None
        return digest if isinstance(digest, str) and digest else None

    # --- epochs -----------------------------------------------------------------------------
    def last_measures(self) -> EpochMeasures | None:
        """The diagnostics of the last epoch that measured them."""
        return next((e.measures for e in reversed(self.log) if e.has_diagnostics), None)

    @property
    def numbers_epoch(self) -> int | None:
        """The epoch whose entry holds the headline numbers: the final results' (a diverged
        run's are those of its last epoch whose evaluation was finite), else the last
        logged one; None where there are none (no epoch logged; a diverged run with no
        finite evaluation)."""
        final = self.final
        if final is None:
            return self.log[-1].epoch if self.log else None
        if self.status == "diverged" and final.test_acc is None:
            return None
        return final.epochs_completed if final.from_epoch is None else final.from_epoch

    def headline_entries(self) -> list[EpochEntry]:
        """The log up to :attr:`numbers_epoch`: where the headline numbers, and what is
        shown beside them, are read (a diverged run's overflowed epoch is not)."""
        epoch = self.numbers_epoch
        return [] if epoch is None else [e for e in self.log if e.epoch <= epoch]

    def headline_measures(self) -> EpochMeasures | None:
        """The diagnostics of the last epoch that measured them, up to :attr:`numbers_epoch`."""
        return next((e.measures for e in reversed(self.headline_entries())
                     if e.has_diagnostics), None)

    def headline_value(self, key: str) -> Any:
        """The last non-None value of per-epoch ``key`` up to :attr:`numbers_epoch`."""
        return next((v for e in reversed(self.headline_entries())
                     if (v := e.value(key)) is not None), None)

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
            number = as_number(value)
            epochs.append(entry.epoch)
            values.append(math.nan if number is None else number)
        return epochs, values

    def entry(self, epoch: int) -> EpochEntry | None:
        return next((e for e in reversed(self.log) if e.epoch == epoch), None)

    # --- headline numbers -------------------------------------------------------------------
    @property
    def final_acc(self) -> float | None:
        """Headline test accuracy: the final results' (None for a diverged run with no
        finite epoch: the overflowed network's share of one class is no accuracy), else the
        last logged epoch's (unfinished runs)."""
        if self.final is not None:
            return finite_number(self.final.test_acc)
        return finite_number(self.last_value("acc_eval"))

    @property
    def deep_cos(self) -> float | None:
        """Deep cosine (mean over l ≥ 1): end of run, else that of :attr:`numbers_epoch`."""
        for value in (self.diagnostics.deep_cos,
                      self.final.deep_cos if self.final else None):
            if finite_number(value) is not None:
                return float(value)  # type: ignore[arg-type]
        last = self.headline_measures()
        return None if last is None else last.deep_cos

    @property
    def deep_cos_valid(self) -> bool | None:
        """Whether the deep cosine is a valid measurement: finite credits and reference
        gradients, the references at or above the floor (None: not recorded)."""
        reasons = self.deep_cos_invalid
        return None if reasons is None else not reasons

    @property
    def deep_cos_invalid(self) -> tuple[str, ...] | None:
        """Why the deep cosine is not valid (the ``cos_invalid`` reasons at the deep states,
        most fundamental first; () when it is; None: not recorded): end of run, else at
        :attr:`numbers_epoch`. End-of-run rows from before ``cos_invalid`` say only whether
        the reference was at the floor."""
        table = self.diagnostics.cosine_table
        if table:
            return deep_invalid([row.get("cos_invalid") if "cos_invalid" in row
                                 else None if row.get("valid_reference") else BELOW_FLOOR
                                 for row in table])
        last = self.headline_measures()
        return None if last is None else last.deep_cos_invalid

    @property
    def deep_cos_coverage(self) -> float | None:
        """The smallest fraction of samples a deep state's cosine averages over (below 1:
        some credits or gradients are exactly zero); end of run, else at the numbers' epoch; None
        for records that predate the field."""
        table = self.diagnostics.cosine_table
        if table:
            shares = [row.get("defined") for row in table]
        else:
            last = self.headline_measures()
            shares = (last.cos_defined or []) if last else []
        kept = [v for v in (finite_number(x) for x in shares[1:]) if v is not None]
        return min(kept) if kept else None

    @property
    def headline_gamma(self) -> float | None:
        """Headline Γ (samples then layers): end of run, else the cosines of :attr:`numbers_epoch`
        averaged over layers (the same aggregation)."""
        gamma = self.diagnostics.gamma or {}
        value = finite_number(gamma.get("samples_then_layers"))
        if value is not None:
            return value
        last = self.headline_measures()
        kept = [v for v in (finite_number(x) for x in last.cos_per_layer)
                if v is not None] if last else []
        return sum(kept) / len(kept) if kept else None

    @property
    def deep_rho(self) -> float | None:
        return finite_number(deep_mean(self.diagnostics.perturbation_rho))

    def nudging_at(self, eta: str | None = None) -> list[float] | None:
        """Nudging Δ per deep state at step ``eta`` (default: the smallest recorded)."""
        nudging = self.diagnostics.nudging or {}
        if not nudging:
            return None
        key = eta if eta is not None else min(nudging, key=float)
        return nudging.get(key)

    # --- protocol ---------------------------------------------------------------------------
    def recorded_statuses(self) -> dict[str, str]:
        """Diagnostic id → status at the run's last training-time protocol evaluation."""
        diagnostics = (self.protocol.report or {}).get("diagnostics") or {}
        if diagnostics:
            return {i: d["status"] for i, d in diagnostics.items()
                    if isinstance(d, dict) and "status" in d}
        for entry in reversed(self.log):
            if entry.protocol:
                return dict(entry.protocol)
        return {}

    def recorded_value(self, diagnostic: str) -> float | None:
        """The statistic of ``diagnostic`` at the run's last protocol evaluation."""
        diagnostics = (self.protocol.report or {}).get("diagnostics") or {}
        return as_number((diagnostics.get(diagnostic) or {}).get("value"))

    def first_fired(self) -> dict[str, int | None]:
        """First epoch each recorded diagnostic fired during training (None = never)."""
        out: dict[str, int | None] = {}
        for entry in self.log:
            for i, status in (entry.protocol or {}).items():
                out.setdefault(i, None)
                if out[i] is None and status == "fired":
                    out[i] = entry.epoch
        for i, epoch in self.protocol.first_fired.items():
            if out.get(i) is None:
                out[i] = None if epoch is None else int(epoch)
        return out

    # --- serialisation ----------------------------------------------------------------------
    def log_dicts(self, *, copies: bool = True) -> list[dict[str, Any]]:
        """The per-epoch entries with the original study's key names (token models also
        list ``hidden_norms_cls``), as exported; without ``copies`` as record.json stores
        them (:meth:`EpochEntry.to_dict`)."""
        tokens = self.model is not None and self.model.layout == "tokens"
        return [e.to_dict(token_states=tokens, copies=copies) for e in self.log]

    def to_dict(self, *, stored: bool = False) -> dict[str, Any]:
        """The record as a dict, every value in place; ``stored``: as record.json stores it,
        each number once (``final`` and the protocol report name the epoch entry holding
        their copies: :mod:`creditaudit.records.copies`). Both read back to this record."""
        final = (None if self.final is None else stored_final(self.final, self.log) if stored
                 else self.final.to_dict())
        return {
            "schema": self.schema, "run_id": self.run_id, "config": self.config.to_dict(),
            "data": None if self.data is None else dataclasses.asdict(self.data),
            "model": None if self.model is None else self.model.to_dict(),
            "environment": self.environment,
            **({"resumed": [part.to_dict() for part in self.resumed]} if self.resumed else {}),
            "status": self.status,
            "created": self.created, "updated": self.updated,
            "log": self.log_dicts(copies=not stored), "final": final,
            "diagnostics": self.diagnostics.to_dict(),
            "protocol": (stored_protocol(self.protocol, self.log) if stored
                         else self.protocol.to_dict()),
            "reference": self.reference.to_dict(),
            "error": self.error,
            **({"divergence": self.divergence} if self.divergence else {}),
            **({"credit_not_finite": self.credit_not_finite} if self.credit_not_finite
               else {}),
            **({"stopped_early": self.stopped_early} if self.stopped_early else {}),
            **({"not_recorded": list(self.not_recorded)} if self.not_recorded else {}),
        }

    @classmethod
    def from_dict(cls, raw: Any, where: str = "<record>") -> RunRecord:
        """Validate and build a record (older schemas are migrated:
        :mod:`creditaudit.records.reading`)."""
        return cls(**record_parts(raw, where))
