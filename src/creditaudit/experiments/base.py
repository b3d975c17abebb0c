"""What a shipped experiment is, the registry, and :func:`run_experiment`.

An :class:`Experiment` names a question, builds its run configs at a scale (always
``scales.base_config(scale, …)`` plus a few overrides, so runs are shared between
experiments and with ``creditaudit sweep`` whenever settings coincide), summarises the run
records into a JSON-able dict, and renders that summary as Markdown. Summaries read run
records only — never a live model — so they can be recomputed from files at any time.

:func:`run_experiment` trains whatever is missing through :func:`creditaudit.sweep.run_sweep`
(finished runs are skipped, failing runs are recorded and the rest go on), loads the
records and writes ``OUT/experiments/NAME.json`` and ``OUT/experiments/NAME.md``.

The record helpers below are shared by the experiment modules. The one judgement they encode
is the frozen baseline of protocol diagnostic (d): runs are trained without
``diagnostics.frozen_acc`` (it would change every run id), so (d) is recomputed at summary
time from the records — headline accuracy against the mean final accuracy of the ``frozen``
runs of the same architecture, data and recipe (same config except the method section and
the seed) — while (a), (b) and (c) keep the status the training-time protocol recorded at the
run's last evaluated epoch.
"""

from __future__ import annotations

import copy
import importlib
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from creditaudit.config import RunConfig, device_overrides
from creditaudit.errors import ConfigError, CreditAuditError
from creditaudit.experiments.aggregate import aggregate, config_without_seed
from creditaudit.experiments.scales import SCALES, base_config, get_scale
from creditaudit.protocol import (
    DIAGNOSTIC_NAMES,
    FIRED,
    HEADLINE_GAMMA,
    NOT_EVALUATED,
    Thresholds,
    depth_utility_diagnostic,
    labels,
)
from creditaudit.report import format_lambda
from creditaudit.sweep import dedupe

log = logging.getLogger(__name__)

EXPERIMENTS_DIR = "experiments"
DEFAULT_THRESHOLDS = Thresholds()
FINISHED = ("completed", "diverged")
EXECUTORS = ("local", "inline", "ray")
# The order `all` runs and lists them in.
ORDER = ("audit_table", "random_init", "decision_utility", "threshold_sensitivity",
         "temporal", "penalty_sweep", "capacity_cost", "fresh_null", "depth_ladder")
DIAGNOSTIC_IDS = tuple(DIAGNOSTIC_NAMES)
CIFAR = ("cifar10", "cifar100")
N_CLASSES = {"cifar100": 100}
# The methods of the audit table (method, penalty λ), the frozen baseline last.
AUDIT_METHODS: tuple[tuple[str, float], ...] = (
    ("bp", 0.0), ("fa", 0.0), ("dfa", 0.0), ("dfa", 1e-2), ("state-bridge", 0.0),
    ("credit-bridge", 0.0), ("ep", 0.0), ("frozen", 0.0))
# The alternative rules the decision-utility count runs over (SPEC §7: "x/5").
RULES = ("fa", "dfa", "ep", "state-bridge", "credit-bridge")

ConfigsFn = Callable[..., list[RunConfig]]
SummariseFn = Callable[[list[dict[str, Any]]], dict[str, Any]]
MarkdownFn = Callable[[dict[str, Any]], str]


