"""``creditaudit experiment``: run a shipped experiment and write its summary."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

from creditaudit.cli import interrupted_exit_code
from creditaudit.cli.common import (
    ENV_OVERRIDES,
    add_device_options,
    device_flags,
    folder,
    refusals_in_flags,
    refuse_together,
)
from creditaudit.errors import ConfigError, CreditAuditError
from creditaudit.formatting import counted, duration

SCALE_HELP = ("smoke: seconds, tiny synthetic runs (tests); cpu: sized for a 2-core machine "
              "(Fashion-MNIST, 20 epochs, 3 seeds: hours); paper: the published CIFAR-10 "
              "configuration (100 epochs, 3 seeds; needs --data-dir and a GPU)")


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "experiment", help="run a shipped experiment (audit table, λ sweep, …)",
        description="Build an experiment's runs at a scale, train the ones not finished yet "
                    "(finished runs — also those of other experiments or sweeps with the same "
                    "settings — are reused), and write OUT/experiments/NAME.SCALE.DATASET.json "
                    "and .md. "
                    "See docs/experiments.md.")
    parser.add_argument("name", metavar="NAME", nargs="?",
                        help="experiment name, or 'all' (see --list)")
    parser.add_argument("--scale", choices=("smoke", "cpu", "paper"), default=None,
                        help=SCALE_HELP)
    parser.add_argument("--dataset", default=None, metavar="NAME",
                        help="dataset instead of the scale's default (synthetic, "
                             "fashion-mnist, cifar10); mnist1d is generated (no data folder)")
    parser.add_argument("--rules", default=None, metavar="A,B",
                        help="credit rules instead of the experiment's own (any installed "
                             "rule, plugins included); one experiment only, and only one "
                             "with a rule list (see --list)")
    parser.add_argument("--arch", default=None, metavar="X[,Y]",
                        help="architecture(s) instead of the experiment's own: an installed "
                             "architecture, or NAME-noLN without its terminal LayerNorm "
                             "(several only where the experiment compares architectures; "
                             "see --list)")
    parser.add_argument("--data-dir", default=None, metavar="DIR",
                        help="dataset folder (CIFAR python batches or IDX files); "
                             "Fashion-MNIST defaults to /usr/share/datasets/fashion-mnist; "
                             "refused for a generated dataset (synthetic, mnist1d)")
    parser.add_argument("--out", default="results", metavar="DIR", type=folder,
                        help="results folder: runs in OUT/RUN_ID/, summaries in "
                             "OUT/experiments/ (default: results)")
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="local executor: worker processes, one torch thread each "
                             "(default: the CPUs this process may run on; 0 = train in this "
                             "process; smoke scale trains in this process unless N is given)")
    parser.add_argument("--executor", choices=("local", "inline", "ray"), default="local",
                        help="local worker processes (default), inline (this process) or one "
                             "Ray task per run")
    parser.add_argument("--retry-failed", action="store_true",
                        help="train runs that failed before again (default: skip them)")
    add_device_options(parser)
    parser.add_argument("--no-train", action="store_true",
                        help="train nothing: summarise the runs already finished in --out "
                             "(missing ones are listed); not with --retry-failed, --workers, "
                             "--executor or --device, which only say how to train")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress lines while runs train (summaries, errors and "
                             "waits for runs another process holds are still printed)")
    parser.add_argument("--list", action="store_true",
                        help="list the experiments (with NAME: that one) and what each "
                             "answers (with --scale: how many runs each needs and how many are "
                             "finished in --out, counted with --dataset, --data-dir, "
                             "--precision, --rules and --arch, which need --scale here); not "
                             "with --retry-failed, --workers, --executor or --device")
    refuse_together(parser, "--no-train", TRAINING_FLAGS)
    refuse_together(parser, "--list", TRAINING_FLAGS)
    refuse_together(parser, "--list", COUNTED_FLAGS, unless="--scale")
    parser.set_defaults(handler=run)


# Flags that only say how to train (the device is no part of a run's id): nothing is trained
# with --no-train or --list.
TRAINING_FLAGS = ("--retry-failed", "--workers", "--executor", "--device")
# Flags that shape the runs: --list applies them to the counts of --scale (none without it).
COUNTED_FLAGS = ("--dataset", "--data-dir", "--out", "--precision", "--rules", "--arch")


def names_list(text: str | None, option: str) -> tuple[str, ...] | None:
    """``"dfa, kp"`` → ``("dfa", "kp")``; None when the option was not given."""
    if text is None:
        return None
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise ConfigError(f"--{option} names nothing: give one or more names separated by "
                          "commas")
    return names


def choices_of(args: argparse.Namespace):  # noqa: ANN201 - a Choices
    from creditaudit.study.experiments import Choices

    return Choices(rules=names_list(args.rules, "rules"), archs=names_list(args.arch, "arch"))


def check_data_dir(args: argparse.Namespace) -> None:
    """Refuse --data-dir for a generated dataset (the scale's or --dataset's), which reads no
    folder — the experiment ignored it; train refuses it the same way."""
    if args.scale is None:
        return
    from creditaudit.study.experiments.runner import check_data_dir as refuse_data_dir

    refuse_data_dir(args.scale, args.dataset, args.data_dir)


def _list(args: argparse.Namespace) -> int:
    from creditaudit.study.experiments import experiment_names, get_experiment
    from creditaudit.study.experiments.registry import OPTIONS
    from creditaudit.study.experiments.runner import check_choices

    # NAME with --list: that experiment only (an unknown name is refused, not ignored)
    names = experiment_names() if args.name in (None, "all") else [args.name]
    choices = choices_of(args)
    check_data_dir(args)
    if args.scale:  # counted as the run would be: one experiment only, refused as it refuses
        check_choices(choices, len(names))
    for name in names:
        experiment = get_experiment(name)
        alone = "" if experiment.in_all else " (run by name only: not part of all)"
        print(f"{name}{alone}\n    {experiment.question}\n    runs: {experiment.needs}")
        takes = [f"--{option} replaces {what}" for option, what in experiment.takes.items()]
        takes += [f"no --{option}: {experiment.refuses.get(option, 'it has no such axis')}"
                  for option in OPTIONS if option not in experiment.takes]
        print(f"    {'; '.join(takes)}")
        if args.scale:
            print(f"    {args.scale}: {_count(experiment, args, choices)}")
    return 0


def _count(experiment, args: argparse.Namespace,  # noqa: ANN001 - an Experiment
           choices) -> str:  # noqa: ANN001 - a Choices
    """"N runs, M finished in OUT" of the runs ``args`` asks for (``choices``: its --rules
    and --arch), as the experiment would train them (finished runs are found by run id,
    which needs the data's fingerprint: without the data, only the number of runs)."""
    from creditaudit.config import device_overrides
    from creditaudit.run.plan import plan_run
    from creditaudit.study.experiments.runner import run_state

    overrides = device_overrides(None, args.precision)  # the precision is in the id

    def configs(data_dir: str | None) -> list:
        found = experiment.configs(args.scale, dataset=args.dataset, data_dir=data_dir,
                                   out_dir=Path(args.out).resolve(), choices=choices)
        return [c.replace(**overrides) for c in found] if overrides else found

    try:
        found = configs(args.data_dir)  # None: the scale's default folder
        done = sum(run_state(plan_run(c))[0] in ("completed", "diverged") for c in found)
        return f"{counted(len(found), 'run')}, {done} finished in {args.out}"
    except CreditAuditError as err:  # no data here: count the runs without reading it
        try:
            count = len(configs(args.data_dir or "DATA_DIR"))
        except CreditAuditError as unplanned:  # no folder at all for some of its data
            return f"runs not counted: {unplanned}"
        return f"{count} runs (finished ones not counted: {err})"


class _LazyProgress:
    """The sweep's progress line, opened once the number of runs to train is known, and a
    line — also when quiet — when the experiment starts and stops waiting for a run another
    process holds (its sweep waits silently until the run is released)."""

    def __init__(self, quiet: bool = False) -> None:
        self.bar = None
        self.quiet = quiet
        self.waiting: set[str] = set()  # run ids held by other processes, waited for
        self.run_dirs: dict[str, Path] = {}  # of the runs to train (:meth:`watch`)

    def __call__(self, state, outcome) -> None:  # noqa: ANN001 — SweepState, outcome dict
        from creditaudit.cli.sweep_output import SweepProgress

        if self.bar is None:
            self.bar = SweepProgress(state.total, quiet=self.quiet)
        self.bar(state, outcome)
        self._waits(state, outcome)

    def _waits(self, state, outcome) -> None:  # noqa: ANN001 — SweepState, outcome dict
        """Say when a run turns busy (who holds it) and when the wait for it ends: its
        holder finished it (its outcome, skipped here) or let it go (the sweep gives it to
        a worker here again)."""
        from creditaudit.records.claim_files import holder_name

        if outcome is not None and outcome.get("status") == "busy":
            run_id = outcome["run_id"]
            if run_id not in self.waiting:
                self.waiting.add(run_id)
                self.tell(f"waiting for {run_id}: another process holds it: "
                          f"{holder_name(outcome.get('holder'))}")
            return
        if outcome is not None and outcome.get("run_id") in self.waiting:
            self.waiting.discard(outcome["run_id"])
            self.tell(f"stopped waiting for {outcome['run_id']}: its holder ended it "
                      f"({outcome.get('status')}); not trained here")
        given = {run_id for task in getattr(state, "tasks", None) or () for run_id in task}
        for run_id in sorted(self.waiting & given):  # handed to a worker here again
            if not self._held(run_id):  # released (those still held are handed on too)
                self.waiting.discard(run_id)
                self.tell(f"stopped waiting for {run_id}: its holder released it; "
                          "training it here")

    def _held(self, run_id: str) -> bool:
        """Whether a live process still holds the run's claim (False where unknown)."""
        from creditaudit.records.claim_files import claim_state

        run_dir = self.run_dirs.get(run_id)
        claim = None if run_dir is None else claim_state(run_dir)
        return claim is not None and claim.stale is None

    def tell(self, line: str) -> None:
        """A line on stderr even when quiet (above the bar on a terminal)."""
        bar = getattr(self.bar, "bar", None)
        if bar is not None:
            bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def say(self, line: str) -> None:
        """A line between the bar's updates (a RunWatch line); nothing when quiet."""
        if self.bar is not None:
            self.bar.say(line)
        elif not self.quiet:  # where the sweep's progress goes
            print(line, file=sys.stderr, flush=True)

    def watch(self, plans: list) -> contextlib.AbstractContextManager:
        """Per-epoch progress of the runs ``plans`` while they train (they say nothing
        until a run ends): a RunWatch line, labelled by run id, at least every few
        seconds."""
        from creditaudit.cli.sweep import watching

        self.run_dirs = {plan.run_id: plan.run_dir for plan in plans}
        return contextlib.nullcontext() if self.quiet else watching(plans, [], self.say)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run(args: argparse.Namespace) -> int:
    from creditaudit.study.experiments import all_names, get_experiment, run_experiments
    from creditaudit.study.experiments.execution import execution_text

    if args.list:
        return _list(args)
    if args.name is None:
        raise ConfigError("name an experiment (or 'all'); see creditaudit experiment --list")
    # the name before the scale: a misspelt one is told so, not to add a --scale first
    names = all_names() if args.name == "all" else [get_experiment(args.name).name]
    if args.scale is None:
        raise ConfigError("choose --scale smoke, cpu or paper")
    check_data_dir(args)
    if os.environ.get(ENV_OVERRIDES, "").strip() and not args.no_train:
        # train, sweep and demo shrink every run by it; an experiment's runs are its scale's
        print(f"creditaudit: warning: {ENV_OVERRIDES} is not applied to an experiment's runs, "
              f"which --scale sizes: these are --scale {args.scale} runs (--scale smoke: tiny "
              "ones)", file=sys.stderr)
    choices = choices_of(args)
    progress = _LazyProgress(quiet=args.quiet)
    started = time.perf_counter()
    try:
        with refusals_in_flags(device_flags(args)):  # --device cuda, not run.device='cuda'
            summaries = run_experiments(names, scale=args.scale, out_dir=args.out,
                                        dataset=args.dataset, data_dir=args.data_dir,
                                        workers=args.workers, executor=args.executor,
                                        on_progress=progress,
                                        retry_failed=args.retry_failed,
                                        device=args.device, precision=args.precision,
                                        train=not args.no_train, choices=choices,
                                        watch=progress.watch)
    except KeyboardInterrupt as interrupt:
        progress.close()
        print("creditaudit: experiment interrupted; finished epochs are checkpointed: run the "
              "same command again to resume", file=sys.stderr)
        return interrupted_exit_code(interrupt)
    finally:
        progress.close()
    missing: dict[str, dict] = {}  # run id → its entry: a run experiments share, named once
    for name, summary in summaries.items():
        meta = summary["meta"]
        json_file, md_file = meta["files"]
        print(get_experiment(name).to_markdown(summary))
        print(f"→ {json_file} and {Path(md_file).name} "
              f"({meta['runs_found']}/{meta['runs_needed']} runs, "
              f"{execution_text(meta['execution'])})\n")
        missing.update((entry["run_id"], entry) for entry in meta["missing"]
                       if entry["run_id"] not in missing)
    for entry in missing.values():
        print(f"missing: {entry['run_id']} ({entry['status']})"
              + (f": {entry['error']}" if entry["error"] else ""), file=sys.stderr)
    print(f"{counted(len(summaries), 'experiment')} in {duration(time.perf_counter() - started)}")
    return 1 if missing else 0
