"""``creditaudit train``: one run with per-epoch diagnostics and a run record."""

from __future__ import annotations

import argparse

from creditaudit.cli.common import add_config_options, config_and_flags, in_flags, refuse_together
from creditaudit.config import config_to_toml
from creditaudit.errors import CreditAuditError
from creditaudit.report import format_run_summary


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "train", help="train one network with a credit rule",
        description="Train one run. Writes OUT/RUN_ID/config.toml (the resolved config), "
                    "record.json after every epoch and a checkpoint beside it; the run id is "
                    "derived from the config and the data, so the same config finds the "
                    "same folder. Progress: a run-level bar with ETA in a terminal, one line "
                    "per epoch (loss, accuracy, ‖h_L‖, ‖g_L‖, verdict, elapsed, ETA) when "
                    "stdout (or stderr) goes to a file; -q for none.")
    add_config_options(parser)
    # one or the other: --force deletes the checkpoint --resume would continue from
    existing = parser.add_mutually_exclusive_group()
    existing.add_argument("--resume", action="store_true",
                          help="continue an interrupted run from its last checkpoint")
    existing.add_argument("--force", action="store_true",
                          help="start over even if the run folder exists (its record and "
                               "checkpoint are deleted)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config of the given flags as TOML (what "
                             "--config reads back) and exit without training (not with "
                             "--resume or --force, which it would ignore)")
    refuse_together(parser, "--print-config", ("--resume", "--force"))
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from creditaudit.run.trainer import train

    config, typed = config_and_flags(args)
    if args.print_config:
        print(config_to_toml(config), end="")
        return 0
    try:
        result = train(config, resume=args.resume, force=args.force)
    except CreditAuditError as err:  # planning's refusals name keys: say the flags typed
        err.args = (in_flags(str(err), typed), *err.args[1:])
        raise
    print(format_run_summary([result.record]))
    print(f"record: {result.run_dir / 'record.json'}")
    return 0 if result.status in ("completed", "diverged") else 1
