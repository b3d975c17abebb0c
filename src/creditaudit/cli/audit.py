"""``creditaudit audit``: the four-diagnostic protocol on a finished (or stopped) run.

Rebuilds the run's dataset, model and credit rule from its record, loads the checkpoint and
reports the protocol (plus, by default, the credit-quality metrics) on the run's fixed
evaluation subset.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import torch

from creditaudit.config import DEVICES
from creditaudit.errors import ConfigError, RunRecordError
from creditaudit.runs import CHECKPOINT_FILE, RECORD_FILE, atomic_write_bytes, load_record

log = logging.getLogger(__name__)
FORMATS = ("text", "md", "json", "latex")
# Config fields a frozen baseline must share with the audited run to be comparable.
BASELINE_KEYS = (("data", "name"), ("model", "arch"), ("model", "d"), ("model", "n_blocks"))
# Per-epoch record fields of a rule that the audit report repeats (EP's relaxation).
RECORDED_RULE_FIELDS = ("ep_relax_grad_ratio", "ep_backoff_fraction")


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
                             "test accuracy is used; dataset and architecture must match). "
                             "Default: diagnostics.frozen_acc of RUN's config, else (d) is "
                             "not evaluated")
    parser.add_argument("--format", choices=FORMATS, default="text",
                        help="report format: text table, md (reporting template), json, or "
                             "latex (one table row); default text")
    parser.add_argument("--output", metavar="FILE", default=None,
                        help="write the report to FILE (atomically) instead of printing it")
    parser.add_argument("--metrics", action=argparse.BooleanOptionalAction, default=True,
                        help="include the credit-quality metrics (per-layer cosine, Γ "
                             "aggregations, ρ, nudging, fresh-B null, each with BP and random "
                             "controls); --no-metrics for the four diagnostics only "
                             "(default: on)")
    parser.add_argument("--device", choices=DEVICES, default="cpu",
                        help="device the diagnostics run on (default cpu; auto = cuda if "
                             "available); they always run in fp32")
    parser.set_defaults(handler=run)


def parse_frozen(text: str, config: Any) -> float:
    """An accuracy fraction from ``--frozen``: a number in [0, 1] or a frozen run's record."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is not None:
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"--frozen {text} is not an accuracy fraction in [0, 1]: pass "
                              "e.g. 0.349 (not 34.9) or a frozen run's folder")
        return value
    from creditaudit.runs import record_config

    record = load_record(text)
    frozen_config = record_config(record)
    for section, key in BASELINE_KEYS:
        ours = getattr(getattr(config, section), key)
        theirs = getattr(getattr(frozen_config, section), key)
        if ours != theirs:
            raise ConfigError(f"--frozen run {text} has {section}.{key}={theirs!r} but the "
                              f"audited run has {ours!r}: use a frozen baseline of the same "
                              "dataset and architecture")
    if frozen_config.method.name != "frozen":
        log.warning("--frozen run %s was trained with method %r, not 'frozen'", text,
                    frozen_config.method.name)
    acc = _final_accuracy(record)
    if acc is None:
        raise RunRecordError(f"--frozen run {text} has no finished epoch with a test accuracy")
    return acc


def _final_accuracy(record: dict[str, Any]) -> float | None:
    final = record.get("final") or {}
    if final.get("test_acc") is not None:
        return float(final["test_acc"])
    for entry in reversed(record["log"]):
        if entry.get("acc_eval") is not None:
            return float(entry["acc_eval"])
    return None


