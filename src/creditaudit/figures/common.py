"""What every figure shares: run selection from a results folder, styling and saving.

Figures read run records only, never a live model (ARCHITECTURE.md), so any figure can be
regenerated from the files under a results folder. :class:`RunIndex` loads every
``record.json`` below a folder once; figures select runs by config predicates (method,
penalty, architecture, terminal LN, dataset, seed) and compare runs only within one
*recipe*: runs that share data, model, optimiser and precision settings and differ only in
the credit rule, its penalty λ and the seed.

A figure module exposes ``NAME``, ``TITLE``, ``requirements`` (what runs it needs, in
words), ``build(index) -> {name: Figure}`` and ``render(index, out_dir) -> [paths]``; both
raise :class:`MissingRuns` naming what is missing when the index cannot support it.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from creditaudit.config import RunConfig  # noqa: E402
from creditaudit.errors import CreditAuditError  # noqa: E402
from creditaudit.protocol import (  # noqa: E402
    FIRED,
    HEADLINE_GAMMA,
    DiagnosticReport,
    Thresholds,
    depth_utility_diagnostic,
    verdict_of,
)
from creditaudit.runs import find_records, load_record, record_config  # noqa: E402

log = logging.getLogger(__name__)

# Statuses whose records hold a finished trajectory (a diverged run keeps its epochs so far).
USABLE_STATUSES = ("completed", "diverged")
METHOD_ORDER = ("bp", "fa", "dfa", "ep", "state-bridge", "credit-bridge", "frozen")
METHOD_LABELS = {"bp": "BP", "fa": "FA", "dfa": "DFA", "ep": "EP",
                 "state-bridge": "State Bridge", "credit-bridge": "Credit Bridge",
                 "frozen": "Frozen blocks"}
METHOD_COLORS = {"bp": "#2166ac", "fa": "#e08214", "dfa": "#b2182b", "ep": "#1b7837",
                 "state-bridge": "#762a83", "credit-bridge": "#35978f", "frozen": "#636363"}
METHOD_MARKERS = {"bp": "o", "fa": "s", "dfa": "D", "ep": "^", "state-bridge": "v",
                  "credit-bridge": "P", "frozen": "X"}
# Penalised runs (λ > 0) get a sequence of greens/blues, vanilla keeps the method colour.
PENALTY_COLORS = ("#1a9850", "#2c7bb6", "#7b3294", "#d95f02", "#66a61e", "#e7298a")
HEALTHY_COLOR, WALKBACK_COLOR = "#1a9850", "#d73027"
FLOOR = Thresholds().grad_floor
ARCH_ROWS = ("resmlp", "vit", "resmlp no out_ln", "student")
ARCH_LABELS = {"resmlp": "ResMLP", "vit": "ViT-Mini", "resmlp no out_ln": "ResMLP no out_LN",
               "vit no out_ln": "ViT-Mini no out_LN", "student": "StudentNet"}
PNG_DPI = 200
N_CLASSES = {"cifar100": 100}  # every other dataset (MNIST-1D and synthetic too) has 10
STYLE = {
    "font.size": 9, "axes.labelsize": 10, "axes.titlesize": 10, "legend.fontsize": 8,
    "xtick.labelsize": 8, "ytick.labelsize": 8, "font.family": "serif",
}


class MissingRuns(CreditAuditError):
    """A figure cannot be drawn from the runs at hand; ``needs`` lists what is missing."""

    def __init__(self, figure: str, needs: Sequence[str]) -> None:
        self.figure = figure
        self.needs = list(needs)
        super().__init__(f"{figure} needs " + "; ".join(self.needs))


# --- runs ---------------------------------------------------------------------------------
def _recipe_key(config: RunConfig) -> str:
    """Everything that must match for two runs to be compared (not rule, λ, seed)."""
    raw = config.to_dict()
    data = {k: v for k, v in raw["data"].items() if k not in ("data_dir", "download")}
    recipe = {"data": data, "model": raw["model"], "optim": raw["optim"],
              "precision": raw["run"]["precision"],
              "trainable_blocks": raw["method"]["trainable_blocks"]}
    return json.dumps(recipe, sort_keys=True)


def arch_label(config: RunConfig) -> str:
    """``resmlp``, ``resmlp no out_ln``, ``vit``, ``vit no out_ln`` or ``student``."""
    arch = config.model.arch
    if arch == "student":
        return "student"
    return arch if config.model.out_ln else f"{arch} no out_ln"


@dataclass(frozen=True)
class Run:
    """One loaded run record and its validated config."""

    path: Path
    record: dict[str, Any] = field(repr=False, compare=False)
    config: RunConfig = field(repr=False, compare=False)

    @property
    def run_id(self) -> str:
        return self.record["run_id"]

    @property
    def method(self) -> str:
        return self.config.method.name

    @property
    def penalty(self) -> float:
        return self.config.method.penalty

    @property
    def arch(self) -> str:
        return self.config.model.arch

    @property
    def out_ln(self) -> bool:
        return self.config.model.out_ln

    @property
    def arch_label(self) -> str:
        return arch_label(self.config)

    @property
    def dataset(self) -> str:
        return self.config.data.name

    @property
    def seed(self) -> int:
        return self.config.run.seed

    @property
    def status(self) -> str:
        return self.record["status"]

    @property
    def epochs(self) -> int:
        return self.config.optim.epochs

    @property
    def recipe(self) -> str:
        return _recipe_key(self.config)

    @property
    def log(self) -> list[dict[str, Any]]:
        return self.record["log"]

    @property
    def diagnostics(self) -> dict[str, Any]:
        return self.record.get("diagnostics") or {}

    @property
    def standard(self) -> bool:
        """Not a control variant (depth ladder, random labels, no residual stream)."""
        c = self.config
        return (c.method.trainable_blocks is None and not c.data.random_targets
                and c.model.residual)

    @property
    def final_acc(self) -> float:
        """Final test accuracy (fraction): ``final.test_acc``, else the last logged epoch's."""
        final = self.record.get("final") or {}
        if final.get("test_acc") is not None:
            return float(final["test_acc"])
        for entry in reversed(self.log):
            if entry.get("acc_eval") is not None:
                return float(entry["acc_eval"])
        return math.nan

    @property
    def deep_cos(self) -> float:
        value = self.diagnostics.get("deep_cos")
        if value is None:
            value = (self.record.get("final") or {}).get("deep_cos")
        return as_float(value)

    @property
    def headline_gamma(self) -> float:
        return as_float((self.diagnostics.get("gamma") or {}).get(HEADLINE_GAMMA))

    @property
    def deep_rho(self) -> float:
        return deep_mean(self.diagnostics.get("perturbation_rho"))

    @property
    def n_classes(self) -> int:
        return N_CLASSES.get(self.dataset, 10)

    def last(self, key: str) -> Any:
        """The value of ``key`` in the last log entry that has it (None if none does)."""
        for entry in reversed(self.log):
            if entry.get(key) is not None:
                return entry[key]
        return None

    def series(self, key: str, index: int | None = None) -> tuple[list[int], list[float]]:
        """(epochs, values) of per-epoch ``key`` (``entry[key][index]`` for list fields)."""
        epochs, values = [], []
        for entry in self.log:
            value = entry.get(key)
            if value is None:
                continue
            if index is not None:
                if not isinstance(value, list) or not -len(value) <= index < len(value):
                    continue
                value = value[index]
            epochs.append(int(entry["epoch"]))
            values.append(as_float(value))
        return epochs, values


