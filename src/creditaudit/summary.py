"""Plain-text summaries of run records (what the CLI prints after training)."""

from __future__ import annotations

from typing import Any

from creditaudit.report import fmt


def format_run_summary(records: list[dict[str, Any]]) -> str:
    """One line per run: method, status, accuracy, ‖h_L‖, ‖g_L‖, deep cos, verdict."""
    header = (f"{'method':<14}{'status':<12}{'epochs':>6}{'test acc':>10}{'‖h_L‖':>11}"
              f"{'‖g_L‖':>11}{'deep cos':>10}  verdict")
    lines = [header, "-" * len(header)]
    for record in records:
        last = record["log"][-1] if record["log"] else {}
        protocol = record.get("protocol", {})
        verdict = protocol.get("verdict", "—")
        if protocol.get("fired"):
            verdict += " " + "".join(f"({i})" for i in protocol["fired"])
        lines.append(
            f"{record['config']['method']['name']:<14}{record['status']:<12}"
            f"{last.get('epoch', 0):>6}{fmt(last.get('acc_eval'), '.3f'):>10}"
            f"{fmt(last.get('h_L_norm'), '.3g'):>11}{fmt(last.get('g_L_norm'), '.3g'):>11}"
            f"{fmt(last.get('deep_cos'), '+.3f'):>10}  {verdict}")
    return "\n".join(lines)
