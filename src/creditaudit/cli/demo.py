"""``creditaudit demo``: BP, FA, DFA and the frozen baseline on MNIST-1D (or the synthetic task)."""

from __future__ import annotations

import argparse
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from creditaudit.cli.common import (
    FlagsGiven,
    add_device_options,
    env_overrides,
    folder,
    in_flags,
    whole_number,
)
from creditaudit.cli.run_watch import RunWatch
from creditaudit.cli.sweep_output import as_reported
from creditaudit.config import MAX_SEED, RunConfig, apply_where_read, device_overrides
from creditaudit.errors import ConfigError, CreditAuditError
from creditaudit.formatting import duration
from creditaudit.report import format_run_summary

if TYPE_CHECKING:
    from creditaudit.config import DataConfig
    from creditaudit.records import RunRecord

DEMO_METHODS = ("bp", "fa", "dfa", "frozen")
# The demo's wall time as measured (docs/benchmarks.md, "Sweeps and the demo": the demo of
# benchmarks/docs_set.sh from an empty data cache on 2 idle cores; bench_demo.py breaks it
# down per run). README and --help quote this one figure.
MEASURED_SECONDS = 50


@dataclass(frozen=True)
class DemoTask:
    """A demo dataset and its default size (chosen so the four runs fit on two cores).
    ``n_train_step``: ``--n-train`` must be a multiple of it (the demo has no flag for the
    test split, ``n_test``, which is one already)."""

    label: str
    epochs: int
    n_train: int
    n_test: int
    n_train_step: int = 1


DEMO_TASKS = {
    # MNIST-1D generates equally many samples of each of its 10 digits
    "mnist1d": DemoTask("MNIST-1D", epochs=8, n_train=32000, n_test=4000, n_train_step=10),
    "synthetic": DemoTask("synthetic teacher–student task", epochs=8, n_train=20000,
                          n_test=2000),
}


def demo_config(method: str, *, epochs: int, n_train: int, out_dir: str, seed: int,
                dataset: str = "mnist1d", n_test: int | None = None,
                device: str | None = None, precision: str | None = None,
                end_of_run: bool = False) -> RunConfig:
    """The demo's run: a d=256 L=4 terminal-LN ResidualMLP on ``dataset``. The end-of-run
    credit-quality block (ρ, nudging, null) is off unless ``end_of_run``: the summary does
    not show it, and `creditaudit audit` computes it from the checkpoint."""
    n_test = DEMO_TASKS[dataset].n_test if n_test is None else n_test
    overrides = {"data.name": dataset, "method.name": method, "optim.epochs": epochs,
                 "data.n_train": n_train, "data.n_test": n_test, "run.out_dir": out_dir,
                 "run.seed": seed, "run.progress": False,
                 "diagnostics.end_of_run": end_of_run}
    overrides.update(device_overrides(device, precision))
    return RunConfig().replace(**overrides)


# The demo's flags that have a default value (the others: None, not given).
DEFAULTS: dict[str, Any] = {"dataset": "mnist1d", "seed": 42}


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "demo", help=f"BP, FA, DFA and frozen blocks on MNIST-1D ({MEASURED_SECONDS} s on 2 "
                     "idle cores)",
        description="Train BP, FA, DFA and the frozen-blocks baseline on MNIST-1D (a "
                    "generated 1-D digit task; no download) or the teacher–student task "
                    "(d=256, L=4 ResidualMLP with terminal LN), then print accuracy, ‖h_L‖, "
                    "‖g_L‖, deep cosine and the protocol verdict per method, and each "
                    "method's margin over frozen blocks (diagnostic (d)).")
    parser.add_argument("--out", default="runs/demo", type=folder,
                        help="results folder (default runs/demo)")
    parser.add_argument("--dataset", choices=tuple(DEMO_TASKS), default=DEFAULTS["dataset"],
                        help="mnist1d (default) or synthetic (the teacher–student task)")
    parser.add_argument("--epochs", type=whole_number(0), default=None,
                        help="epochs per method (default 8)")
    parser.add_argument("--n-train", type=whole_number(1), default=None,
                        help="training samples (default 32000 for mnist1d, 20000 for "
                             "synthetic)")
    parser.add_argument("--seed", type=whole_number(0, MAX_SEED), default=DEFAULTS["seed"],
                        help="seed (default 42)")
    parser.add_argument("--workers", type=int, default=None,
                        help="parallel single-thread runs (default: the CPUs this process "
                             "may run on, at most 4); 0: one run after another in this "
                             "process, as in sweep")
    add_device_options(parser)
    parser.add_argument("--end-of-run", action="store_true",
                        help="also compute the end-of-run credit-quality metrics (ρ, nudging, "
                             "fresh-feedback null) of every run; `creditaudit audit` computes "
                             "them for one run at any time")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress lines; only the final table")
    parser.set_defaults(handler=run)