def as_float(value: Any) -> float:
    """A float, NaN for None or the "NaN" marker."""
    if value is None or isinstance(value, str):
        return math.nan
    return float(value)


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

    ``frozen_from_runs``: evaluate protocol diagnostic (d) of each run against the mean final
    accuracy of the frozen-blocks runs of its recipe (when there are any) instead of taking
    the record's own (d) — see :meth:`protocol_report`.
    """

    def __init__(self, runs: Iterable[Run], *, root: Path | None = None,
                 skipped: Sequence[tuple[Path, str]] = (), frozen_from_runs: bool = False
                 ) -> None:
        self.all_runs = sorted(runs, key=lambda r: (r.dataset, r.arch_label, _method_rank(
            r.method), r.penalty, r.seed, r.run_id))
        self.root = root
        self.skipped = list(skipped)
        self.frozen_from_runs = frozen_from_runs

    @classmethod
    def from_dir(cls, root: str | Path, *, dataset: str | None = None,
                 frozen_from_runs: bool = False) -> RunIndex:
        """Load every record.json below ``root``; unreadable records are skipped and listed
        in ``skipped`` (with the reason). Raises CreditAuditError when ``root`` is not a
        folder."""
        root = Path(root)
        if not root.is_dir():
            raise CreditAuditError(f"results folder {root} does not exist: pass the folder "
                                   "your runs were written to (train/sweep --out)")
        runs, skipped = [], []
        for path in find_records(root):
            try:
                record = load_record(path)
                config = record_config(record)
            except CreditAuditError as err:
                log.warning("skipping %s: %s", path, err)
                skipped.append((path, str(err)))
                continue
            if dataset is not None and config.data.name != dataset:
                continue
            runs.append(Run(path, record, config))
        return cls(runs, root=root, skipped=skipped, frozen_from_runs=frozen_from_runs)

    @classmethod
    def from_records(cls, records: Iterable[dict[str, Any]], **kwargs: Any) -> RunIndex:
        """An index over in-memory records (tests, notebooks)."""
        runs = [Run(Path(r["run_id"]), r, record_config(r)) for r in records]
        return cls(runs, **kwargs)

    def __len__(self) -> int:
        return len(self.all_runs)

    @property
    def runs(self) -> list[Run]:
        """Runs whose status is usable for figures (completed or diverged)."""
        return [r for r in self.all_runs if r.status in USABLE_STATUSES]

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
        frozen = self.select(method="frozen", recipe=run.recipe, standard=None)
        if not frozen:
            return None
        return float(np.mean([r.final_acc for r in frozen])), len(frozen)

    def protocol_report(self, run: Run) -> DiagnosticReport | None:
        """The run's protocol report (its record's last protocol block), or None.

        Γ, the per-layer cosines and the credit-quality metrics are filled in from the
        record's end-of-run diagnostics when the protocol block lacks them (training
        evaluates the protocol without the credit). With ``frozen_from_runs`` and a
        frozen-blocks run of the same recipe, (d) is re-evaluated against the frozen runs'
        mean final accuracy (``metadata["frozen_from_runs"]`` says how many) and the verdict
        follows; frozen-blocks runs themselves keep their record's (d).
        """
        block = (run.record.get("protocol") or {}).get("report")
        if not block:
            return None
        report = DiagnosticReport.from_dict(json.loads(json.dumps(block)))
        diagnostics = run.diagnostics
        if report.gamma is None and diagnostics.get("gamma"):
            report.gamma = dict(diagnostics["gamma"])
        if report.layer_cosines is None and diagnostics.get("cosine_table"):
            report.layer_cosines = list(diagnostics["cosine_table"])
        if report.metrics is None and diagnostics.get("bp_cosine") is not None:
            report.metrics = {k: v for k, v in diagnostics.items()
                              if k not in ("drift", "cosine_table")}
        baseline = self.frozen_baseline(run) if self.frozen_from_runs else None
        if baseline is not None and run.method != "frozen":
            frozen_acc, n = baseline
            headline = report.metadata.get("headline_acc")
            if headline is None:
                headline = run.final_acc
            d = depth_utility_diagnostic(headline, frozen_acc, report.thresholds)
            d.details["frozen_runs"] = n
            report.diagnostics = [d if r.id == "d" else r for r in report.diagnostics]
            report.verdict, report.fired, report.not_evaluated = verdict_of(report.diagnostics)
            report.metadata["frozen_acc"] = frozen_acc
            report.metadata["frozen_from_runs"] = n
        return report


def _method_rank(method: str) -> int:
    return METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER)


def sort_methods(methods: Iterable[str]) -> list[str]:
    return sorted(set(methods), key=lambda m: (_method_rank(m), m))


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
    return (f"{c.data.name}, {arch_label(c)} d={c.model.d} L={c.model.n_blocks}, "
            f"{c.optim.epochs} epochs")


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


# --- drawing ------------------------------------------------------------------------------
def method_label(method: str, penalty: float = 0.0) -> str:
    label = METHOD_LABELS.get(method, method)
    return f"{label} λ={penalty:g}" if penalty else label


def method_color(method: str) -> str:
    return METHOD_COLORS.get(method, "#000000")


def method_marker(method: str) -> str:
    return METHOD_MARKERS.get(method, "o")


def new_figure(nrows: int, ncols: int, *, figsize: tuple[float, float], **kwargs: Any
               ) -> tuple[Figure, np.ndarray]:
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(nrows, ncols, figsize=figsize, squeeze=False, **kwargs)
    return fig, axes


def add_grid(ax: Any, log_scale: bool = False) -> None:
    ax.grid(True, which="major", color="#d0d0d0", linewidth=0.4, linestyle=":")
    if log_scale:
        ax.grid(True, which="minor", color="#e8e8e8", linewidth=0.3, linestyle=":")
    ax.set_axisbelow(True)


def integer_x(ax: Any) -> None:
    """Integer ticks on the x axis (epochs, layers, blocks)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def floor_line(ax: Any, label: str | None = None) -> Any:
    """The 1e-7 reference-gradient floor of diagnostic (b)."""
    return ax.axhline(FLOOR, color="black", ls="--", lw=0.9,
                      label=label or f"floor {FLOOR:.0e}", gid="floor")


