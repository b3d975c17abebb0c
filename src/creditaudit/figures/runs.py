"""Which runs a figure draws: recipe groups that hold what the figure needs, and the
statistics figures plot.

The runs come from :class:`creditaudit.results.RunIndex` (every record below a results
folder, grouped by recipe); a figure picks the recipe group that has every run it needs
(:func:`choose_group`) or raises :class:`MissingRuns` saying what the closest group lacks.
Values a record lacks are None; the statistics read them as NaN (figures draw gaps).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from creditaudit.config import RunConfig
from creditaudit.errors import CreditAuditError
from creditaudit.formatting import counted
from creditaudit.methods import find_rule
from creditaudit.protocol.records import model_description
from creditaudit.records import RunRecord
from creditaudit.records.compare import recipe_difference
from creditaudit.results import (
    Predicate,
    RunIndex,
    as_float,
    figure_recipe,
    mean_std,
    method_label,
    seed_std,
)
from creditaudit.results.runs import matches, trained_blocks


class MissingRuns(CreditAuditError):
    """A figure cannot be drawn from the runs at hand; ``needs`` lists what is missing."""

    def __init__(self, figure: str, needs: Sequence[str]) -> None:
        self.figure = figure
        self.needs = list(needs)
        super().__init__(f"{figure} needs " + "; ".join(self.needs))


def by_seed(runs: Iterable[RunRecord]) -> list[RunRecord]:
    """One run per seed (the first in index order when a seed repeats), in seed order; a
    run whose seed is not recorded (a ``Recorder`` not told it: its config holds only the
    default) is one of its own, after them: it is no repeat of another such run."""
    out: dict[tuple[int, Any], RunRecord] = {}
    for run in runs:
        unknown = "run.seed" in run.not_recorded
        out.setdefault((1, run.run_id) if unknown else (0, run.seed), run)
    return [out[key] for key in sorted(out)]


# What a key of rule_options and other_options_note call a plugin rule's code (its digest).
RULE_CODE = "rule code"


def _options(config: RunConfig) -> dict[str, Any]:
    """The credit-rule options of ``config``: its ``method`` section but λ."""
    return {k: v for k, v in config.to_dict()["method"].items() if k != "penalty"}


def _default_options(method: str) -> dict[str, Any] | None:
    """The credit-rule options rule ``method`` has by default; None for a rule not
    installed here (a record of a plugin since uninstalled): its defaults are unknown."""
    if find_rule(method) is None:
        return None
    return _options(RunConfig().replace(**{"method.name": method}))


def rule_options(run: RunRecord) -> str:
    """The run's credit-rule options (its config's ``method`` section but λ) and, for a
    plugin rule, the digest of its code, as a key: runs of one rule whose options differ
    (``method.feedback_scale``, ``method.ep_beta``, …) or whose code changed between them
    are not seeds of one another, whatever their recipe."""
    return json.dumps({**_options(run.config), RULE_CODE: run.rule_code_digest},
                      sort_keys=True, default=str)


def seed_runs(group: Sequence[RunRecord], method: str, penalty: Predicate = 0.0
              ) -> list[RunRecord]:
    """One run per seed of ``method`` at ``penalty`` within a recipe group, all with the
    same rule options and code (:func:`rule_options`): where the group's runs of the rule
    differ in them, those of the options most seeds ran (on a tie the rule's defaults, else
    the first in index order: a rule not installed here has no known defaults), so a mean
    across seeds never mixes settings."""
    options: dict[str, list[RunRecord]] = {}
    for run in group:
        if run.method == method and matches(run.penalty, penalty):
            options.setdefault(rule_options(run), []).append(run)
    default = _default_options(method)
    # Ties go to the rule's default options (max keeps the first of equals: index order).
    most = max(options.values(), key=lambda runs: (len(by_seed(runs)),
                                                   _options(runs[0].config) == default),
               default=[])
    return by_seed(most)


def other_options_note(index: RunIndex, drawn: Iterable[RunRecord],
                       among: Sequence[RunRecord] | None = None) -> str | None:
    """``Not drawn (…): DFA seed 42 (method.feedback_scale 1 where the drawn runs have
    100)``, naming each run of a drawn run's recipe, rule and λ that :func:`seed_runs` left
    out for its other rule options, and the recipes of ``among`` — the runs the figure
    chose its recipes from (default: those that are no control variant) — a drawn one's
    title reads alike (:func:`_alike_recipes`); None when there is none."""
    drawn = list(drawn)
    ids = {id(run) for run in drawn}
    kinds = {(figure_recipe(run), run.method, run.penalty): run for run in drawn}
    left: list[str] = []
    for run in index.select(standard=None):
        like = kinds.get((figure_recipe(run), run.method, run.penalty))
        if like is None or id(run) in ids or rule_options(run) == rule_options(like):
            continue
        own, theirs = run.config.to_dict()["method"], like.config.to_dict()["method"]
        parts = [f"method.{key} {own.get(key)} where the drawn runs have {theirs.get(key)}"
                 for key in sorted({*own, *theirs}) if own.get(key) != theirs.get(key)]
        if run.rule_code_digest != like.rule_code_digest:
            parts.append(f"{RULE_CODE} {_digest(run.rule_code_digest)} where the drawn runs' "
                         f"is {_digest(like.rule_code_digest)}")
        differ = ", ".join(parts)
        left.append(f"{method_label(run.method, run.penalty)} seed {run.seed} ({differ})")
    notes = [f"Not drawn (a mean across seeds holds runs of one set of rule options): "
             f"{'; '.join(left)}."] if left else []
    notes += _alike_recipes(index, drawn, among)
    return " ".join(notes) or None


def _alike_recipes(index: RunIndex, drawn: list[RunRecord],
                   among: Sequence[RunRecord] | None) -> list[str]:
    """For each recipe drawn, the other recipes of ``among`` (default: the index's runs
    that are no control variant) its title would describe alike (:func:`describe_recipe`
    leaves a learning rate, the data's content, the trained blocks … out), with the setting
    they differ in: which of them the figure drew is otherwise not said."""
    groups = list(index.recipes(among).values())
    drawn_keys = {figure_recipe(run) for run in drawn}
    notes = []
    for first in {figure_recipe(run): run for run in drawn}.values():
        label = describe_recipe(first)
        others = [setting_difference(first, group[0]) for group in groups
                  if figure_recipe(group[0]) not in drawn_keys
                  and describe_recipe(group[0]) == label]
        if others:
            who = "the other differs" if len(others) == 1 else "the others differ"
            counts = Counter(others)  # a sweep's recipes may differ alike: each said once
            settings = "; ".join(setting if n == 1 else f"{setting} ({n} recipes)"
                                 for setting, n in counts.items())
            notes.append(f"Drawn: one of {len(others) + 1} recipes here that read "
                         f"'{label}'; {who} from it in {settings} (drawn vs not drawn).")
    return notes


def setting_difference(drawn: RunRecord, other: RunRecord) -> str:
    """The setting a run of another figure recipe differs from ``drawn`` in
    (``optim.lr: 0.01 vs 0.001``, ``drawn``'s value first): the first recipe field
    (:func:`recipe_difference`), else the blocks a depth-ladder step trains."""
    blocks = [trained_blocks(run) for run in (drawn, other)]
    if (found := recipe_difference(drawn, other)) is None and blocks[0] != blocks[1]:
        found = "method.trainable_blocks: " + " vs ".join(
            "every block" if n is None else str(n) for n in blocks)
    return found or "another setting"


def _digest(digest: str | None) -> str:
    """A code digest as the report's columns show it (its first 12 digits), ``—`` for
    none."""
    return "—" if digest is None else digest[:12]


def penalties(group: Sequence[RunRecord], method: str) -> list[float]:
    return sorted({r.penalty for r in group if r.method == method})


def choose_group(index: RunIndex, figure: str,
                 missing: Callable[[list[RunRecord]], list[str]],
                 *, prefer: Callable[[list[RunRecord]], Any] | None = None,
                 runs: Iterable[RunRecord] | None = None) -> list[RunRecord]:
    """The recipe group that has everything ``missing(group)`` asks for (it returns what a
    group lacks). Among complete groups the one ranked highest by ``prefer`` (default: most
    epochs, then most runs) wins. Raises MissingRuns with what the closest group lacks."""
    groups = list(index.recipes(runs).values())
    complete = [g for g in groups if not missing(g)]
    if complete:
        rank = prefer or (lambda g: (g[0].epochs, len(g)))
        return max(complete, key=rank)
    if not groups:
        # What an empty group lacks is everything the figure needs; then why none is here.
        needs = missing([]) or ["runs"]
        why = _why_no_runs(index, given=runs is not None)
        raise MissingRuns(figure, [*needs[:-1], f"{needs[-1]} — {why}"])
    closest = min(groups, key=lambda g: len(missing(g)))
    lacking = missing(closest)
    where = describe_recipe(closest[0])
    raise MissingRuns(figure, [f"{item} (closest recipe: {where})" if i == 0 else item
                               for i, item in enumerate(lacking)])


def _why_no_runs(index: RunIndex, *, given: bool) -> str:
    """Why a figure had no recipe group to choose from: the folder holds no finished run,
    or every finished run is one the figure does not compare."""
    finished = len(index.runs)
    if not finished:
        return "the results folder holds no completed or diverged run records"
    if given:
        return f"none of the {finished} completed or diverged runs here is of that kind"
    return (f"the {finished} completed or diverged runs here are all control variants "
            "(depth ladder, random labels or no residual stream), which it does not compare"
            if finished > 1 else "the one completed or diverged run here is a control variant "
            "(depth ladder, random labels or no residual stream), which it does not compare")


def describe_recipe(record: RunRecord) -> str:
    """``synthetic, ResMLP d=16 L=2, 2 epochs`` — with ``bf16`` or ``float64`` where the
    run trained in another precision or holds its parameters in another dtype than float32
    (part of the recipe: such runs are never drawn with float32 ones)."""
    c = record.config
    model = model_description(record)
    label = model.label if model is not None else c.model.arch
    held = [c.run.precision] if c.run.precision != "fp32" else []
    dtype = model.dtype if model is not None else None
    held += [dtype] if dtype not in (None, "float32") else []
    return ", ".join([c.data.name, label, *held, f"{c.optim.epochs} epochs"])


def need_methods(group: Sequence[RunRecord], wants: Sequence[tuple[str, Predicate, str]]
                 ) -> list[str]:
    """For ``wants`` = [(method, penalty predicate, description)], those absent in group."""
    return [text for method, penalty, text in wants if not seed_runs(group, method, penalty)]


# --- statistics ---------------------------------------------------------------------------
def reference_verified(runs: Sequence[RunRecord]) -> bool:
    """Whether every run's reference gradient was verified when it started (the record's
    ``reference`` block): a cosine measured against one that was not is no measure."""
    return all(r.reference.verified for r in runs)


def valid_layers(runs: Sequence[RunRecord]) -> list[bool]:
    """Per state l: whether every run's end-of-run cosine was measured against a verified
    reference gradient whose ‖g_l‖ is at or above the floor (``cosine_table`` of the record;
    True where unknown)."""
    tables = [r.diagnostics.cosine_table or [] for r in runs]
    n = max((len(t) for t in tables), default=0)
    verified = reference_verified(runs)
    return [verified and all(bool(t[l].get("valid_reference", True)) for t in tables
                             if l < len(t))
            for l in range(n)]


def layer_mean_std(rows: Sequence[Sequence[Any] | None]) -> tuple[np.ndarray, np.ndarray]:
    """Per-layer mean and sample std (:func:`~creditaudit.results.seed_std`) across seeds
    of per-layer lists (shortest length kept)."""
    rows = [r for r in rows if r]
    if not rows:
        return np.array([]), np.array([])
    n = min(len(r) for r in rows)
    arr = np.array([[as_float(v) for v in r[:n]] for r in rows], dtype=float)
    with np.errstate(all="ignore"), _quiet_nan():
        return np.nanmean(arr, axis=0), seed_std(arr, axis=0)


class _quiet_nan:
    """Silence numpy's all-NaN-slice warnings (a layer without values stays NaN)."""

    def __enter__(self) -> None:
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc: Any) -> None:
        self._ctx.__exit__(*exc)


