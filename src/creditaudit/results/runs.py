"""A results folder as runs: every record below it, loaded once, grouped by recipe.

Reports and figures read run records only, never a live model, so both can be regenerated
from the files under a results folder. :class:`RunIndex` loads every record below a folder
once (through the record layer; unreadable records are named in one warning each and
skipped); callers select runs by config predicates (method, penalty, architecture, terminal
LN, dataset, seed) and compare runs only within one *recipe*: runs that share data, model,
optimiser and precision and differ only in the credit rule, its penalty λ and the seed.
Values a record lacks read as NaN here (figures draw gaps, tables print —), not None.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from creditaudit.config import RunConfig
from creditaudit.protocol import DiagnosticReport, default_names, in_order
from creditaudit.protocol.records import RecordSet, arch_variant, model_description
from creditaudit.records import EndOfRun, RunRecord
from creditaudit.results.labels import method_rank


def arch_label(record: RunRecord) -> str:
    """``resmlp``, ``vit``, ``convmixer`` (each + `` no out_ln`` without the terminal LN its
    architecture can have), ``student`` …: the architecture as built."""
    return arch_variant(record, ln_suffix=" no out_ln", residual_suffix=None)


def as_float(value: Any) -> float:
    """A float, NaN for None."""
    return math.nan if value is None or isinstance(value, str) else float(value)


@dataclass(frozen=True)
class Run:
    """One run record as figures read it (missing values are NaN)."""

    path: Path
    record: RunRecord = field(repr=False, compare=False)

    @property
    def config(self) -> RunConfig:
        return self.record.config

    @property
    def run_id(self) -> str:
        return self.record.run_id

    @property
    def method(self) -> str:
        return self.record.method

    @property
    def penalty(self) -> float:
        return self.record.penalty

    @property
    def arch(self) -> str:
        return self.config.model.arch

    @property
    def out_ln(self) -> bool:
        """Whether the model has a terminal LayerNorm (as built; unknown reads as True)."""
        model = model_description(self.record)
        return model is None or model.terminal_ln is not False

    @property
    def arch_label(self) -> str:
        return arch_label(self.record)

    @property
    def dataset(self) -> str:
        return self.record.dataset

    @property
    def seed(self) -> int:
        return self.record.seed

    @property
    def status(self) -> str:
        return self.record.status

    @property
    def epochs(self) -> int:
        return self.record.epochs

    @property
    def recipe(self) -> str:
        """The record's recipe key plus the trainable blocks (a depth-ladder step is its
        own figure group)."""
        return f"{self.record.recipe_key}|{self.config.method.trainable_blocks}"

    @property
    def diagnostics(self) -> EndOfRun:
        return self.record.diagnostics

    @property
    def standard(self) -> bool:
        """Not a control variant (depth ladder, random labels, no residual stream)."""
        return self.record.is_standard

    @property
    def final_acc(self) -> float:
        return as_float(self.record.final_acc)

    @property
    def deep_cos(self) -> float:
        return as_float(self.record.deep_cos)

    @property
    def deep_cos_valid(self) -> bool:
        return self.record.deep_cos_valid is not False

    @property
    def headline_gamma(self) -> float:
        return as_float(self.record.headline_gamma)

    @property
    def deep_rho(self) -> float:
        return as_float(self.record.deep_rho)

    @property
    def n_classes(self) -> int:
        return self.record.n_classes

    def last(self, key: str) -> Any:
        """The last value of per-epoch ``key`` (None if no epoch has it)."""
        return self.record.last_value(key)

    def series(self, key: str, index: int | None = None) -> tuple[list[int], list[float]]:
        """(epochs, values) of per-epoch ``key`` (``value[index]`` for per-layer lists)."""
        return self.record.series(key, index)


def deep_mean(values: Sequence[Any] | None) -> float:
    """Mean over layers l ≥ 1 (NaN entries left out; NaN if none is left)."""
    if not values or len(values) < 2:
        return math.nan
    deep = [as_float(v) for v in values[1:]]
    deep = [v for v in deep if not math.isnan(v)]
    return float(np.mean(deep)) if deep else math.nan


def matches(value: Any, wanted: Any) -> bool:
    """Whether ``value`` is ``wanted``: equal to it, in it (a collection) or accepted by it
    (a callable)."""
    if callable(wanted):
        return bool(wanted(value))
    if isinstance(wanted, set | frozenset | tuple | list):
        return value in wanted
    return value == wanted


Predicate = Any  # a value, a collection of allowed values, or a callable


class RunIndex:
    """Every usable run record below a results folder, loaded once.

    ``frozen_from_runs`` (default on): evaluate protocol diagnostic (d) of each run against
    the mean final accuracy of the frozen-blocks runs of its recipe (when there are any)
    instead of taking the record's own (d) — see :meth:`protocol_report`.
    """

    def __init__(self, runs: Iterable[Run], *, root: Path | None = None,
                 skipped: Sequence[tuple[Path, str]] = (), frozen_from_runs: bool = True
                 ) -> None:
        self.all_runs = sorted(runs, key=lambda r: (r.dataset, r.arch_label, method_rank(
            r.method), r.penalty, r.seed, r.run_id))
        self.root = root
        self.skipped = list(skipped)
        self.frozen_from_runs = frozen_from_runs
        self.records = RecordSet([r.record for r in self.all_runs],
                                 use_frozen_runs=frozen_from_runs)

    @classmethod
    def from_dir(cls, root: str | Path, *, dataset: str | None = None,
                 frozen_from_runs: bool = True) -> RunIndex:
        """Load every record.json below ``root`` (``dataset``: only runs on it); unreadable
        records are skipped (one warning each) and listed in ``skipped``."""
        records = RecordSet.from_folder(root, dataset=dataset)
        runs = [Run(path, record) for path, record in zip(records.paths, records.records)]
        return cls(runs, root=Path(root), skipped=records.skipped,
                   frozen_from_runs=frozen_from_runs)

    @classmethod
    def from_records(cls, records: Iterable[RunRecord], **kwargs: Any) -> RunIndex:
        """An index over in-memory records (tests, notebooks)."""
        return cls([Run(Path(r.run_id), r) for r in records], **kwargs)

    def __len__(self) -> int:
        return len(self.all_runs)

    @property
    def runs(self) -> list[Run]:
        """Runs whose status is usable for figures (completed or diverged)."""
        return [r for r in self.all_runs if r.record.is_finished]

    def select(self, *, method: Predicate = None, penalty: Predicate = None,
               out_ln: Predicate = None, arch: Predicate = None, arch_label: Predicate = None,
               dataset: Predicate = None, seed: Predicate = None, recipe: Predicate = None,
               standard: bool | None = True, where: Callable[[Run], bool] | None = None,
               runs: Iterable[Run] | None = None) -> list[Run]:
        """Usable runs matching every given predicate (a value, a collection of allowed
        values, or a callable on the value); ``standard=True`` leaves out control variants."""
        wanted = {"method": method, "penalty": penalty, "out_ln": out_ln, "arch": arch,
                  "arch_label": arch_label, "dataset": dataset, "seed": seed, "recipe": recipe,
                  "standard": standard}
        out = []
        for run in self.runs if runs is None else runs:
            if all(w is None or matches(getattr(run, k), w) for k, w in wanted.items()) and (
                    where is None or where(run)):
                out.append(run)
        return out

    def by_seed(self, **predicates: Any) -> dict[int, list[Run]]:
        """The runs :meth:`select` returns for ``predicates``, grouped by seed."""
        groups: dict[int, list[Run]] = {}
        for run in self.select(**predicates):
            groups.setdefault(run.seed, []).append(run)
        return dict(sorted(groups.items()))

    def recipes(self, runs: Iterable[Run] | None = None) -> dict[str, list[Run]]:
        """Runs grouped by recipe (insertion order follows the index's sort)."""
        groups: dict[str, list[Run]] = {}
        for run in self.select() if runs is None else runs:
            groups.setdefault(run.recipe, []).append(run)
        return groups

    # --- protocol ---------------------------------------------------------------------------
    def frozen_baseline(self, run: Run) -> tuple[float, int] | None:
        """(mean final accuracy, number of runs) of the frozen-blocks runs of ``run``'s
        recipe, or None when there are none."""
        return self.records.frozen_baseline(run.record)

    def protocol_report(self, run: Run) -> DiagnosticReport | None:
        """The run's protocol report (its record's last protocol block), or None; (d)
        against the frozen runs of its recipe when ``frozen_from_runs`` and there are any."""
        return self.records.protocol_report(run.record)

    def diagnostic_ids(self, runs: Iterable[Run] | None = None) -> list[str]:
        """The protocol diagnostics ``runs`` (default: all) were judged by, in listing order
        (one not installed here last); the default protocol's when no run has any."""
        runs = self.all_runs if runs is None else runs
        return in_order(i for run in runs for i in run.record.recorded_statuses()) or \
            default_names()


def mean_std(values: Iterable[Any]) -> tuple[float, float]:
    """Mean and (population) std across seeds, NaN values left out; (NaN, NaN) if none."""
    arr = np.array([as_float(v) for v in values], dtype=float)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return math.nan, math.nan
    with np.errstate(invalid="ignore"):  # an overflowed (inf) run gives an undefined std
        return float(arr.mean()), float(arr.std())


__all__ = ["Run", "RunIndex", "Predicate", "arch_label", "as_float", "deep_mean", "mean_std",
           "matches"]