def depth_utility_lines(records: list[RunRecord]) -> list[str]:
    """Diagnostic (d) of every trained method: its margin over the frozen run; none for a
    run whose protocol was never evaluated after training (a run that diverged in its first
    epoch: its verdict in the table is "—", and its accuracy is the untrained network's) or
    whose (d) was not evaluated (``--epochs 0``: an untrained network). No lines at all,
    not even the heading, when no run has a margin: the table says (d) not evaluated."""
    from creditaudit.protocol import DepthUtility
    from creditaudit.protocol.records import RecordSet, is_frozen_baseline

    index = RecordSet(records)
    frozen = next((r for r in records if is_frozen_baseline(r)), None)
    if frozen is None or frozen.final_acc is None:
        return []
    d = DepthUtility
    lines = []
    for record in records:
        verdict = index.verdict(record)
        if is_frozen_baseline(record) or record.protocol.epoch is None \
                or verdict.margin_pp is None:
            continue
        lines.append(f"  {record.method:<12}{verdict.margin_pp:+7.1f} pp  "
                     f"{verdict.statuses[d.name]}")
    if not lines:
        return []
    return [f"{d.id_label()} {d.label}: margin over frozen blocks (test acc "
            f"{frozen.final_acc:.3f}); fires below {d().limit():g} pp", *lines]


def check_sample_counts(args: argparse.Namespace, data: DataConfig,
                        overrides: dict[str, Any]) -> None:
    """``--n-train`` refused in the demo's own words, before the plan would name
    ``data.n_test`` (no flag of the demo's): not a multiple of its dataset's step, or more
    samples than this machine's memory holds. Left to the plan when ``CREDITAUDIT_SET``
    changes the data (its words are then the user's)."""
    from creditaudit.data import dataset_spec
    from creditaudit.run.memory import check_data_fits

    if data.name != args.dataset or {"data.n_train", "data.n_test"} & overrides.keys():
        return
    task = DEMO_TASKS[args.dataset]
    if data.n_train % task.n_train_step:
        nearest = max(task.n_train_step, data.n_train - data.n_train % task.n_train_step)
        raise ConfigError(f"--n-train {data.n_train} is not a multiple of "
                          f"{task.n_train_step}: {task.label} generates equally many samples "
                          f"of each class; use e.g. --n-train {nearest}")
    spec = dataset_spec(data.name)(data)
    check_data_fits(task.label, spec.sizes(), spec.input_shape(),
                    fix=f"use a smaller --n-train (the demo also tests on {data.n_test:,})")


# (flag, the argparse attribute, the config key it sets) of the demo's flags that set one.
DEMO_FLAGS = (("--dataset", "dataset", "data.name"), ("--epochs", "epochs", "optim.epochs"),
              ("--n-train", "n_train", "data.n_train"), ("--seed", "seed", "run.seed"),
              ("--device", "device", "run.device"), ("--precision", "precision",
                                                     "run.precision"))


def demo_flags(args: argparse.Namespace) -> FlagsGiven:
    """The config keys the demo's flags given set (a flag at its default is not given),
    with their values and spelling (``"run.seed": (7, "--seed 7")``), by which a refusal of
    its planning names them."""
    return {key: (value, f"{flag} {value}") for flag, attr, key in DEMO_FLAGS
            if (value := getattr(args, attr, None)) not in (None, DEFAULTS.get(attr))}


