"""``creditaudit audit``: the four-diagnostic protocol on a finished (or stopped) run.

A thin shell over :func:`creditaudit.audit.audit_run`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from creditaudit.config import DEVICES
from creditaudit.report.protocol import FORMATS


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "audit", help="run the four-diagnostic protocol on a trained run",
        description="Audit a run: rebuild its data, model and rule from RUN's record, load "
                    "its checkpoint and evaluate diagnostics (a) residual-stream scale, (b) "
                    "reference validity, (c) cross-batch direction stability and (d) depth "
                    "utility on the run's evaluation subset. Verdict: trustworthy, or needs "
                    "walk-back naming what fired.")
    parser.add_argument("run_path", metavar="RUN",
                        help="run folder (OUT/RUN_ID) or its record.json")
    parser.add_argument("--frozen", metavar="RUN_OR_ACC", default=None,
                        help="frozen-blocks baseline for (d): an accuracy fraction in [0, 1] "
                             "(e.g. 0.349) or a frozen run's folder/record.json (its final "
                             "test accuracy is used; it must share RUN's recipe). Default: "
                             "the frozen-blocks runs of RUN's recipe in RUN's results folder, "
                             "else diagnostics.frozen_acc of RUN's config, else (d) is not "
                             "evaluated")
    parser.add_argument("--no-frozen-from-runs", dest="frozen_from_runs",
                        action="store_false",
                        help="do not look for frozen-blocks runs beside RUN")
    parser.add_argument("--format", choices=FORMATS, default="text",
                        help="report format: text table, md (reporting template), json, or "
                             "latex (a tabular: header row and the run); default text")
    parser.add_argument("--output", metavar="FILE", default=None,
                        help="write the report to FILE (atomically) instead of printing it")
    parser.add_argument("--metrics", action=argparse.BooleanOptionalAction, default=True,
                        help="include the credit-quality metrics (per-layer cosine, Γ "
                             "aggregations, ρ, nudging, fresh-feedback null, each with BP and "
                             "random controls); --no-metrics for the four diagnostics only "
                             "(default: on)")
    parser.add_argument("--device", choices=DEVICES, default="cpu",
                        help="device the diagnostics run on (default cpu; auto = cuda if "
                             "available); they always run in fp32")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress lines on stderr")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from creditaudit.audit import audit_run
    from creditaudit.report import render
    from creditaudit.safe_files import atomic_write_bytes, check_output_file

    if args.output:
        check_output_file(Path(args.output))  # before the audit's minutes of work

    def progress(text: str) -> None:
        print(f"audit: {text}", file=sys.stderr, flush=True)

    report = audit_run(args.run_path, frozen=args.frozen,
                       frozen_from_runs=args.frozen_from_runs, metrics=args.metrics,
                       device=args.device, progress=None if args.quiet else progress)
    text = render(report, args.format)
    if args.output:
        atomic_write_bytes(Path(args.output), (text + "\n").encode())
        print(f"report: {args.output} ({report.verdict_text})")
    else:
        print(text)
    return 0
