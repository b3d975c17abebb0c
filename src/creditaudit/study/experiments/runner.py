"""Running experiments: train what is missing through one sweep, then summarise each.

:func:`run_experiment` trains whatever is missing through :func:`creditaudit.sweep.run_sweep`
(finished runs are skipped, failing runs are recorded and the rest go on), loads the
records and writes ``OUT/experiments/NAME.SCALE.DATASET.json`` and ``.md``;
:func:`find_summary` reads them back (and the older ``NAME.json`` / ``NAME.DATASET.json``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch

from creditaudit.config import RunConfig, device_overrides
from creditaudit.errors import (
    ConfigError,
    CreditAuditError,
    NewerRecordError,
    OutputError,
    RunRecordError,
)
from creditaudit.files import strict_json
from creditaudit.files.safe_files import atomic_write_files, json_bytes, read_text
from creditaudit.records import (
    FINISHED,
    RECORD_FILE,
    RunRecord,
    load_record_cached,
)
from creditaudit.records.claim_files import claim_state, holder_name
from creditaudit.run.plan import RunPlan
from creditaudit.run.resume import other_runs_record
from creditaudit.study.experiments.aggregate import aggregate
from creditaudit.study.experiments.arguments import (  # noqa: F401 — importable from here
    EXECUTORS,
    check_choices,
    check_data_dir,
    check_executor,
    check_training_options,
)
from creditaudit.study.experiments.configs import scale_dataset
from creditaudit.study.experiments.execution import execution_counts
from creditaudit.study.experiments.options import (
    SUMMARISE_AGAIN,
)
from creditaudit.study.experiments.registry import (
    NO_CHOICES,
    Choices,
    Experiment,
    all_names,
    get_experiment,
)
from creditaudit.study.experiments.scales import get_scale
from creditaudit.sweep import dedupe, unique_plans
from creditaudit.sweep.distinct import run_key
from creditaudit.sweep.outcome import FOREIGN, NEWER, left_alone

EXPERIMENTS_DIR = "experiments"
# What names an experiment's run that cannot be planned (those of them that vary between
# its runs, e.g. "run name=frozen seed=42"), rather than its place in a list the user
# never saw.
RUN_KEYS = ("model.arch", "data.name", "method.name", "method.penalty",
            "method.trainable_blocks", "run.seed")


# The training precision of runs whose summaries carry no precision in their file name.
DEFAULT_PRECISION = RunConfig().run.precision


def other_dtype() -> str | None:
    """Torch's default dtype when it is not float32 (``"float64"``: a Python caller's, in
    which its runs are made — other runs, under other ids), else None."""
    dtype = str(torch.get_default_dtype()).removeprefix("torch.")
    return None if dtype == "float32" else dtype


def summary_stem(name: str, scale: str, dataset: str, choices: Choices = NO_CHOICES,
                 precision: str | None = None) -> str:
    """File stem of an experiment's summary in OUT/experiments/: ``NAME.SCALE.DATASET``
    (``.rules=…`` and ``.arch=…`` appended for lists a user chose, then the precision when
    it is not the default fp32: ``.bf16``, whose runs are other runs, then torch's default
    dtype when it is not float32: ``.float64``), so every scale, dataset, choice, precision
    and dtype of one experiment can share a results folder."""
    stem = f"{name}.{get_scale(scale).name}.{dataset}"
    stem = f"{stem}.{choices.tag()}" if choices.tag() else stem
    stem = stem if precision in (None, DEFAULT_PRECISION) else f"{stem}.{precision}"
    return stem if other_dtype() is None else f"{stem}.{other_dtype()}"


def legacy_summary_stem(name: str, scale: str, dataset: str) -> str:
    """The stem older versions wrote: ``NAME`` for the scale's own dataset, ``NAME.DATASET``
    for another. It does not name the scale (smoke's and cpu's own summaries were both
    ``NAME``), so :func:`find_summary` reads such a file only when its ``meta`` says which."""
    return name if dataset == get_scale(scale).dataset else f"{name}.{dataset}"


def find_summary(out_dir: str | Path, name: str, scale: str, dataset: str,
                 choices: Choices = NO_CHOICES, precision: str | None = None) -> Path | None:
    """The JSON summary of experiment ``name`` at ``scale`` on ``dataset`` (with the lists
    ``choices`` names, of runs at ``precision``) in ``out_dir/experiments`` (its Markdown
    twin has the same stem), or None: the current file name first, else the older one if
    its ``meta`` names this scale and dataset."""
    folder = Path(out_dir) / EXPERIMENTS_DIR
    current = folder / f"{summary_stem(name, scale, dataset, choices, precision)}.json"
    if current.is_file():
        return current
    if choices.tag() or precision not in (None, DEFAULT_PRECISION) or other_dtype():
        return None  # older versions took no --rules/--arch and named no precision or dtype
    legacy = folder / f"{legacy_summary_stem(name, scale, dataset)}.json"
    if not legacy.is_file():
        return None
    try:  # a regular file only, boundedly (a named pipe, /dev/zero: refused unread)
        summary = strict_json.loads(read_text(legacy, "experiment summary", ConfigError))
    except (ConfigError, ValueError, RecursionError):
        return None  # unreadable: not evidence of this scale's summary
    meta = summary.get("meta") if isinstance(summary, dict) else None
    if not isinstance(meta, dict):  # valid JSON of another shape: no summary of ours
        return None
    return legacy if (meta.get("scale"), meta.get("dataset")) == (scale, dataset) else None


def _executor(kind: str, scale: str, workers: int | None, device: str | None = None) -> Any:
    """The executor of ``kind`` (checked by :func:`check_executor`) for ``workers``."""
    from creditaudit.sweep import InlineExecutor, LocalExecutor, RayExecutor

    check_executor(kind, workers)
    if kind == "ray":
        # A CUDA run reserves a GPU, so Ray places it on a GPU node (and the resource
        # check refuses a cluster without one) instead of failing on a CPU node.
        return RayExecutor(num_cpus_per_run=1, num_gpus_per_run=1.0 if device == "cuda" else 0.0)
    if kind == "inline" or workers == 0 or (scale == "smoke" and workers is None):
        return InlineExecutor(threads=1)
    return LocalExecutor(workers=workers, threads_per_worker=1)


def run_state(plan: RunPlan) -> tuple[str | None, RunRecord | None, str | None]:
    """(status, record, error) of a run (its plan) on disk; status None when it has no
    record, "newer" (with the reason) when a newer creditaudit wrote it — left alone, for that
    version —, "corrupt" (with the reason) when its record cannot be read, and
    :data:`FOREIGN` (with the reason) when its folder holds the record of another run (a
    folder copied or renamed by hand): its numbers are not this run's."""
    path = plan.run_dir / RECORD_FILE
    if not path.exists():
        return None, None, None
    try:
        record = load_record_cached(path)
    except NewerRecordError as err:
        return NEWER, None, str(err)
    except RunRecordError as err:  # the fact: the experiment's sweep resumes or restarts it
        return "corrupt", None, err.fact
    except (CreditAuditError, OSError) as err:
        return "corrupt", None, str(err)
    foreign = other_runs_record(record, plan.run_id, path)
    if foreign is not None:  # neither summarised as this run nor replaced; listed as missing
        return FOREIGN, None, f"{foreign}: move it away and run the experiment again"
    return record.status, record, record.error


