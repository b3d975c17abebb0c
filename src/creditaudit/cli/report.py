"""``creditaudit report``: report.md and a self-contained report.html of a results folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from creditaudit.cli.common import folder
from creditaudit.cli.figures import add_index_options, read_index
from creditaudit.formatting import counted


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "report", help="write report.md and a self-contained report.html of a results folder",
        description="Read every run record below RESULTS_DIR and write OUT/report.md and "
                    "OUT/report.html: the audit table (one row per finished run: method, "
                    "architecture, dataset, seed, accuracy, deep cos, headline Γ, a column "
                    "per protocol diagnostic, verdict), a summary across seeds (both with a "
                    "column for every setting the runs differ in), the runs that did not "
                    "finish, every figure the runs support (embedded in the HTML as PNG) and "
                    "the reporting-template rows of each run. The HTML's tables sort and "
                    "filter; it needs no other file. Everything comes from the records; a folder "
                    "holding none is refused.")
    add_index_options(parser)
    parser.add_argument("--out", metavar="DIR", default=None, type=folder,
                        help="report folder (default: RESULTS_DIR/report); figures go to "
                             "OUT/figures")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import creditaudit.study  # noqa: F401  (the paper's figures register with render_all)
    from creditaudit.figures import render_all
    from creditaudit.files.safe_files import ensure_folder
    from creditaudit.report.folder import FIGURES_DIR, write_report

    index = read_index(args, "report")
    out = Path(args.out) if args.out else Path(args.results) / "report"
    ensure_folder(out)  # a file in the way is one line before any figure is drawn
    # The report embeds the figures drawn here; report and figures know nothing of each other.
    rendered, missing = render_all(index, out / FIGURES_DIR)
    files = write_report(index, out, rendered=rendered, missing=missing)
    print(f"{counted(len(index), 'run record')}; {counted(len(files.rendered), 'figure')} drawn, "
          f"{len(files.missing)} missing")
    for module, err in files.missing:
        print(f"missing {module.TITLE}: needs " + "; ".join(err.needs))
    print(f"wrote {files.markdown}")
    print(f"wrote {files.html}")
    return 0