def positive(values: Iterable[float]) -> list[float]:
    return [v for v in values if v > 0 and math.isfinite(v)]


def mean_line(ax: Any, x: Sequence[float], mean: np.ndarray, std: np.ndarray, *, label: str,
              color: str, band: bool = True, **kwargs: Any) -> Any:
    """The mean across seeds as a line (label = ``label``) and ± std as a band."""
    (line,) = ax.plot(x, mean, color=color, label=label, **kwargs)
    if band and np.any(std > 0):
        ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.15, lw=0)
    return line


def save(fig: Figure, out_dir: str | Path, name: str) -> list[Path]:
    """Save ``fig`` as ``out_dir/name.png`` (``PNG_DPI``, 200) and ``.pdf``; closes it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # One tight bounding box for both files: bbox_inches="tight" would lay out every text
    # twice per file, which dominates the time on a small machine.
    bbox = fig.get_tightbbox(fig.canvas.get_renderer()).padded(0.1)
    paths = []
    for ext, dpi in (("png", PNG_DPI), ("pdf", None)):
        path = out / f"{name}.{ext}"
        tmp = out / f".{name}.tmp.{ext}"
        fig.savefig(tmp, bbox_inches=bbox, dpi=dpi, format=ext)
        tmp.replace(path)
        paths.append(path)
    plt.close(fig)
    return paths


def save_all(figures: dict[str, Figure], out_dir: str | Path) -> list[Path]:
    paths: list[Path] = []
    for name, fig in figures.items():
        paths.extend(save(fig, out_dir, name))
    return paths


def fired_ids(report: DiagnosticReport) -> list[str]:
    return [r.id for r in report.diagnostics if r.status == FIRED]
