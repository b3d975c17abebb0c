"""The literature experiment's summary as Markdown: per published table, each column's rows
(published number, best- and last-epoch error, Δ in seed sd, verdict), the seeds that
diverged, the marks' footnotes and the threshold sweeps of (b) and (c)."""

from __future__ import annotations

from typing import Any

from creditaudit.protocol import DepthUtility, in_order, labels
from creditaudit.report.runs import ACC
from creditaudit.study.experiments.aggregate import format_aggregate
from creditaudit.study.experiments.groups import fmt, markdown_table
from creditaudit.study.experiments.marks import TableMarks


def count_text(n: Any) -> str:
    """``60 000``: a sample count as the notes write it ("?" when not recorded)."""
    return "?" if n is None else f"{n:,}".replace(",", " ")


def epochs_text(n: int) -> str:
    return f"{n} epoch{'s' * (n != 1)}"


def setting_text(setting: dict[str, Any], dataset: bool = True) -> str:
    """``synthetic teacher–student, 256 train / 256 test samples, 1 epoch`` (without the
    dataset when ``dataset`` is false)."""
    sizes = (f"{count_text(setting['n_train'])} train / {count_text(setting['n_test'])} test "
             f"samples, {epochs_text(setting['epochs'])}")
    return f"{setting['label']}, {sizes}" if dataset else sizes



def _fired(cell: dict[str, Any]) -> str:
    counts, n = cell["verdict"]["fired_counts"], cell["verdict"]["n"]
    fired = [f"({i}) {counts[i]}/{n}" for i in in_order(counts) if counts[i]]
    return ", ".join(fired) if fired else "none"


def _delta(comparison: dict[str, Any]) -> str:
    if comparison["delta"] is None:
        return "—"
    z = "" if comparison["z"] is None else f" ({comparison['z']:+.1f} sd)"
    return f"{comparison['delta']:+.2f}{z}"


def diverged_lines(column: dict[str, Any]) -> list[str]:
    """A paragraph naming each seed of ``column`` that diverged (the report's words) and
    whether it is out of its row's means (no trained epoch with a finite test error)."""
    named = [f"{c['row']} seed {s['seed']} {s['diverged']}"
             + ("; it has no trained epoch with a finite test error and is not in the row's "
                "means" if s["best_error"] is None else "")
             for c in column["rows"] for s in c["seeds"] if s.get("diverged")]
    return ["", "Diverged: " + ". ".join(named) + "."] if named else []


def table_markdown(table: dict[str, Any], mark: TableMarks) -> str:
    parts = [f"### {table['title']}", "", f"Source: {table['source']}."]
    for column in table["columns"]:
        header = ["rule", "published", "best-epoch error", "Δ (sd)", "last-epoch error",
                  "protocol verdict", "fired (seeds)"]
        # The last-epoch error is the headline accuracy's complement: marked as it is (a
        # diverged run's is of its last finite epoch); the best epoch is one of the runs'
        # finite epochs whatever became of them later.
        body = [[c["row"], fmt(c["published"], ".2f"), format_aggregate(c["best_error"], ".2f"),
                 _delta(c["best_vs_published"]),
                 mark(format_aggregate(c["last_error"], ".2f"), c, ACC),
                 c["verdict"]["text"], _fired(c)] for c in column["rows"]]
        setting = column.get("setting")
        trained = (setting_text(setting, dataset=False) if setting is not None
                   else f"{column['rows'][0]['epochs']} epochs")  # a summary from before
        why_not = column.get("not_compared")
        delta = (f"no Δ against the published {column.get('published_for')} numbers: "
                 f"{why_not}" if why_not is not None
                 else "Δ = best-epoch mean − published, in pp and seed sd")
        parts += ["", f"**{column['label']}** ({trained}; test error %, mean ± sd over "
                  f"seeds; {delta})", "", markdown_table(header, body), *diverged_lines(column)]
    away = [c for c in table["columns"] if c.get("not_compared")]
    if away and table["notes"]:
        parts += ["", "The notes describe the recipe whose runs are compared with the "
                  "published numbers, not the runs above ("
                  + "; ".join(setting_text(c["setting"]) for c in away) + "):"]
    parts += ["", *[f"- {note}" for note in table["notes"]]]
    return "\n".join(parts)


def to_markdown(summary: dict[str, Any]) -> str:
    mark = TableMarks(summary)
    parts = [table_markdown(t, mark) for t in summary["tables"]]
    if mark.footnotes():  # what the marks of the numbers above mean
        parts.append(mark.notes_text().strip())
    for sweep in summary["sweeps"].values():
        if not sweep["runs"]:
            continue
        header = ["network (runs)", *(f"{t:g}" for t in sweep["thresholds"])]
        rows = [[f"all ({sweep['runs']})", *sweep["fired"]]]
        rows += [[f"{net} ({v['runs']})", *v["fired"]] for net, v in sweep["by_net"].items()]
        parts.append(f"### Diagnostic ({sweep['diagnostic']}) at other thresholds\n\nRuns "
                     f"(baselines left out) that ({sweep['diagnostic']}) flags at each "
                     f"threshold (fires when the statistic is {sweep['operator']} the "
                     f"threshold; default {sweep['default']:g}), from the statistic each run "
                     "stored at its last protocol evaluation.\n\n"
                     + markdown_table(header, rows))
    parts.append(f"Within the seed spread: {summary['within_rule']}. Verdicts: (a)–(c) as the "
                 "training-time protocol recorded them at the last evaluated epoch, (d) against "
                 "the frozen runs of the same network, data and recipe; "
                 f"{labels([DepthUtility.name])} is not evaluated where a recipe has no frozen "
                 "runs.")
    return "\n\n".join(parts) + "\n"