def epoch_mean_std(runs: Sequence[RunRecord], key: str, index: int | None = None
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


def _finite(value: Any) -> bool:
    """Whether ``value`` (a number, or a per-layer list) holds only finite numbers."""
    if isinstance(value, (list, tuple)):
        return bool(value) and all(_finite(v) for v in value)
    return value is not None and bool(np.isfinite(as_float(value)))


def partial_means_note(chosen: dict[str, Sequence[RunRecord]],
                       values: dict[str, Callable[[RunRecord], Any]]) -> str | None:
    """``Means over fewer runs (the others hold no finite value: …): Γ of BP over 2 of 3
    runs; …`` for each mean across seeds (``values``: what it is → the run's value) that
    leaves some of a method's runs out, as the report's ``(2 of 3 runs)`` does; then
    ``One run, no spread: State Bridge.`` for the methods drawn from one run (its error bar
    of 0 measures no spread). None when every mean is over at least two runs, all of them."""
    partial = []
    for what, value in values.items():
        for method, runs in chosen.items():
            held = sum(_finite(value(r)) for r in runs)
            if runs and held < len(runs):
                partial.append(f"{what} of {method_label(method)} over {held} of "
                               f"{len(runs)} runs")
    single = [method_label(m) for m, runs in chosen.items() if len(runs) == 1]
    notes = []
    if partial:
        notes.append("Means over fewer runs (the others hold none, or none finite: a "
                     "diverged model's end-of-run block has no metrics, a run with "
                     "diagnostics.end_of_run=false no block): " + "; ".join(partial) + ".")
    if single:
        notes.append("One run, so no spread (error bar 0): " + ", ".join(single) + ".")
    return " ".join(notes) or None


def seeds_text(chosen: dict[str, Sequence[RunRecord]]) -> str:
    """``3 seeds``, or ``1–6 seeds`` where the methods ran different numbers of seeds."""
    counts = [len(runs) for runs in chosen.values() if runs]
    low, high = min(counts, default=0), max(counts, default=0)
    return counted(low, "seed") if low == high else f"{low}–{high} seeds"