def _not_on_disk(outcome: dict[str, Any] | None) -> tuple[str, str | None]:
    """(status, why) of a run without a record: what this invocation's sweep did with it
    (``refused`` — its folder could not be claimed —, ``busy``, ``interrupted``, with the
    reason the sweep gave) or ``not started``."""
    if outcome is None or outcome.get("action") in (None, "skipped"):
        return "not started", None
    action = outcome["action"]
    why = outcome.get("error")
    if why is None and outcome.get("holder"):
        why = f"another process holds it: {holder_name(outcome['holder'])}"
    return action, why


# The states of a run another process may be training now (a failed one: with
# --retry-failed), as the record or this invocation's sweep left them.
UNFINISHED = ("not started", "running", "interrupted", "failed")


def _claimed(run_dir: Path, status: str) -> tuple[str, str] | None:
    """What the claim in ``run_dir`` says of an unfinished run this invocation did not
    train (``--no-train``, or a run its sweep never reached) whose status is ``status``
    (one of :data:`UNFINISHED`; ``not started``: no record): ``("busy", who)``
    while a live process holds it — it is training now, elsewhere —, ``("interrupted",
    why)`` for a ``running`` record whose holder is gone (killed) or silent — the next
    experiment resumes it —; None where the claim tells nothing (none, or a dead holder of
    a run without a record: still not started)."""
    claim = claim_state(run_dir)
    if claim is None:
        return None
    if claim.stale is None:
        return "busy", f"another process holds it: {claim.who}"
    if status != "running":
        return None
    return "interrupted", (f"its process stopped ({claim.why_not_held()}): run the "
                           "experiment again to resume it")


