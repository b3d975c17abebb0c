"""``creditaudit audit``: the four-diagnostic protocol on finished (or stopped) runs.

A thin shell over :func:`creditaudit.audit.audit_run`, once per run named (a glob such as
``runs/dfa-…-s42-*`` that matches several folders audits each).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from creditaudit.cli.common import folder, output_file, refusals_in_flags
from creditaudit.config import DEVICES
from creditaudit.formatting import markdown_text, plain_line
from creditaudit.report.protocol import FORMATS, render_latex, verdict_text


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "audit", help="run the four-diagnostic protocol on a trained run",
        description="Audit a run: rebuild its data, model and rule from RUN's record, load "
                    "its checkpoint and evaluate diagnostics (a) residual-stream scale, (b) "
                    "reference validity, (c) cross-batch direction stability and (d) depth "
                    "utility on the run's evaluation subset. Verdict: trustworthy, or needs "
                    "walk-back naming what fired.")
    parser.add_argument("run_paths", metavar="RUN", nargs="+",
                        help="run folder (OUT/RUN_ID) or its record.json; several runs give "
                             "one report each, in order (text and md under a line naming the "
                             "run, latex one row each, json a list)")
    parser.add_argument("--frozen", metavar="RUN_OR_ACC", default=None,
                        help="frozen-blocks baseline for (d): an accuracy fraction in [0, 1] "
                             "(e.g. 0.349) or a frozen run's folder/record.json (its final "
                             "test accuracy is used; it must share RUN's recipe). Default: "
                             "the frozen-blocks runs of RUN's recipe in RUN's results folder, "
                             "else diagnostics.frozen_acc of RUN's config, else (d) is not "
                             "evaluated")
    parser.add_argument("--data-dir", metavar="DIR", default=None, type=folder,
                        help="folder of the run's data files, when they are no longer where "
                             "its record says (a moved or copied run); they must be the data "
                             "it trained on (its recorded fingerprint is checked)")
    parser.add_argument("--no-frozen-from-runs", dest="frozen_from_runs",
                        action="store_false",
                        help="do not look for frozen-blocks runs beside RUN")
    parser.add_argument("--format", choices=FORMATS, default="text",
                        help="report format: text table, md (reporting template), json, or "
                             "latex (a tabular: header row and the run); default text")
    parser.add_argument("--output", metavar="FILE", default=None, type=output_file,
                        help="write the report(s) to FILE (atomically) instead of printing "
                             "them (- prints them, as without --output)")
    parser.add_argument("--metrics", action=argparse.BooleanOptionalAction, default=True,
                        help="include the credit-quality metrics (per-layer cosine, Γ "
                             "aggregations, ρ, nudging, fresh-feedback null, each with BP and "
                             "random controls); --no-metrics for the four diagnostics only "
                             "(default: on)")
    parser.add_argument("--device", choices=DEVICES, default="cpu",
                        help="device the diagnostics run on (default cpu; auto = cuda if "
                             "available); the four diagnostics and the cosines run in fp32, "
                             "ρ and nudging on a float64 copy of the model")
    parser.add_argument("--allow-unverified-reference", action="store_true", default=None,
                        help="audit a model whose backward is not the gradient of its forward "
                             "(refused otherwise, unless the run was trained with "
                             "diagnostics.allow_unverified_reference): its verdict is "
                             "unverified and every cosine, Γ and (b) is marked so")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress lines on stderr")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from creditaudit.audit import audit_run
    from creditaudit.audit.checkpoint import check_flags
    from creditaudit.errors import CreditAuditError, OutputError
    from creditaudit.files.safe_files import atomic_write_bytes, check_output_file
    from creditaudit.records import check_not_run_file
    from creditaudit.report import render

    if args.output == "-":  # stdout, as the convention goes: not a file named '-'
        args.output = None
    if args.output:  # before the audit's minutes of work
        check_output_file(Path(args.output))
        check_not_run_file(args.output)
    several = len(args.run_paths) > 1
    device_flag = {"device": (args.device, f"--device {args.device}")}

    def progress(text: str) -> None:
        print(f"audit: {plain_line(text)}", file=sys.stderr, flush=True)

    # The options' own errors are the call's: refused before anything is written (a run's
    # refusal, below, is this call's result: no report, `[]` in JSON).
    with refusals_in_flags(device_flag):
        check_flags(frozen=args.frozen, device=args.device, data_dir=args.data_dir)
    reports, failed, refused = [], 0, None
    for run_path in args.run_paths:
        if several and not args.quiet:
            progress(f"run {run_path}")
        try:
            with refusals_in_flags(device_flag):  # --device cuda, not device='cuda'
                report = audit_run(run_path, frozen=args.frozen,
                                   frozen_from_runs=args.frozen_from_runs,
                                   metrics=args.metrics, device=args.device,
                                   progress=None if args.quiet else progress,
                                   allow_unverified_reference=args.allow_unverified_reference,
                                   frozen_hint="pass --frozen RUN_OR_ACC",
                                   data_dir=args.data_dir)
        except CreditAuditError as err:
            failed += 1
            if not several:  # raised once this call's (empty) result is out
                refused = err
                continue
            # One bad run among several: say which and why, and audit the others.
            print(f"creditaudit: error: {' '.join(plain_line(f'{run_path}: {err}').split())}",
                  file=sys.stderr)
            continue
        reports.append((run_path, report))
    if args.format == "latex":
        text = _latex_table(reports)
    else:
        text = _joined([(path, render(report, args.format)) for path, report in reports],
                       args.format, several=several)
    # The result is this call's even when every run was refused (JSON: an empty list, a
    # document a script parses): an earlier report in --output is not left standing as
    # this one's.
    if args.output:
        try:
            atomic_write_bytes(Path(args.output), (text + "\n" if text else "").encode())
        except OutputError as err:
            # The audit's minutes of work are not lost: the report goes to stdout instead.
            print(text)
            raise type(err)(f"{err}; the report is printed above instead") from None
        verdicts = "; ".join(verdict_text(report) for _, report in reports)
        print(f"report: {args.output} ({verdicts or 'no run audited'})")
    elif text:
        print(text)
    if refused is not None:
        raise refused
    return 2 if failed else 0


def _joined(reports: list[tuple[str, str]], form: str, *, several: bool) -> str:
    """One rendered report as it is; several, each named by its run: text and Markdown under
    a title line, JSON as a list."""
    if not reports:  # none could be audited: JSON is still a document
        return "[]" if form == "json" else ""
    if not several:
        return reports[0][1]
    if form == "json":
        return "[\n" + ",\n".join(text for _, text in reports) + "\n]"
    title = {"text": "== {} ==", "md": "### {}"}[form]
    name = markdown_text if form == "md" else plain_line  # a folder's name, read as itself
    return "\n\n".join(f"{title.format(name(path))}\n{text}" for path, text in reports)


def _latex_table(reports: list[tuple[str, Any]]) -> str:
    """One LaTeX table of every audited run: one row each, under a comment naming it."""
    if not reports:
        return ""
    lines = render_latex([report for _, report in reports]).splitlines()
    head, rows, tail = lines[:4], lines[4:4 + len(reports)], lines[4 + len(reports):]
    # On the comment's line: a line break in a folder's name would end the comment and
    # make the rest of the name LaTeX to compile.
    named = [line for (path, _), row in zip(reports, rows)
             for line in (f"% {plain_line(path)}", row)]
    return "\n".join([*head, *named, *tail])