def demo_executor(workers: int | None, n_runs: int) -> Any:
    """The executor of ``--workers``: ``workers`` single-thread worker processes (default:
    one per CPU this process may use, at most one per run); 0 runs them one after another
    in this process, one thread each, as ``sweep --workers 0`` does."""
    from creditaudit.sweep import InlineExecutor, LocalExecutor
    from creditaudit.sweep.executors import default_workers

    if workers is not None and workers < 0:
        raise ConfigError(f"--workers must be >= 0 (0 = one run after another in this "
                          f"process), got {workers}")
    if workers == 0:
        return InlineExecutor(threads=1)
    return LocalExecutor(workers=workers or min(n_runs, default_workers()))


def start_lines(plans: list[Any], executor: Any, out: str, data_label: str) -> list[str]:
    """What the demo is about to do with its ``plans``: the runs an earlier demo in ``out``
    finished, which it reuses as they are; those another process trains now, which it
    waits for; and the runs it trains (and which of them resume from a checkpoint)."""
    from creditaudit.sweep import run_states

    rows = run_states(plans, retry_failed=True)
    names = [plan.config.method.name for plan in plans]
    reused = [n for n, row in zip(names, rows) if row["status"] in ("completed", "diverged")
              and not row["todo"]]
    held = [n for n, row in zip(names, rows) if row["todo"] and row["holder"] is not None]
    trained = [n + (" (resumes)" if row["status"] in ("running", "interrupted") else "")
               for n, row in zip(names, rows) if row["todo"] and row["holder"] is None]
    lines = []
    if reused:
        lines.append(f"{', '.join(reused)} finished earlier in {out}: reused, not retrained"
                     + ("" if trained or held else " (nothing to train)"))
    if held:
        lines.append(f"{', '.join(held)}: another process is training "
                     f"{'it' if len(held) == 1 else 'them'} in {out}; waiting for "
                     f"{'it' if len(held) == 1 else 'them'}")
    if trained:
        how = (f"{executor.slots} parallel runs" if executor.name == "local"
               else "one after another in this process")
        epochs = plans[0].config.optim.epochs
        lines.append(f"training {', '.join(trained)} ({epochs} epoch"
                     f"{'s' if epochs != 1 else ''} each, {how}) on {data_label} …")
    return lines