def _load(plans: Sequence[RunPlan], outcomes: dict[str, dict[str, Any]] | None = None
          ) -> tuple[list[RunRecord], list[dict[str, Any]]]:
    """(finished records, missing runs) of the runs of ``plans``; a missing run without a
    record says what ``outcomes`` (this invocation's sweep, by run id) did with it, and one
    this invocation did not train what its claim says (:func:`_claimed`)."""
    records, missing = [], []
    for plan in plans:
        status, record, error = run_state(plan)
        if record is not None and record.is_finished:
            records.append(record)
            continue
        if status is None:
            status, error = _not_on_disk((outcomes or {}).get(plan.run_id))
        if status in UNFINISHED:
            status, error = _claimed(plan.run_dir, status) or (status, error)
        missing.append({"run_id": plan.run_id, "status": status, "error": error})
    return records, missing


def _epoch_seconds(records: Sequence[RunRecord]) -> dict[str, Any]:
    """Wall time of trained epochs in the records (for runtime estimates)."""
    seconds = [e.seconds for r in records for e in r.log
               if e.epoch >= 1 and e.seconds is not None]
    return {"epochs": len(seconds), "total": sum(seconds), "per_epoch": aggregate(seconds)}


def summarise_experiment(experiment: Experiment, plans: Sequence[RunPlan], *,
                         scale: str, dataset: str, out_dir: Path,
                         outcomes: dict[str, dict[str, Any]] | None = None,
                         wall_seconds: float | None = None,
                         choices: Choices = NO_CHOICES,
                         precision: str | None = None) -> dict[str, Any]:
    """Load the records of the runs of ``plans``, summarise, write
    ``OUT/experiments/NAME.SCALE.DATASET.{json,md}`` (:func:`summary_stem`; ``precision``:
    the runs' training precision, None for the default)."""
    records, missing = _load(plans, outcomes)
    summary = experiment.summarise(records, choices)
    ids = [plan.run_id for plan in plans]
    summary["meta"] = {
        "experiment": experiment.name, "question": experiment.question,
        "scale": scale, "dataset": dataset, "out_dir": str(out_dir),
        "choices": choices.to_dict(), "precision": precision or DEFAULT_PRECISION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "runs_needed": len(plans), "runs_found": len(records),
        "run_ids": ids, "missing": missing,
        "execution": {**execution_counts(outcomes or {}, ids), "wall_seconds": wall_seconds},
        "epoch_seconds": _epoch_seconds(records),
    }
    if other_dtype() is not None:  # the runs' features and parameters
        summary["meta"]["dtype"] = other_dtype()
    folder = out_dir / EXPERIMENTS_DIR
    stem = summary_stem(experiment.name, scale, dataset, choices, precision)
    summary["meta"]["files"] = [str(folder / f"{stem}.json"), str(folder / f"{stem}.md")]
    # One pair: both rendered and staged before either replaces its old file (a write that
    # fails leaves both old, never a new .json beside an old .md).
    atomic_write_files({folder / f"{stem}.md": experiment.to_markdown(summary).encode(),
                        folder / f"{stem}.json": json_bytes(summary)})
    return summary


