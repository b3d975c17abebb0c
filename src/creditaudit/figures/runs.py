"""Which runs a figure draws: the records below a results folder, grouped by recipe.

Figures read run records only, never a live model, so any figure can be regenerated from
the files under a results folder. :class:`RunIndex` loads every record below a folder once
(through the record layer; unreadable records are named in one warning each and skipped);
figures select runs by config predicates (method, penalty, architecture, terminal LN,
dataset, seed) and compare runs only within one *recipe*: runs that share data, model,
optimiser and precision and differ only in the credit rule, its penalty λ and the seed.
Values a record lacks read as NaN here (figures draw gaps), not None.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from creditaudit.config import RunConfig
from creditaudit.errors import CreditAuditError
from creditaudit.figures.common import method_rank
from creditaudit.protocol import DiagnosticReport
from creditaudit.protocol.records import RecordSet, arch_variant, model_description
from creditaudit.records import EndOfRun, RunRecord


class MissingRuns(CreditAuditError):
    """A figure cannot be drawn from the runs at hand; ``needs`` lists what is missing."""

    def __init__(self, figure: str, needs: Sequence[str]) -> None:
        self.figure = figure
        self.needs = list(needs)
        super().__init__(f"{figure} needs " + "; ".join(self.needs))


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


def _matches(value: Any, wanted: Any) -> bool:
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
            if all(w is None or _matches(getattr(run, k), w) for k, w in wanted.items()) and (
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


def sort_methods(methods: Iterable[str]) -> list[str]:
    return sorted(set(methods), key=method_rank)


def by_seed(runs: Iterable[Run]) -> dict[int, Run]:
    """One run per seed (the first in index order when a seed repeats)."""
    out: dict[int, Run] = {}
    for run in runs:
        out.setdefault(run.seed, run)
    return dict(sorted(out.items()))


def seed_runs(group: Sequence[Run], method: str, penalty: Predicate = 0.0) -> list[Run]:
    """One run per seed of ``method`` at ``penalty`` within a recipe group."""
    return list(by_seed(r for r in group if r.method == method
                        and _matches(r.penalty, penalty)).values())


def penalties(group: Sequence[Run], method: str) -> list[float]:
    return sorted({r.penalty for r in group if r.method == method})


def choose_group(index: RunIndex, figure: str, missing: Callable[[list[Run]], list[str]],
                 *, prefer: Callable[[list[Run]], Any] | None = None,
                 runs: Iterable[Run] | None = None) -> list[Run]:
    """The recipe group that has everything ``missing(group)`` asks for (it returns what a
    group lacks). Among complete groups the one ranked highest by ``prefer`` (default: most
    epochs, then most runs) wins. Raises MissingRuns with what the closest group lacks."""
    groups = list(index.recipes(runs).values())
    complete = [g for g in groups if not missing(g)]
    if complete:
        rank = prefer or (lambda g: (g[0].epochs, len(g)))
        return max(complete, key=rank)
    if not groups:
        raise MissingRuns(figure, ["runs (the results folder holds no completed or diverged "
                                   "run records)"])
    closest = min(groups, key=lambda g: len(missing(g)))
    lacking = missing(closest)
    where = describe_recipe(closest[0])
    raise MissingRuns(figure, [f"{item} (closest recipe: {where})" if i == 0 else item
                               for i, item in enumerate(lacking)])


def describe_recipe(run: Run) -> str:
    c = run.config
    model = model_description(run.record)
    label = model.label if model is not None else c.model.arch
    return f"{c.data.name}, {label}, {c.optim.epochs} epochs"


def need_methods(group: Sequence[Run], wants: Sequence[tuple[str, Predicate, str]]
                 ) -> list[str]:
    """For ``wants`` = [(method, penalty predicate, description)], those absent in group."""
    return [text for method, penalty, text in wants if not seed_runs(group, method, penalty)]


# --- statistics ---------------------------------------------------------------------------
def mean_std(values: Iterable[Any]) -> tuple[float, float]:
    """Mean and (population) std across seeds, NaN values left out; (NaN, NaN) if none."""
    arr = np.array([as_float(v) for v in values], dtype=float)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return math.nan, math.nan
    with np.errstate(invalid="ignore"):  # an overflowed (inf) run gives an undefined std
        return float(arr.mean()), float(arr.std())


def valid_layers(runs: Sequence[Run]) -> list[bool]:
    """Per state l: whether every run's end-of-run cosine was measured against a reference
    ‖g_l‖ at or above the floor (``cosine_table`` of the record; True where unknown)."""
    tables = [r.diagnostics.cosine_table or [] for r in runs]
    n = max((len(t) for t in tables), default=0)
    return [all(bool(t[l].get("valid_reference", True)) for t in tables if l < len(t))
            for l in range(n)]


def layer_mean_std(rows: Sequence[Sequence[Any] | None]) -> tuple[np.ndarray, np.ndarray]:
    """Per-layer mean and std across seeds of per-layer lists (shortest length kept)."""
    rows = [r for r in rows if r]
    if not rows:
        return np.array([]), np.array([])
    n = min(len(r) for r in rows)
    arr = np.array([[as_float(v) for v in r[:n]] for r in rows], dtype=float)
    with np.errstate(all="ignore"), _quiet_nan():
        return np.nanmean(arr, axis=0), np.nanstd(arr, axis=0)


class _quiet_nan:
    """Silence numpy's all-NaN-slice warnings (a layer without values stays NaN)."""

    def __enter__(self) -> None:
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc: Any) -> None:
        self._ctx.__exit__(*exc)


def epoch_mean_std(runs: Sequence[Run], key: str, index: int | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(epochs, mean, std) across runs of per-epoch ``key``, epoch by epoch over the runs
    that logged it (a diverged run stops contributing after its last epoch)."""
    values: dict[int, list[float]] = {}
    for run in runs:
        for epoch, value in zip(*run.series(key, index)):
            values.setdefault(epoch, []).append(value)
    epochs = sorted(values)
    stats = [mean_std(values[e]) for e in epochs]
    return (np.array(epochs, dtype=float), np.array([s[0] for s in stats]),
            np.array([s[1] for s in stats]))