# --- the experiment description --------------------------------------------------------
@dataclass(frozen=True)
class Experiment:
    """A shipped experiment.

    ``question``: what it answers (one sentence). ``needs``: the runs it trains, in words.
    ``build_configs(scale, *, dataset, data_dir, out_dir)`` → run configs;
    ``summarise_fn(records)`` → JSON-able summary (records of finished runs, any order);
    ``markdown_fn(summary)`` → Markdown body.
    """

    name: str
    question: str
    needs: str
    build_configs: ConfigsFn
    summarise_fn: SummariseFn
    markdown_fn: MarkdownFn

    def configs(self, scale: str, dataset: str | None = None, data_dir: str | None = None,
                out_dir: str | Path = "results") -> list[RunConfig]:
        """The experiment's runs at ``scale`` (duplicates removed, order kept)."""
        get_scale(scale)
        configs = self.build_configs(scale, dataset=dataset, data_dir=data_dir,
                                     out_dir=str(out_dir))
        return dedupe(configs)

    def summarise(self, records: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """The summary of finished ``records`` (others are ignored)."""
        finished = [r for r in records if r.get("status") in FINISHED]
        return self.summarise_fn(finished)

    def to_markdown(self, summary: dict[str, Any]) -> str:
        """Title, question, run bookkeeping (when ``summary["meta"]`` exists) and body."""
        lines = [f"# Experiment `{self.name}`", "", f"*{self.question}*", ""]
        meta = summary.get("meta")
        if meta:
            lines.append(f"Scale `{meta['scale']}`, dataset `{meta['dataset']}`; "
                         f"{meta['runs_found']} of {meta['runs_needed']} runs have finished "
                         f"records in `{meta['out_dir']}`.")
            if meta.get("missing"):
                lines.append("")
                lines.append("Missing runs (not summarised): " + ", ".join(
                    f"`{m['run_id']}` ({m['status']})" for m in meta["missing"]))
            lines.append("")
        lines.append(self.markdown_fn(summary).rstrip())
        return "\n".join(lines) + "\n"


_REGISTRY: dict[str, Experiment] = {}


def register(experiment: Experiment) -> Experiment:
    """Add ``experiment`` to the registry (idempotent per name)."""
    _REGISTRY[experiment.name] = experiment
    return experiment


def _load_all() -> None:
    importlib.import_module("creditaudit.experiments")


def experiment_names() -> list[str]:
    """Registered experiments, in the order ``all`` runs them."""
    _load_all()
    known = [name for name in ORDER if name in _REGISTRY]
    return known + sorted(set(_REGISTRY) - set(known))


def get_experiment(name: str) -> Experiment:
    _load_all()
    if name not in _REGISTRY:
        raise ConfigError(f"unknown experiment {name!r}; choose one of "
                          f"{', '.join(experiment_names())} or all")
    return _REGISTRY[name]


# --- config helpers -----------------------------------------------------------------------
def scale_dataset(scale: str, dataset: str | None) -> str:
    return dataset or get_scale(scale).dataset


def summary_stem(name: str, scale: str, dataset: str) -> str:
    """File stem of an experiment's summary in OUT/experiments/: ``NAME`` for the scale's
    own dataset, ``NAME.DATASET`` for another one (so both can share a results folder)."""
    return name if dataset == get_scale(scale).dataset else f"{name}.{dataset}"


_CONFIG_CACHE: dict[tuple[Any, ...], RunConfig] = {}


def scale_config(scale: str, *, dataset: str | None, data_dir: str | None, out_dir: str,
                 control: bool = False, **overrides: Any) -> RunConfig:
    """``base_config(scale, …)`` with dotted ``overrides`` given as ``section__key=value``.

    Memoised (config validation is the slow part of building an experiment's runs, and the
    experiments share most of theirs); every call returns a fresh copy.
    """
    key = (scale, dataset, data_dir, str(out_dir), control, tuple(sorted(overrides.items())))
    if key not in _CONFIG_CACHE:
        config = base_config(scale, dataset=dataset, data_dir=data_dir, out_dir=str(out_dir),
                             control=control)
        if overrides:
            config = config.replace(**{k.replace("__", "."): value
                                       for k, value in overrides.items()})
        _CONFIG_CACHE[key] = config
    return copy.deepcopy(_CONFIG_CACHE[key])


def method_overrides(method: str, penalty: float = 0.0) -> dict[str, Any]:
    out: dict[str, Any] = {"method__name": method}
    if penalty:
        out["method__penalty"] = float(penalty)
    return out


ARCH_VARIANTS = ("resmlp", "resmlp-noLN", "student", "vit")


def arch_config(variant: str, scale: str, *, dataset: str | None, data_dir: str | None,
                out_dir: str, control: bool = False, **overrides: Any) -> RunConfig:
    """A run of one architecture variant of the cross-architecture experiments.

    ``resmlp``: the scale's ResidualMLP with terminal LN; ``resmlp-noLN``: without it;
    ``student``: StudentNet on the synthetic teacher–student task (whatever the scale's
    dataset: the task needs no download); ``vit``: ViT-Mini (d=128 except at smoke scale),
    CIFAR only.
    """
    if variant == "resmlp":
        extra: dict[str, Any] = {}
    elif variant == "resmlp-noLN":
        extra = {"model__out_ln": False}
    elif variant == "student":
        extra = {"model__arch": "student"}
        dataset, data_dir = "synthetic", None
    elif variant == "vit":
        extra = {"model__arch": "vit"}
        if scale != "smoke":
            extra["model__d"] = 128
    else:
        raise ConfigError(f"unknown architecture variant {variant!r}; use one of "
                          f"{', '.join(ARCH_VARIANTS)}")
    return scale_config(scale, dataset=dataset, data_dir=data_dir, out_dir=out_dir,
                        control=control, **extra, **overrides)


def arch_variants(scale: str, dataset: str | None) -> list[str]:
    """The architectures of the cross-architecture experiments (ViT only on CIFAR)."""
    variants = ["resmlp", "resmlp-noLN", "student"]
    if scale_dataset(scale, dataset) in CIFAR:
        variants.append("vit")
    return variants


# --- record accessors ---------------------------------------------------------------------
def cfg(record: dict[str, Any], key: str) -> Any:
    """A config value of a record by dotted key (``"method.penalty"``)."""
    section, _, name = key.partition(".")
    return record["config"][section][name]


def seed_of(record: dict[str, Any]) -> int:
    return int(record["config"]["run"]["seed"])


def arch_variant(record: dict[str, Any]) -> str:
    """``resmlp``, ``resmlp-noLN``, ``student`` or ``vit`` (plus ``-no-residual``)."""
    model = record["config"]["model"]
    name = model["arch"]
    if name == "resmlp" and not model["out_ln"]:
        name = "resmlp-noLN"
    if not model["residual"]:
        name += "-no-residual"
    return name


def method_label(record: dict[str, Any]) -> str:
    """``dfa``, ``dfa+λ=1e-2``, ``bp k=2`` …: the method with its penalty and ladder step."""
    method = record["config"]["method"]
    label = method["name"]
    if method["penalty"]:
        label += f"+λ={format_lambda(method['penalty'])}"
    if method["trainable_blocks"] is not None:
        label += f" k={method['trainable_blocks']}"
    return label


def is_plain(record: dict[str, Any]) -> bool:
    """No penalty, all blocks trainable, real labels: the canonical run of its method."""
    method = record["config"]["method"]
    return (method["penalty"] == 0 and method["trainable_blocks"] is None
            and not record["config"]["data"]["random_targets"])


def n_classes(record: dict[str, Any]) -> int:
    return N_CLASSES.get(record["config"]["data"]["name"], 10)


def chance(record: dict[str, Any]) -> float:
    return 1.0 / n_classes(record)


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def final_acc(record: dict[str, Any]) -> float | None:
    """The headline test accuracy: ``final.test_acc``, else the last logged ``acc_eval``."""
    final = record.get("final") or {}
    if _number(final.get("test_acc")) is not None:
        return float(final["test_acc"])
    for entry in reversed(record.get("log", [])):
        if _number(entry.get("acc_eval")) is not None:
            return float(entry["acc_eval"])
    return None


def last_entry(record: dict[str, Any]) -> dict[str, Any]:
    """The last log entry holding diagnostics (``hidden_norms``); {} when there is none."""
    for entry in reversed(record.get("log", [])):
        if "hidden_norms" in entry:
            return entry
    return {}


def last_value(record: dict[str, Any], key: str) -> float | None:
    return _number(last_entry(record).get(key))


def deep_mean(values: Sequence[Any] | None) -> float | None:
    """Mean over layers l ≥ 1 of the finite values; None when there is none."""
    if not values:
        return None
    kept = [float(v) for v in values[1:] if _number(v) is not None and math.isfinite(float(v))]
    return sum(kept) / len(kept) if kept else None


def headline_gamma(record: dict[str, Any]) -> float | None:
    """Headline Γ (samples then layers): the end-of-run value, else the last epoch's
    ``cos_per_layer`` averaged over layers (the same aggregation)."""
    gamma = (record.get("diagnostics") or {}).get("gamma") or {}
    if _number(gamma.get(HEADLINE_GAMMA)) is not None:
        return float(gamma[HEADLINE_GAMMA])
    cos = last_entry(record).get("cos_per_layer") or []
    kept = [float(v) for v in cos if _number(v) is not None and math.isfinite(float(v))]
    return sum(kept) / len(kept) if kept else None


def deep_cos(record: dict[str, Any]) -> float | None:
    """Deep cosine (mean over l ≥ 1) at the last evaluated epoch."""
    value = last_value(record, "deep_cos")
    if value is not None and math.isfinite(value):
        return value
    return deep_mean(last_entry(record).get("cos_per_layer"))


def recorded_statuses(record: dict[str, Any]) -> dict[str, str]:
    """(a)…(d) statuses of the run's last training-time protocol evaluation."""
    report = (record.get("protocol") or {}).get("report") or {}
    diagnostics = report.get("diagnostics") or {}
    if diagnostics:
        return {i: diagnostics[i]["status"] for i in DIAGNOSTIC_IDS if i in diagnostics}
    for entry in reversed(record.get("log", [])):
        if isinstance(entry.get("protocol"), dict):
            return dict(entry["protocol"])
    return {}


def recorded_value(record: dict[str, Any], diagnostic: str) -> float | None:
    """The statistic of ``diagnostic`` at the run's last protocol evaluation."""
    report = (record.get("protocol") or {}).get("report") or {}
    result = (report.get("diagnostics") or {}).get(diagnostic) or {}
    return _number(result.get("value"))


def first_fired(record: dict[str, Any]) -> dict[str, int | None]:
    """First epoch each of (a)–(c) fired during training (from the per-epoch statuses)."""
    out: dict[str, int | None] = dict.fromkeys(DIAGNOSTIC_IDS[:3])
    for entry in record.get("log", []):
        statuses = entry.get("protocol") or {}
        for i in out:
            if out[i] is None and statuses.get(i) == FIRED:
                out[i] = int(entry["epoch"])
    recorded = (record.get("protocol") or {}).get("first_fired") or {}
    for i in out:
        if out[i] is None and recorded.get(i) is not None:
            out[i] = int(recorded[i])
    return out


# --- the frozen baseline and the recomputed verdict ---------------------------------------
def baseline_key(config: dict[str, dict[str, Any]]) -> str:
    """Equal for runs of the same architecture, data and recipe (any method, any seed)."""
    rest = config_without_seed(config)
    rest.pop("method", None)
    return json.dumps(rest, sort_keys=True)


def is_frozen(record: dict[str, Any]) -> bool:
    method = record["config"]["method"]
    return (method["name"] == "frozen" and method["penalty"] == 0
            and not record["config"]["data"]["random_targets"])


def frozen_index(records: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Frozen-blocks runs by :func:`baseline_key`."""
    index: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if is_frozen(record):
            index.setdefault(baseline_key(record["config"]), []).append(record)
    return index


def frozen_acc_for(record: dict[str, Any], index: dict[str, list[dict[str, Any]]]
                   ) -> float | None:
    """Mean final accuracy of the frozen runs matching ``record`` (over their seeds)."""
    accs = [a for r in index.get(baseline_key(record["config"]), [])
            if (a := final_acc(r)) is not None]
    return sum(accs) / len(accs) if accs else None


def protocol_verdict(record: dict[str, Any], frozen_acc: float | None,
                     thresholds: Thresholds = DEFAULT_THRESHOLDS) -> dict[str, Any]:
    """The run's verdict with (d) recomputed against ``frozen_acc``.

    (a)–(c): the statuses recorded at the run's last protocol evaluation; (d): headline
    (final) accuracy − ``frozen_acc`` in pp, not evaluated when either is missing.
    """
    statuses = {i: s for i, s in recorded_statuses(record).items() if i != "d"}
    for i in DIAGNOSTIC_IDS[:3]:
        statuses.setdefault(i, NOT_EVALUATED)
    d = depth_utility_diagnostic(final_acc(record), frozen_acc, thresholds)
    statuses["d"] = d.status
    fired = [i for i in DIAGNOSTIC_IDS if statuses[i] == FIRED]
    skipped = [i for i in DIAGNOSTIC_IDS if statuses[i] == NOT_EVALUATED]
    verdict = "needs walk-back" if fired else "trustworthy"
    text = verdict + (f" {labels(fired)}" if fired else "")
    if skipped:
        text += f"; not evaluated: {labels(skipped)}"
    return {"statuses": statuses, "fired": fired, "not_evaluated": skipped,
            "verdict": verdict, "verdict_text": text, "margin_pp": d.value,
            "frozen_acc": frozen_acc}


def verdicts_with_frozen(records: Sequence[dict[str, Any]], index: dict[str, Any] | None = None
                         ) -> dict[str, dict[str, Any]]:
    """:func:`protocol_verdict` of every record (by run id) against its frozen baseline."""
    index = frozen_index(records) if index is None else index
    return {r["run_id"]: protocol_verdict(r, frozen_acc_for(r, index)) for r in records}




def verdict_overview(verdicts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Seeds walked back, how often each diagnostic fired, and a one-line overall verdict
    (``needs walk-back (a)(b) in 3/3 seeds``) over the :func:`protocol_verdict` of a
    group's seeds."""
    n = len(verdicts)
    walked = sum(v["verdict"] != "trustworthy" for v in verdicts)
    counts = {i: sum(i in v["fired"] for v in verdicts) for i in DIAGNOSTIC_IDS}
    skipped = [i for i in DIAGNOSTIC_IDS if any(i in v["not_evaluated"] for v in verdicts)]
    if walked:
        text = (f"needs walk-back {labels([i for i in DIAGNOSTIC_IDS if counts[i]])} in "
                f"{walked}/{n} seeds")
    else:
        text = f"trustworthy ({n}/{n} seeds)"
    if skipped:
        text += f"; not evaluated: {labels(skipped)}"
    return {"n": n, "walked_back": walked, "fired_counts": counts, "not_evaluated": skipped,
            "text": text}


def seed_row(record: dict[str, Any], verdict: dict[str, Any]) -> dict[str, Any]:
    """One seed of a group: its headline numbers and recomputed verdict."""
    return {"seed": seed_of(record), "run_id": record["run_id"], "status": record["status"],
            "test_acc": final_acc(record), "headline_gamma": headline_gamma(record),
            "deep_cos": deep_cos(record), "h_L_norm": last_value(record, "h_L_norm"),
            "g_L_norm": last_value(record, "g_L_norm"),
            "max_block_growth": last_value(record, "max_block_growth"),
            "statuses": verdict["statuses"], "verdict": verdict["verdict_text"],
            "margin_pp": verdict["margin_pp"], "first_fired": first_fired(record)}


def group_summary(members: Sequence[dict[str, Any]], verdicts: dict[str, dict[str, Any]]
                  ) -> dict[str, Any]:
    """Seed aggregates of one group (runs equal but for the seed) and its per-seed rows."""
    seeds = [seed_row(r, verdicts[r["run_id"]]) for r in members]
    frozen = [verdicts[r["run_id"]]["frozen_acc"] for r in members]
    return {
        "label": method_label(members[0]), "method": cfg(members[0], "method.name"),
        "penalty": cfg(members[0], "method.penalty"),
        "trainable_blocks": cfg(members[0], "method.trainable_blocks"),
        "arch": arch_variant(members[0]), "dataset": cfg(members[0], "data.name"),
        "epochs": cfg(members[0], "optim.epochs"),
        "test_acc": aggregate(s["test_acc"] for s in seeds),
        "headline_gamma": aggregate(s["headline_gamma"] for s in seeds),
        "deep_cos": aggregate(s["deep_cos"] for s in seeds),
        "h_L_norm": aggregate(s["h_L_norm"] for s in seeds),
        "g_L_norm": aggregate(s["g_L_norm"] for s in seeds),
        "max_block_growth": aggregate(s["max_block_growth"] for s in seeds),
        "margin_pp": aggregate(s["margin_pp"] for s in seeds),
        "frozen_acc": next((f for f in frozen if f is not None), None),
        "verdict": verdict_overview([verdicts[r["run_id"]] for r in members]),
        "seeds": seeds,
    }


TRAJECTORY_KEYS = ("acc_eval", "h_L_norm", "g_L_norm", "g_2_norm", "max_block_growth")


def trajectory(members: Sequence[dict[str, Any]], keys: Sequence[str] = TRAJECTORY_KEYS
               ) -> dict[str, list[Any]]:
    """Per-epoch median over seeds of each log ``key`` (medians: the norms span orders of
    magnitude across seeds); ``epoch`` lists the epochs with diagnostics."""
    import statistics

    epochs = sorted({int(e["epoch"]) for r in members for e in r["log"] if "hidden_norms" in e})
    out: dict[str, list[Any]] = {"epoch": epochs}
    for key in keys:
        column = []
        for epoch in epochs:
            values = [float(e[key]) for r in members for e in r["log"]
                      if e["epoch"] == epoch and _number(e.get(key)) is not None
                      and not math.isnan(float(e[key]))]
            column.append(statistics.median(values) if values else None)
        out[key] = column
    return out


# --- running ------------------------------------------------------------------------------
def _executor(kind: str, scale: str, workers: int | None) -> Any:
    from creditaudit.sweep import InlineExecutor, LocalExecutor, RayExecutor

    if kind not in EXECUTORS:
        raise ConfigError(f"executor {kind!r} is not one of {', '.join(EXECUTORS)}")
    if kind == "ray":
        return RayExecutor(num_cpus_per_run=1)
    if kind == "inline" or workers == 0 or (scale == "smoke" and workers is None):
        return InlineExecutor(threads=1)
    if workers is not None and workers < 0:
        raise ConfigError(f"--workers must be >= 0, got {workers}")
    return LocalExecutor(workers=workers, threads_per_worker=1)


_RECORD_CACHE: dict[str, tuple[tuple[int, int, int], dict[str, Any]]] = {}


def cached_record(path: Path) -> dict[str, Any]:
    """:func:`runs.load_record` of ``path``, reused while the file is unchanged (records are
    replaced atomically, so a new version has a new mtime)."""
    from creditaudit.runs import load_record

    stat = path.stat()
    key = str(path.resolve())
    version = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
    hit = _RECORD_CACHE.get(key)
    if hit is not None and hit[0] == version:
        return hit[1]
    record = load_record(path)
    _RECORD_CACHE[key] = (version, record)
    return record


def run_state(config: RunConfig) -> tuple[str | None, dict[str, Any] | None, str | None]:
    """(status, record, error) of a run on disk; status None when it has no record."""
    from creditaudit.runs import RECORD_FILE

    path = Path(config.run.out_dir) / config.run_id / RECORD_FILE
    if not path.exists():
        return None, None, None
    try:
        record = cached_record(path)
    except (CreditAuditError, OSError) as err:
        return "corrupt", None, str(err)
    return record["status"], record, record.get("error")


def _load(configs: Sequence[RunConfig]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(finished records, missing runs) of ``configs``."""
    records, missing = [], []
    for config in configs:
        status, record, error = run_state(config)
        if record is not None and status in FINISHED:
            records.append(record)
        else:
            missing.append({"run_id": config.run_id, "status": status or "not started",
                            "error": error})
    return records, missing


def _epoch_seconds(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Wall time of trained epochs in the records (for runtime estimates)."""
    seconds = [float(e["seconds"]) for r in records for e in r["log"]
               if e.get("epoch", 0) >= 1 and _number(e.get("seconds")) is not None]
    return {"epochs": len(seconds), "total": sum(seconds),
            "per_epoch": aggregate(seconds)}


def summarise_experiment(experiment: Experiment, configs: Sequence[RunConfig], *,
                         scale: str, dataset: str, out_dir: Path,
                         outcomes: dict[str, dict[str, Any]] | None = None,
                         wall_seconds: float | None = None) -> dict[str, Any]:
    """Load the records of ``configs``, summarise, write ``OUT/experiments/NAME.{json,md}``."""
    from creditaudit.runs import atomic_write_bytes, atomic_write_json

    records, missing = _load(configs)
    summary = experiment.summarise(records)
    ids = {c.run_id for c in configs}
    actions: dict[str, int] = {}
    for run_id, outcome in (outcomes or {}).items():
        if run_id in ids:
            action = outcome.get("action") or "not started"
            actions[action] = actions.get(action, 0) + 1
    trained = sum(actions.get(a, 0) for a in ("trained", "resumed", "restarted"))
    summary["meta"] = {
        "experiment": experiment.name, "question": experiment.question,
        "scale": scale, "dataset": dataset, "out_dir": str(out_dir),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "runs_needed": len(configs), "runs_found": len(records),
        "run_ids": [c.run_id for c in configs], "missing": missing,
        "execution": {"trained": trained, "actions": actions,
                      "wall_seconds": wall_seconds},
        "epoch_seconds": _epoch_seconds(records),
    }
    folder = out_dir / EXPERIMENTS_DIR
    stem = summary_stem(experiment.name, scale, dataset)
    summary["meta"]["files"] = [str(folder / f"{stem}.json"), str(folder / f"{stem}.md")]
    atomic_write_json(folder / f"{stem}.json", summary)
    atomic_write_bytes(folder / f"{stem}.md", experiment.to_markdown(summary).encode())
    return summary


def run_experiments(names: Sequence[str], *, scale: str, out_dir: str | Path,
                    dataset: str | None = None, data_dir: str | None = None,
                    workers: int | None = None, executor: str = "local",
                    on_progress: Callable[..., None] | None = None,
                    retry_failed: bool = False, device: str | None = None,
                    precision: str | None = None, train: bool = True
                    ) -> dict[str, dict[str, Any]]:
    """Train the runs of several experiments in one sweep, then summarise each.

    Runs shared between experiments train once; ``train=False`` only summarises the runs
    already finished (the others are listed as missing). ``device`` (auto/cpu/cuda; not part of the
    run id, so a run trained on either counts) and ``precision`` (fp32/bf16; part of the run
    id) override every run's config. Returns ``{name: summary}``.
    """
    import torch

    from creditaudit.sweep import prepare_configs, run_sweep

    get_scale(scale)
    experiments = [get_experiment(name) for name in names]
    out_dir = Path(out_dir).resolve()
    overrides = device_overrides(device, precision)
    per_experiment = {e.name: [c.replace(**overrides) if overrides else c
                               for c in e.configs(scale, dataset=dataset, data_dir=data_dir,
                                                  out_dir=out_dir)]
                      for e in experiments}
    everything = dedupe([c for configs in per_experiment.values() for c in configs])
    outcomes: dict[str, dict[str, Any]] = {}
    todo = []
    for config in everything:
        status, _, error = run_state(config)
        if status in FINISHED or (status == "failed" and not retry_failed):
            outcomes[config.run_id] = {"run_id": config.run_id, "status": status,
                                       "action": "skipped", "error": error}
        else:
            todo.append(config)
    started = time.perf_counter()
    if todo and train:  # finished runs never reach the sweep (it would reload every record)
        runner = _executor(executor, scale, workers)
        threads = torch.get_num_threads()
        try:
            # Absolute folders already; prepare only what shows progress bars (paper scale).
            if any(c.run.progress for c in todo):
                todo = prepare_configs(todo, threads=None)
            result = run_sweep(todo, runner,
                               retry_failed=retry_failed, on_progress=on_progress,
                               summary_extra={"experiments": list(per_experiment),
                                              "scale": scale})
        finally:
            torch.set_num_threads(threads)  # the inline executor sets 1 thread
        outcomes.update({o["run_id"]: o for o in result.outcomes})
    wall = time.perf_counter() - started
    name_of_dataset = scale_dataset(scale, dataset)
    return {e.name: summarise_experiment(e, per_experiment[e.name], scale=scale,
                                         dataset=name_of_dataset, out_dir=out_dir,
                                         outcomes=outcomes, wall_seconds=wall)
            for e in experiments}


def run_experiment(name: str, *, scale: str, out_dir: str | Path, dataset: str | None = None,
                   data_dir: str | None = None, workers: int | None = None,
                   executor: str = "local", on_progress: Callable[..., None] | None = None,
                   retry_failed: bool = False, device: str | None = None,
                   precision: str | None = None, train: bool = True) -> dict[str, Any]:
    """Build, train (what is missing), summarise and write one experiment.

    ``scale``: smoke, cpu or paper; ``dataset``/``data_dir``: override the scale's dataset;
    ``workers``: worker processes of the local executor, one torch thread each (default:
    the number of cores; 0 — and, by default, smoke scale — trains in this process);
    ``executor``: ``local``, ``inline`` or ``ray``; ``device``, ``precision``, ``train``: see
    :func:`run_experiments`. ``name="all"`` runs every experiment
    and returns ``{name: summary}``; otherwise the experiment's summary (its ``meta``
    says which runs were found, missing and trained now).
    """
    names = experiment_names() if name == "all" else [get_experiment(name).name]
    summaries = run_experiments(names, scale=scale, out_dir=out_dir, dataset=dataset,
                                data_dir=data_dir, workers=workers, executor=executor,
                                on_progress=on_progress, retry_failed=retry_failed,
                                device=device, precision=precision, train=train)
    return summaries if name == "all" else summaries[name]


# --- Markdown helpers ---------------------------------------------------------------------
def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(value: Any, spec: str = ".3g") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return format(value, spec)


def epoch_text(value: int | None) -> str:
    return "never" if value is None else str(value)


__all__ = [
    "Experiment", "register", "get_experiment", "experiment_names", "run_experiment",
    "run_experiments", "protocol_verdict", "frozen_index", "frozen_acc_for", "final_acc",
    "headline_gamma", "recorded_statuses", "first_fired", "SCALES", "AUDIT_METHODS", "RULES",
]
