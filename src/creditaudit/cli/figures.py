"""``creditaudit figures``: draw every figure the runs in a results folder support."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from creditaudit.cli.common import folder
from creditaudit.formatting import counted

if TYPE_CHECKING:
    from creditaudit.results import RunIndex


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "figures", help="draw the figures a results folder supports (PNG and PDF)",
        description="Read every run record below RESULTS_DIR and draw each figure "
                    "whose runs exist (PNG and PDF, from the records only — no model is "
                    "loaded). For each figure that cannot be drawn, list the runs it needs. "
                    "Nothing to draw is not an error (exit 0), but a folder holding no "
                    "run records is. See docs/figures.md.")
    add_index_options(parser)
    parser.add_argument("--out", metavar="DIR", default=None, type=folder,
                        help="folder for the figure files (default: RESULTS_DIR/figures)")
    parser.set_defaults(handler=run)


def add_index_options(parser: argparse.ArgumentParser) -> None:
    """RESULTS_DIR, --dataset and --frozen-from-runs (shared with ``creditaudit report``)."""
    parser.add_argument("results", metavar="RESULTS_DIR", type=folder,
                        help="results folder (every record.json below it is read)")
    parser.add_argument("--dataset", default=None, metavar="NAME",
                        help="only runs on this dataset (default: all); one the folder "
                             "has no runs of is refused")
    parser.add_argument("--frozen-from-runs", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="evaluate protocol diagnostic (d) of each run against the mean "
                             "final accuracy of the frozen-blocks runs of its recipe (same "
                             "data, model and its code, optimiser, precision) when there are "
                             "any, instead "
                             "of the record's own (d) (default: on; --no-frozen-from-runs "
                             "keeps each record's own (d))")


def read_index(args: argparse.Namespace, doing: str) -> RunIndex:
    """The runs below RESULTS_DIR as the index options ask (shared with ``creditaudit
    report``); a folder below which no readable record lies (none at all: a mistyped folder;
    or only unreadable ones, each named in a warning) is refused in one line (ConfigError)
    before anything is written: it is not "nothing to ``doing``"."""
    from creditaudit.errors import ConfigError
    from creditaudit.records.files import no_runs_in
    from creditaudit.results import RunIndex

    index = RunIndex.from_dir(args.results, dataset=args.dataset,
                              frozen_from_runs=args.frozen_from_runs)
    if not len(index):
        raise ConfigError(no_runs_in(Path(args.results), doing, len(index.skipped)))
    return index


def run(args: argparse.Namespace) -> int:
    import creditaudit.study  # noqa: F401  (the paper's figures register with render_all)
    from creditaudit.figures import render_all
    from creditaudit.files.safe_files import ensure_folder

    index = read_index(args, "draw")
    out = Path(args.out) if args.out else Path(args.results) / "figures"
    ensure_folder(out)  # a file in the way is one line before any figure is drawn
    print(f"{counted(len(index), 'run record')} in {args.results} ({len(index.runs)} completed or "
          "diverged)")
    rendered, missing = render_all(index, out)
    for figure in rendered:
        print(f"drew {figure.title}: " + ", ".join(str(p) for p in figure.paths))
    for module, err in missing:
        print(f"missing {module.TITLE}: needs " + "; ".join(err.needs))
        print(f"    runs it reads: {module.requirements}")
    print(f"{counted(len(rendered), 'figure')} drawn, {len(missing)} missing")
    return 0
