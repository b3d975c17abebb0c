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

Readers never index the JSON: they use the accessors of :class:`RunRecord` (``recipe_key``,
``is_finished``, …) and of its base :class:`~creditaudit.records.accessors.RecordAccessors`
(``final_acc``, ``deep_cos``, ``series``, …), so a change of layout is made in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from creditaudit.config import RunConfig
from creditaudit.descriptions import (
    DataIdentity,
    ModelDescription,
)
from creditaudit.descriptions.fields import doc
from creditaudit.records.accessors import RecordAccessors
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
class RunRecord(RecordAccessors):
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
        "whether the reference gradient was checked when the run started (a Recorder's "
        "run: and at each epoch), how, and what failed (records without it: not checked)",
        factory=ReferenceState)
    data: DataIdentity | None = doc("identity of the data the run trained on")
    model: ModelDescription | None = doc(
        "the model as built: architecture, label, terminal LayerNorm, width, depth, input "
        "shape, state layout, parameters (records before schema 3 lack it)")
    environment: dict[str, Any] = doc(
        "package versions, `source` (the git commit of the creditaudit source, `+dirty` when "
        "its tracked files under src/ differ; null for an installed wheel), `components` (the "
        "rule's, model's and dataset's name, id_version and origin: creditaudit or a plugin's "
        "dist==version; for a plugin or an outside model factory its `code_digest` and the "
        "conformance `checks` it passed before training (and `declared_failures`: those "
        "it declares it fails by design, with their reasons; for a model, "
        "`structure_digest`: the module tree its code built, which a finished run is not "
        "served, resumed or audited for another); for a `Recorder` run the "
        "`code_digest` of the user's network and `code_digest_of`: `source+structure` (its "
        "source files and module tree, each kept as `source_digest` and `structure_digest`; "
        "`source` in records of earlier versions) or `structure` (its module tree, for a "
        "network of installed classes only) — "
        "null with `code_digest_reason` when its class has no source file), device, threads, "
        "`execution` "
        "(`device_data`: true or false, whether the train and test sets were kept on the "
        "run's device with each epoch's draws made up front (`run.device_data`; on the CPU "
        "only when set to on); `cuda_graphs`: on, or off and why; `stacked_runs`: how many "
        "runs trained in its stack as it started; `stacked_runs_from`, once the stack shrank "
        "(a member diverged or stopped early): each change, `epoch` on in a stack of "
        "`stacked_runs` (1: alone)) — of the part that started the run: a resumed run lists "
        "its other parts' in `resumed`", factory=dict)
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
        "a `guest`'s code (a plugin, or a user's own class) rather than creditaudit's; "
        "`part`: which of the rule's own parts (auxiliary net, local classifiers) held "
        "NaN/Inf then, with the options that drive it (absent when none did). Absent "
        "otherwise")
    stopped_early: dict[str, Any] | None = doc("runs stopped by --stop-on-walkback, or a "
                                               "Recorder finished before its optim.epochs: "
                                               "epoch, reason")
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
        """(first epoch, code) of each part that ran other code than the part before it:
        one entry when the whole run ran one version. The code is creditaudit's, named by
        its source commit (``+dirty``: with changes) or ``creditaudit VERSION`` for an
        installed package, followed by ``with torch VERSION`` when the parts ran on more
        than one torch version (its kernels compute the numbers too)."""
        parts = self.parts()
        torch_versions = {str(environment.get("torch")) for _, environment in parts}
        out: list[tuple[int, str]] = []
        for epoch, environment in parts:
            code = environment.get("source") or (
                f"creditaudit {environment['creditaudit']}" if environment.get("creditaudit")
                else "unknown")
            if len(torch_versions) > 1:
                code = f"{code} with torch {environment.get('torch') or 'unknown'}"
            if not out or out[-1][1] != code:
                out.append((epoch, str(code)))
        return out

    @property
    def trains_every_block(self) -> bool:
        """``method.trainable_blocks`` unset, or equal to the model's number of blocks (a
        record written before a run id mapped that value to the default's: the same
        training, not a depth-ladder step)."""
        tb = self.config.method.trainable_blocks
        return tb is None or (self.model is not None and tb == self.model.n_blocks)

    @property
    def is_plain(self) -> bool:
        """No penalty, all blocks trainable, real labels: the canonical run of its method."""
        return (self.config.method.penalty == 0 and self.trains_every_block
                and not self.config.data.random_targets)

    @property
    def is_standard(self) -> bool:
        """Not a control variant (depth ladder, random labels, no residual stream). Whether
        the model has skips is asked of its description (records before schema 3: of the
        config; unknown, as for an adapted model, counts as standard)."""
        c = self.config
        residual = (self.model.residual if self.model is not None
                    else getattr(c.model, "residual", None))
        return (self.trains_every_block and not c.data.random_targets
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
        return self._code_digest("model")

    @property
    def rule_code_digest(self) -> str | None:
        """The digest of the credit rule's code where it is not creditaudit's (a plugin
        rule's): ``environment.components.method.code_digest``; None for built-ins and
        records without it. Runs of one rule name whose code differs are not seeds of one
        another."""
        return self._code_digest("method")

    def _code_digest(self, axis: str) -> str | None:
        """``environment.components.<axis>.code_digest`` when it is a digest (the
        environment block is free-form), else None."""
        components = self.environment.get("components")
        entry = components.get(axis) if isinstance(components, dict) else None
        digest = entry.get("code_digest") if isinstance(entry, dict) else None
        return digest if isinstance(digest, str) and digest else None

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
            "data": None if self.data is None else self.data.to_dict(),
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
