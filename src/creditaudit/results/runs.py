"""A results folder as runs: every record below it, loaded once, grouped by recipe.

Reports and figures read run records only, never a live model, so both can be regenerated
from the files under a results folder. :class:`RunIndex` loads every record below a folder
once (through the record layer; unreadable records are named in one warning each and
skipped); callers select runs by config predicates (method, penalty, architecture, terminal
LN, dataset, seed) and compare runs only within one *recipe*: runs that share data, model,
optimiser and precision and differ only in the credit rule, its penalty λ and the seed.
The index holds the typed records themselves (:class:`creditaudit.records.RunRecord`); the
few facts that are no record field — the terminal LN as built, the architecture label, the
recipe a figure groups by — are functions of a record here. A value a record lacks is None;
figures and tables that need NaN there (a gap, a —) convert with :func:`as_float`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np

from creditaudit.deep_layers import deep_mean
from creditaudit.protocol import DiagnosticReport, default_names, in_order
from creditaudit.protocol.records import RecordSet, arch_variant, model_description
from creditaudit.records import NOT_RECORDED, Copies, RunRecord
from creditaudit.results.labels import method_label, method_rank


def arch_label(record: RunRecord) -> str:
    """``resmlp``, ``vit``, ``convmixer`` (each + `` no out_ln`` without the terminal LN its
    architecture can have), ``student`` …: the architecture as built."""
    return arch_variant(record, ln_suffix=" no out_ln", residual_suffix=None)


def as_float(value: Any) -> float:
    """A float, NaN for None."""
    return math.nan if value is None or isinstance(value, str) else float(value)


def terminal_ln(record: RunRecord) -> bool:
    """Whether the model has a terminal LayerNorm (as built; unknown reads as True)."""
    model = model_description(record)
    return model is None or model.terminal_ln is not False


def seed_text(record: RunRecord) -> str:
    """The run's seed as text; "not recorded" for a run from a user's own loop that was
    not told its seed (its config holds only the default)."""
    return NOT_RECORDED if "run.seed" in record.not_recorded else str(record.seed)


def trained_blocks(record: RunRecord) -> int | None:
    """The blocks a depth-ladder step trains (``method.trainable_blocks``); None when the
    run trains every block."""
    return None if record.trains_every_block else record.config.method.trainable_blocks


def figure_recipe(record: RunRecord) -> str:
    """The record's recipe key plus the trainable blocks: the runs a figure compares (a
    depth-ladder step is its own figure group)."""
    return f"{record.recipe_key}|{trained_blocks(record)}"


def matches(value: Any, wanted: Any) -> bool:
    """Whether ``value`` is ``wanted``: equal to it, in it (a collection) or accepted by it
    (a callable)."""
    if callable(wanted):
        return bool(wanted(value))
    if isinstance(wanted, set | frozenset | tuple | list):
        return value in wanted
    return value == wanted


Predicate = Any  # a value, a collection of allowed values, or a callable

# What each keyword of :meth:`RunIndex.select` compares: one fact of a record.
SELECT_KEYS: dict[str, Callable[[RunRecord], Any]] = {
    "method": attrgetter("method"), "penalty": attrgetter("penalty"), "out_ln": terminal_ln,
    "arch": attrgetter("config.model.arch"), "arch_label": arch_label,
    "dataset": attrgetter("dataset"), "seed": attrgetter("seed"), "recipe": figure_recipe,
    "standard": attrgetter("is_standard"),
}


def _listing_order(record: RunRecord) -> tuple:
    return (record.dataset, arch_label(record), method_rank(record.method), record.penalty,
            record.seed, record.run_id)


class RunIndex:
    """Every usable run record below a results folder, loaded once.

    ``frozen_from_runs`` (default on): evaluate protocol diagnostic (d) of each run against
    the mean final accuracy of the frozen-blocks runs of its recipe (when there are any)
    instead of taking the record's own (d) — see :meth:`protocol_report`.
    """

    def __init__(self, records: Iterable[RunRecord], *, root: Path | None = None,
                 skipped: Sequence[tuple[Path, str]] = (), frozen_from_runs: bool = True,
                 copies: Sequence[Copies] = (), paths: Sequence[Path] | None = None) -> None:
        records = list(records)
        # Each record's folder (``paths``: its record.json, in the order of ``records``).
        self._folders = {id(record): path.parent
                         for record, path in zip(records, paths or (), strict=False)}
        self.all_runs: list[RunRecord] = sorted(records, key=_listing_order)
        self.root = root
        self.skipped = list(skipped)
        self.copies = list(copies)  # run ids found in several folders, each counted once
        self.frozen_from_runs = frozen_from_runs
        self.records = RecordSet(self.all_runs, use_frozen_runs=frozen_from_runs)

    @classmethod
    def from_dir(cls, root: str | Path, *, dataset: str | None = None,
                 frozen_from_runs: bool = True) -> RunIndex:
        """Load every record.json below ``root`` (``dataset``: only runs on it); unreadable
        records are skipped (one warning each) and listed in ``skipped``; a run found in
        several folders is counted once (``copies``: :meth:`RecordSet.from_folder`)."""
        records = RecordSet.from_folder(root, dataset=dataset)
        return cls(records.records, root=Path(root), skipped=records.skipped,
                   frozen_from_runs=frozen_from_runs, copies=records.copies,
                   paths=records.paths)

    @classmethod
    def from_records(cls, records: Iterable[RunRecord], **kwargs: Any) -> RunIndex:
        """An index over in-memory records (tests, notebooks)."""
        return cls(records, **kwargs)

    def __len__(self) -> int:
        return len(self.all_runs)

    def folder(self, record: RunRecord) -> Path | None:
        """The folder ``record`` was read from (None for an in-memory record)."""
        return self._folders.get(id(record))

    @property
    def runs(self) -> list[RunRecord]:
        """Records whose status is usable for figures (completed or diverged)."""
        return [r for r in self.all_runs if r.is_finished]

    def select(self, *, method: Predicate = None, penalty: Predicate = None,
               out_ln: Predicate = None, arch: Predicate = None, arch_label: Predicate = None,
               dataset: Predicate = None, seed: Predicate = None, recipe: Predicate = None,
               standard: bool | None = True, where: Callable[[RunRecord], bool] | None = None,
               runs: Iterable[RunRecord] | None = None) -> list[RunRecord]:
        """Usable runs matching every given predicate (a value, a collection of allowed
        values, or a callable on the value; :data:`SELECT_KEYS` says what each compares);
        ``standard=True`` leaves out control variants."""
        wanted = {"method": method, "penalty": penalty, "out_ln": out_ln, "arch": arch,
                  "arch_label": arch_label, "dataset": dataset, "seed": seed, "recipe": recipe,
                  "standard": standard}
        tests = [(SELECT_KEYS[k], w) for k, w in wanted.items() if w is not None]
        return [record for record in (self.runs if runs is None else runs)
                if all(matches(fact(record), w) for fact, w in tests)
                and (where is None or where(record))]

    def by_seed(self, **predicates: Any) -> dict[int, list[RunRecord]]:
        """The runs :meth:`select` returns for ``predicates``, grouped by seed."""
        groups: dict[int, list[RunRecord]] = {}
        for record in self.select(**predicates):
            groups.setdefault(record.seed, []).append(record)
        return dict(sorted(groups.items()))

    def recipes(self, runs: Iterable[RunRecord] | None = None) -> dict[str, list[RunRecord]]:
        """Runs grouped by :func:`figure_recipe` (insertion order follows the index's sort)."""
        groups: dict[str, list[RunRecord]] = {}
        for record in self.select() if runs is None else runs:
            groups.setdefault(figure_recipe(record), []).append(record)
        return groups

    # --- protocol ---------------------------------------------------------------------------
    def frozen_baseline(self, record: RunRecord) -> tuple[float, int] | None:
        """(mean final accuracy, number of runs) of the frozen-blocks runs of ``record``'s
        recipe, or None when there are none."""
        return self.records.frozen_baseline(record)

    def protocol_report(self, record: RunRecord) -> DiagnosticReport | None:
        """The run's protocol report (its record's last protocol block), or None; (d)
        against the frozen runs of its recipe when ``frozen_from_runs`` and there are any."""
        return self.records.protocol_report(record)

    def diagnostic_ids(self, runs: Iterable[RunRecord] | None = None) -> list[str]:
        """The protocol diagnostics ``runs`` (default: all) were judged by, in listing order
        (one not installed here last); the default protocol's when no run has any."""
        runs = self.all_runs if runs is None else runs
        return in_order(i for record in runs for i in record.recorded_statuses()) or \
            default_names()


def stopped_early_text(record: RunRecord) -> str | None:
    """``stopped early at epoch 3: protocol verdict needs walk-back: (a)`` for a run that
    ``--stop-on-walkback`` ended, or a Recorder finished before its ``optim.epochs`` (its
    status still says completed), else None: the words every output (report, export,
    figures, the console) uses for it."""
    stop = record.stopped_early
    if not stop:
        return None
    reason = stop.get("reason")
    return f"stopped early at epoch {stop.get('epoch')}" + (f": {reason}" if reason else "")


def full_length(runs: Iterable[RunRecord]) -> list[RunRecord]:
    """``runs`` but those that stopped early (``record.stopped_early``: ``--stop-on-walkback``,
    a Recorder finished before its ``optim.epochs``). Their end-of-run values — final
    accuracy, Γ, per-layer cosines, drift, last-epoch norms — are of an earlier epoch than
    their recipe's, so a mean across seeds holding one would be a mean over runs of
    different lengths: the report's summary and the figures leave them out of such means
    and say so. Per-epoch curves keep them for the epochs they logged, as they keep a
    diverged run's."""
    return [run for run in runs if not run.stopped_early]


LEFT_OUT = "Left out of the end-of-run means (they would mix runs of different lengths)"


def _run_name(record: RunRecord) -> str:
    return f"{method_label(record.method, record.penalty)} seed {record.seed}"


def stopped_early_note(runs: Iterable[RunRecord], *,
                       curves: bool | Iterable[RunRecord] = True,
                       lead: str = LEFT_OUT) -> str | None:
    """``Left out of the end-of-run means (…): DFA seed 42 stopped early at epoch 3: …``
    naming each run of ``runs`` that stopped early (once), in the report's words, after
    ``lead`` (what the output does with them), and — where the figure draws per-epoch
    curves of them — that those show the epochs they logged: ``curves`` True (every run
    named is drawn), False (none is) or the runs drawn as curves (only those of them that
    stopped early are said to be); None when none stopped early."""
    early = list({id(r): r for r in runs if r.stopped_early}.values())
    if not early:
        return None
    if isinstance(curves, bool):
        drawn = early if curves else []
    else:
        ids = {id(r) for r in curves}
        drawn = [r for r in early if id(r) in ids]
    shown = ("" if not drawn else " Per-epoch curves show the epochs each logged."
             if len(drawn) == len(early) else
             " Per-epoch curves show the epochs " + ", ".join(map(_run_name, drawn))
             + " logged.")
    return (f"{lead}: " + "; ".join(f"{_run_name(r)} {stopped_early_text(r)}" for r in early)
            + "." + shown)


NO_FINITE_EPOCH = "no epoch's evaluation was finite"


def diverged_in_text(record: RunRecord) -> str | None:
    """``diverged in epoch 3`` (``diverged`` where the record does not say when) for a
    diverged run, else None."""
    if record.status != "diverged":
        return None
    at = (record.divergence or {}).get("epoch")
    return "diverged" + (f" in epoch {at}" if at is not None else "")


def diverged_epoch_text(record: RunRecord, *, mark: str = "",
                        nothing: str = "so no end-of-run point") -> str | None:
    """``diverged in epoch 3: numbers of epoch 2, the last whose evaluation was finite`` for
    a diverged run (``mark`` before ``numbers``: the report's ‡), ``diverged in epoch 1: no
    epoch's evaluation was finite, so no end-of-run point`` (``nothing``: what that leaves)
    for one with no finite epoch, else None: the words the report and the figures use for
    which epoch a diverged run's end-of-run numbers are of."""
    text = diverged_in_text(record)
    if text is None or record.final is None:
        return text
    epoch = record.numbers_epoch
    if epoch is None:
        return f"{text}: {NO_FINITE_EPOCH}, {nothing}"
    finite = record.numbers_finite
    numbers = f"{mark} numbers of epoch {epoch}" if mark else f"numbers of epoch {epoch}"
    # Records written before final.from_epoch existed may hold the overflowed network's.
    return (f"{text}: {numbers}, the last whose evaluation was finite" if finite else
            f"{text}: {numbers}, whose evaluation was not finite (a network that overflowed)")


DIVERGED = "Diverged (their end-of-run points are of their last finite epoch)"


def diverged_note(runs: Iterable[RunRecord], *, lead: str = DIVERGED) -> str | None:
    """``Diverged (…): DFA seed 42 diverged in epoch 2: numbers of epoch 1, the last whose
    evaluation was finite.`` naming each diverged run of ``runs`` (once) — the runs an
    output keeps in its end-of-run means, whose numbers are of an earlier epoch than their
    recipe's — in the report's words (:func:`diverged_epoch_text`), after ``lead``; None
    when none diverged."""
    diverged = list({id(r): r for r in runs if r.status == "diverged"}.values())
    if not diverged:
        return None
    return (f"{lead}: " + "; ".join(f"{_run_name(r)} {diverged_epoch_text(r)}"
                                    for r in diverged) + ".")


def seed_std(values: np.ndarray, axis: int | None = None) -> Any:
    """The spread across seeds every mean ± std shows (report, figures, experiments): the
    sample standard deviation (ddof=1, what papers report across seeds) of ``values``, NaN
    left out, along ``axis`` (all values when None); 0 where one value is left (one seed
    measures no spread: the report and the experiments' summaries show no ± then, a figure
    no error bar), NaN where none is. A float for ``axis=None``, else an array."""
    values = np.asarray(values, dtype=float)
    count = np.sum(~np.isnan(values), axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a column with < 2 values
        std = np.nanstd(values, axis=axis, ddof=1)
    std = np.where(count > 1, std, np.where(count == 1, 0.0, math.nan))
    return float(std) if axis is None else std


def mean_std(values: Iterable[Any]) -> tuple[float, float]:
    """Mean and sample std (:func:`seed_std`) across seeds, NaN values left out; (NaN, NaN)
    if none."""
    arr = np.array([as_float(v) for v in values], dtype=float)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return math.nan, math.nan
    with np.errstate(invalid="ignore"):  # an overflowed (inf) run gives an undefined std
        return float(arr.mean()), seed_std(arr)


__all__ = ["RunIndex", "Predicate", "SELECT_KEYS", "arch_label", "as_float", "deep_mean",
           "diverged_epoch_text", "diverged_note", "figure_recipe", "full_length", "mean_std",
           "matches", "seed_std", "seed_text", "stopped_early_note", "stopped_early_text",
           "terminal_ln", "trained_blocks"]
