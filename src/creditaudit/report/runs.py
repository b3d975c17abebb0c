"""Plain-text summaries of run records (what the CLI prints after training)."""

from __future__ import annotations

from collections.abc import Sequence

from creditaudit.formatting import fmt
from creditaudit.protocol import DepthUtility
from creditaudit.protocol.records import RecordSet, is_frozen_baseline
from creditaudit.records import RunRecord

BASELINE_TEXT = f"frozen baseline of {DepthUtility.id_label()}"


def stopped_early_text(record: RunRecord) -> str | None:
    """``stopped early at epoch 3: protocol verdict needs walk-back: (a)`` for a run that
    ``--stop-on-walkback`` ended (its status still says completed), else None."""
    stop = record.stopped_early
    if not stop:
        return None
    reason = stop.get("reason")
    return f"stopped early at epoch {stop.get('epoch')}" + (f": {reason}" if reason else "")


def format_run_summary(records: Sequence[RunRecord], *, use_frozen_runs: bool = True) -> str:
    """One line per run: method, status, accuracy, ‖h_L‖, ‖g_L‖, deep cos, verdict; then a
    line for each run that stopped early, saying at which epoch and why.

    Diagnostic (d) is evaluated against the frozen-blocks runs of the same recipe among
    ``records`` (unless ``use_frozen_runs`` is off); the frozen runs themselves are labelled
    as the baseline. "trustworthy" is printed only when all four diagnostics were evaluated.
    """
    index = RecordSet(records, use_frozen_runs=use_frozen_runs)
    header = (f"{'method':<14}{'status':<12}{'epochs':>6}{'test acc':>10}{'‖h_L‖':>11}"
              f"{'‖g_L‖':>11}{'deep cos':>10}  verdict")
    lines = [header, "-" * len(header)]
    partial: list[float] = []  # deep-cosine coverages below 1, for the † footnote
    for record in records:
        last = record.log[-1] if record.log else None
        if is_frozen_baseline(record):
            verdict = BASELINE_TEXT
        elif record.protocol.epoch is None:
            verdict = "—"
        else:
            verdict = index.verdict(record).text
        cos = record.deep_cos
        valid = record.deep_cos_valid
        coverage = record.deep_cos_coverage
        incomplete = coverage is not None and coverage < 1
        if incomplete:
            partial.append(coverage)
        cos_text = (fmt(cos, "+.3f") + ("*" if valid is False and cos is not None else "")
                    + ("†" if incomplete else ""))
        lines.append(
            f"{record.method:<14}{record.status:<12}"
            f"{last.epoch if last else 0:>6}{fmt(record.final_acc, '.3f'):>10}"
            f"{fmt(record.last_value('h_L_norm'), '.3g'):>11}"
            f"{fmt(record.last_value('g_L_norm'), '.3g'):>11}{cos_text:>10}  {verdict}")
    for record in records:
        stopped = stopped_early_text(record)
        if stopped is not None:
            lines.append(f"{record.method} {stopped}")
    if any(r.deep_cos_valid is False for r in records):
        lines.append("* measured against reference gradients below the 1e-7 floor: not a "
                     "valid cosine")
    if partial:
        lines.append(f"† at some deep state the cosine averages over fewer than all samples "
                     f"(as few as {min(partial):.0%}): the others' credits or gradients are "
                     "exactly zero")
    return "\n".join(lines)
