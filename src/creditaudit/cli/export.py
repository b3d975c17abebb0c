"""``creditaudit export``: write run records in the original study's result layout."""

from __future__ import annotations

import argparse
from pathlib import Path

from creditaudit.cli.common import folder


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "export", help="write run records in the original study's result-file layout",
        description="Read every run record below RESULTS_DIR and write the files the original "
                    "figure scripts read (results/snapshot_evolution_v2/…, "
                    "results/dfa_residual_penalty/…, results/cifar10/results_cifar10.json, …) "
                    "under OUT. Only files whose runs exist are written; the list of written "
                    "and skipped files (with the runs each missing file needs) is printed and "
                    "saved as OUT/export_manifest.json; a RESULTS_DIR holding no run records "
                    "it can read is refused. See docs/experiments.md.")
    parser.add_argument("results_dir", metavar="RESULTS_DIR", type=folder,
                        help="folder holding run folders (the --out of train/sweep/experiment)")
    parser.add_argument("out", metavar="OUT", type=folder, help="folder to write the layout into")
    parser.add_argument("--layout", choices=("faeval",), default="faeval",
                        help="faeval: the original study's results/ layout (default)")
    parser.add_argument("--dataset", default=None, metavar="NAME",
                        help="take the runs of every file but the StudentNet ones from this "
                             "dataset only (default: the most paper-like one present: cifar10, "
                             "cifar100, fashion-mnist, mnist, mnist1d, synthetic)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from creditaudit.errors import ConfigError
    from creditaudit.records.files import find_records, no_runs_in, results_folder
    from creditaudit.study.export import export

    if not find_records(results_folder(args.results_dir)):  # a mistyped one: nothing written
        raise ConfigError(no_runs_in(Path(args.results_dir), "export"))
    result = export(args.results_dir, args.out, layout=args.layout, dataset=args.dataset)
    print(result.format())
    return 0