def load_run(run_path: str) -> tuple[dict[str, Any], Any, Any, Any, dict[str, Any]]:
    """(record, config, dataset, rule, checkpoint) of a run, on the CPU."""
    from creditaudit.data import load_dataset
    from creditaudit.methods import build_rule
    from creditaudit.models import build_model
    from creditaudit.runs import record_config

    record = load_record(run_path)
    run_dir = Path(run_path)
    if run_dir.name == RECORD_FILE:
        run_dir = run_dir.parent
    config = record_config(record)
    path = run_dir / CHECKPOINT_FILE
    if not path.exists():
        raise RunRecordError(f"no checkpoint at {path}: the run never finished an epoch; "
                             "train it (creditaudit train … --resume) before auditing")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
        model_state, rule_state = state["model"], state["rule"]
    except Exception as err:  # truncated or foreign file: say which one
        raise RunRecordError(f"checkpoint {path} cannot be read ({type(err).__name__}); "
                             "rerun the run with --force") from None
    dataset = load_dataset(config.data, seed=config.run.seed)
    # The random init is overwritten by the checkpoint; fork so the caller's RNG is untouched.
    with torch.random.fork_rng(devices=[]):
        model = build_model(config.model, input_shape=dataset.input_shape,
                            n_classes=dataset.n_classes)
    rule = build_rule(model, config.method, n_classes=dataset.n_classes, seed=config.run.seed)
    try:
        model.load_state_dict(model_state)
        rule.load_state_dict(rule_state)
    except (RuntimeError, KeyError, TypeError) as err:
        raise RunRecordError(f"checkpoint {path} does not match the run's config "
                             f"({str(err).splitlines()[0]})") from None
    return record, config, dataset, rule, state


def audit_run(run_path: str, *, frozen: str | None = None, metrics: bool = True,
              device: str = "cpu") -> Any:
    """The :class:`~creditaudit.protocol.DiagnosticReport` of a run (see ``audit --help``)."""
    from creditaudit.protocol import config_metadata, diagnose
    from creditaudit.training import flatten_inputs, resolve_device

    target = resolve_device(device)
    record, config, dataset, rule, state = load_run(run_path)
    rule.to(target)
    frozen_acc = (parse_frozen(frozen, config) if frozen is not None
                  else config.diagnostics.frozen_acc)
    epoch = int(state.get("epoch", record["log"][-1]["epoch"] if record["log"] else 0))
    # The checkpointed epoch's accuracy: a diverged epoch is logged but never checkpointed.
    entries = [e for e in record["log"] if e["epoch"] == epoch] or record["log"][-1:]
    headline = entries[-1].get("acc_eval") if entries else None
    eval_x, eval_y = dataset.eval_subset(config.diagnostics.eval_samples,
                                         flatten=flatten_inputs(config))
    eval_x, eval_y = eval_x.to(target), eval_y.to(target)
    options = {"rho_samples": config.diagnostics.rho_samples,
               "rho_directions": config.diagnostics.rho_directions,
               "null_draws": config.diagnostics.null_draws, "seed": config.run.seed}
    report = diagnose(rule.model, eval_x, eval_y, credit=rule, headline_acc=headline,
                      frozen_acc=frozen_acc, metrics=metrics, metric_options=options,
                      metadata={**config_metadata(config), "epoch": epoch,
                                "status": record["status"]})
    fields = rule_fields(rule, entries[-1] if entries else {}, eval_x, eval_y, metrics)
    if fields:
        report.metrics = {**(report.metrics or {}), **fields}
    return report


def rule_fields(rule: Any, entry: dict[str, Any], eval_x: torch.Tensor, eval_y: torch.Tensor,
                metrics: bool) -> dict[str, Any]:
    """The rule's own end-of-run metrics (with ``metrics``; e.g. EP's update cosine with BP)
    plus its convergence fields from the audited epoch's record entry."""
    fields = {key: entry[key] for key in RECORDED_RULE_FIELDS if key in entry}
    if metrics:
        devices = [eval_x.device] if eval_x.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            fields.update(rule.run_metrics(eval_x, eval_y))
    return fields


def render(report: Any, fmt: str) -> str:
    if fmt == "json":
        return report.to_json()
    if fmt == "md":
        return report.to_markdown()
    if fmt == "latex":
        return report.to_latex()
    return str(report)


def run(args: argparse.Namespace) -> int:
    report = audit_run(args.run_path, frozen=args.frozen, metrics=args.metrics,
                       device=args.device)
    text = render(report, args.format)
    if args.output:
        atomic_write_bytes(Path(args.output), (text + "\n").encode())
        print(f"report: {args.output} ({report.verdict_text})")
    else:
        print(text)
    return 0