def run_experiments(names: Sequence[str], *, scale: str, out_dir: str | Path,
                    dataset: str | None = None, data_dir: str | None = None,
                    workers: int | None = None, executor: str = "local",
                    on_progress: Callable[..., None] | None = None,
                    retry_failed: bool = False, device: str | None = None,
                    precision: str | None = None, train: bool = True,
                    choices: Choices = NO_CHOICES,
                    watch: Callable[[list[RunPlan]], AbstractContextManager[Any]] | None = None
                    ) -> dict[str, dict[str, Any]]:
    """Train the runs of several experiments in one sweep, then summarise each.

    Runs shared between experiments train once; ``train=False`` only summarises the runs
    already finished (the others are listed as missing). ``device`` (auto/cpu/cuda; not part
    of the run id, so a run trained on either counts) and ``precision`` (fp32/bf16; part of
    the run id) override every run's config. ``choices``: rules and architectures instead of
    the experiment's own (one experiment only; each refuses what it has no axis for).
    ``watch(plans)``: a context manager held while ``plans`` (the runs to train) train — the
    command line's per-epoch progress, read from their records. Returns ``{name: summary}``.
    """
    from creditaudit.sweep import plan_runs, prepare_configs, run_sweep

    get_scale(scale)
    check_executor(executor, workers)  # also when every run is finished already
    check_training_options(train, retry_failed=retry_failed, workers=workers,
                           executor=executor, device=device)
    check_data_dir(scale, dataset, data_dir)
    experiments = [get_experiment(name) for name in names]
    check_choices(choices, len(experiments))
    out_dir = Path(out_dir).resolve()
    overrides = device_overrides(device, precision)
    per_experiment = {e.name: [c.replace(**overrides) if overrides else c
                               for c in e.configs(scale, dataset=dataset, data_dir=data_dir,
                                                  out_dir=out_dir, choices=choices)]
                      for e in experiments}
    # Every run planned once, before any trains; experiments that share a run share its plan.
    everything = dedupe([c for configs in per_experiment.values() for c in configs])
    if any(c.run.progress for c in everything):  # a worker's progress bars (paper scale)
        everything = prepare_configs(everything, threads=None)
    planned = dict(zip(map(run_key, everything), plan_runs(everything, RUN_KEYS)))
    per_plans = {name: [planned[run_key(c)] for c in configs]
                 for name, configs in per_experiment.items()}
    outcomes: dict[str, dict[str, Any]] = {}
    todo = []
    for plan in unique_plans(list(planned.values())):
        status, _, error = run_state(plan)
        # a newer version's run, or another run's record in its folder, is never replaced
        # (refused), a finished one skipped
        if status in (NEWER, FOREIGN) or status in FINISHED or (
                status == "failed" and not retry_failed):
            outcomes[plan.run_id] = {"run_id": plan.run_id, "status": status,
                                     "action": left_alone(status), "error": error}
        else:
            todo.append(plan)
    started = time.perf_counter()
    if todo and train:  # finished runs never reach the sweep (it would reload every record)
        runner = _executor(executor, scale, workers, device)
        threads = torch.get_num_threads()
        try:
            with watch(todo) if watch is not None else nullcontext():
                result = run_sweep(todo, runner,
                                   retry_failed=retry_failed, on_progress=on_progress,
                                   summary_extra={"experiments": list(per_experiment),
                                                  "scale": scale},
                                   written_by=_written_by(per_plans))
        finally:
            torch.set_num_threads(threads)  # the inline executor sets 1 thread
        outcomes.update({o["run_id"]: o for o in result.outcomes})
    wall = time.perf_counter() - started
    name_of_dataset = scale_dataset(scale, dataset)
    summaries, unwritten = {}, []
    for e in experiments:  # a summary that cannot be written stops no other's
        try:
            summaries[e.name] = summarise_experiment(
                e, per_plans[e.name], scale=scale, dataset=name_of_dataset, out_dir=out_dir,
                outcomes=outcomes, wall_seconds=wall, choices=choices, precision=precision)
        except OutputError as err:
            unwritten.append(f"the summary of {e.name}: {err}")
    if unwritten:
        written = f" ({len(summaries)} other summaries were written)" if summaries else ""
        raise OutputError("; ".join(unwritten) + written + ": the runs are kept; free the "
                          f"files and {SUMMARISE_AGAIN} to summarise them")
    return summaries


def _written_by(per_plans: dict[str, list[Any]]) -> dict[str, str]:
    """Run id → ``experiment NAME`` (``experiments A, B`` for a run they share): what the
    sweep summary names as having written its entry."""
    names: dict[str, list[str]] = {}
    for name, plans in per_plans.items():
        for plan in plans:
            names.setdefault(plan.run_id, [])
            if name not in names[plan.run_id]:
                names[plan.run_id].append(name)
    return {run_id: ("experiment " if len(these) == 1 else "experiments ") + ", ".join(these)
            for run_id, these in names.items()}


def run_experiment(name: str, *, scale: str, out_dir: str | Path, dataset: str | None = None,
                   data_dir: str | None = None, workers: int | None = None,
                   executor: str = "local", on_progress: Callable[..., None] | None = None,
                   retry_failed: bool = False, device: str | None = None,
                   precision: str | None = None, train: bool = True,
                   choices: Choices = NO_CHOICES) -> dict[str, Any]:
    """Build, train (what is missing), summarise and write one experiment.

    ``scale``: smoke, cpu or paper; ``dataset``/``data_dir``: override the scale's dataset;
    ``workers``: worker processes of the local executor, one torch thread each (default:
    the number of cores; 0 — and, by default, smoke scale — trains in this process);
    ``executor``: ``local``, ``inline`` or ``ray``; ``device``, ``precision``, ``train``,
    ``choices``: see :func:`run_experiments`. ``name="all"`` runs every experiment
    and returns ``{name: summary}``; otherwise the experiment's summary (its ``meta``
    says which runs were found, missing and trained now).
    """
    names = all_names() if name == "all" else [get_experiment(name).name]
    summaries = run_experiments(names, scale=scale, out_dir=out_dir, dataset=dataset,
                                data_dir=data_dir, workers=workers, executor=executor,
                                on_progress=on_progress, retry_failed=retry_failed,
                                device=device, precision=precision, train=train,
                                choices=choices)
    return summaries if name == "all" else summaries[name]