def run(args: argparse.Namespace) -> int:
    from creditaudit.data.spec import MAX_DATA_SEED
    from creditaudit.records import RECORD_FILE, load_record
    from creditaudit.sweep import plan_runs, run_sweep, unique_plans

    started = time.perf_counter()
    task = DEMO_TASKS[args.dataset]
    executor = demo_executor(args.workers, len(DEMO_METHODS))
    epochs = task.epochs if args.epochs is None else args.epochs
    n_train = task.n_train if args.n_train is None else args.n_train
    configs = [demo_config(method, dataset=args.dataset, epochs=epochs, n_train=n_train,
                           out_dir=args.out, seed=args.seed, device=args.device,
                           precision=args.precision, end_of_run=args.end_of_run)
               for method in DEMO_METHODS]
    shrink = env_overrides()
    if shrink:
        configs = [apply_where_read(config, shrink) for config in configs]
    data = configs[0].data
    # where the records go: --out, or run.out_dir when CREDITAUDIT_SET gives it
    out = Path(configs[0].run.out_dir)
    check_sample_counts(args, data, shrink)
    if data.name == "mnist1d" and data.data_seed is None and args.seed > MAX_DATA_SEED:
        # the plan's advice (--set data.data_seed=0) is no flag of the demo's
        raise ConfigError(f"--seed {args.seed} is also the seed MNIST-1D draws its data from, "
                          f"a 32-bit seed: use --seed 0 … {MAX_DATA_SEED}, or --dataset "
                          "synthetic")
    from creditaudit.files.safe_files import ensure_folder
    from creditaudit.run.setup import resolve_device

    try:  # planning's refusals name config keys: say the demo's flags instead
        resolve_device(configs[0].run.device)  # a missing GPU or a file in the way: one
        ensure_folder(out)                     # line, before any data is generated
        # Every run planned before any trains; one per run id (CREDITAUDIT_SET=method.name=bp
        # makes the four one run, trained and shown once).
        plans = unique_plans(plan_runs(configs, ("method.name",)))
    except CreditAuditError as err:
        err.args = (in_flags(str(err), demo_flags(args)), *err.args[1:])
        raise
    # Load (generate) the data once here, not in every worker: generated data are cached,
    # so the parallel runs read the cache.
    plan = plans[0]
    if plan.dataset.kind == "generated" and not args.quiet:
        print(f"preparing the {plan.dataset.label} data once (cached for the next runs) …",
              flush=True)
    plan.load_data()
    # One single-thread process per run: on two cores, two 1-thread runs beat one 2-thread.
    if not args.quiet:
        print("\n".join(start_lines(plans, executor, str(out), plan.dataset.label)),
              flush=True)

    # The progress lines' "elapsed" counts from here, as the RunWatch's lines do: from the
    # start of training, not of the command (whose total, data preparation included, the
    # last lines say).
    training_started = time.perf_counter()

    def progress(state, outcome) -> None:  # noqa: ANN001 - sweep callback
        if outcome is not None:
            print(f"  {outcome['run_id']}: {outcome['status']} ({state.ended}/{state.total}"
                  f", {duration(time.perf_counter() - training_started)} elapsed)",
                  flush=True)

    watch = None
    if not args.quiet:  # the workers say nothing until a run ends: read their records
        watch = RunWatch({run.config.method.name: run.run_dir / RECORD_FILE for run in plans},
                         plans[0].config.optim.epochs,
                         lambda line: print(line, flush=True)).start()
    try:
        # A failed run is tried again: the demo has no --retry-failed, and rerunning the
        # demo is how its user asks for that.
        result = run_sweep(plans, executor, retry_failed=True,
                           on_progress=None if args.quiet else progress)
    finally:
        if watch is not None:
            watch.stop()
    reported = {run["run_id"]: run["status"] for run in result.summary["runs"]}
    records = []
    for run in plans:
        if (run.run_dir / RECORD_FILE).exists():
            records.append(as_reported(load_record(run.run_dir), reported.get(run.run_id)))
    if not args.quiet:
        print()
    print(format_run_summary(records))
    utility = depth_utility_lines(records)
    if utility:
        print()
        print("\n".join(utility))
    failed = [o for o in result.outcomes if o["status"] not in ("completed", "diverged")]
    for outcome in failed:
        error = outcome.get("error")
        print(f"{outcome['run_id']} {outcome['status']}" + (f": {error}" if error else ""))
    if any(outcome["status"] == "interrupted" for outcome in failed):
        print("interrupted runs resume from their last finished epoch: run the same demo "
              "command again")
    print(f"\nrecords: {out}/<run id>/record.json  "
          f"({time.perf_counter() - started:.0f} s)")
    pick = audit_pick(records)
    if pick is not None:
        print(f"audit the {pick.method} run from its checkpoint ((d) uses the frozen run "
              f"beside it):\n  creditaudit audit {shell_word(out / pick.run_id)}")
    return 1 if failed else 0


def shell_word(path: Path) -> str:
    """``path`` as one word of a shell command that reads it as a path: quoted where it
    needs to be, and ``./``-prefixed where it would read as an option (``--out=-o``)."""
    text = str(path)
    return shlex.quote(f"./{text}" if text.startswith("-") else text)


def audit_pick(records: list[RunRecord]) -> RunRecord | None:
    """The run the demo suggests auditing: DFA's (its audit has the most to say), else the
    first finished trained method's; None when none finished. A run whose protocol never
    ran after training (diverged in its first epoch: its checkpoint is the untrained
    network) is no such run."""
    from creditaudit.protocol.records import is_frozen_baseline

    trained = [r for r in records if r.is_finished and not is_frozen_baseline(r)
               and r.protocol.epoch is not None]
    return next((r for r in trained if r.method == "dfa"), trained[0] if trained else None)
