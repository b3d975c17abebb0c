"""Plain-text summaries of run records (what the CLI prints after training)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from creditaudit.descriptions import BELOW_FLOOR, CREDIT_NOT_FINITE, GRADIENT_NOT_FINITE
from creditaudit.formatting import counted, fmt, plain_line
from creditaudit.guests.blame import value_message
from creditaudit.protocol import (
    FIRED,
    UNVERIFIED_MARK,
    DepthUtility,
    Judgement,
    ResidualStreamScale,
)
from creditaudit.protocol.records import RecordSet, baseline_text, is_frozen_baseline
from creditaudit.records import RunRecord
from creditaudit.records.claim_files import claim_state
from creditaudit.results import diverged_epoch_text, stopped_early_text

# After each headline number of a diverged run: it is of the run's last finite epoch.
DIVERGED_MARK = "‡"
# The § footnote's cause, by ``cos_invalid`` reason.
NOT_FINITE_TEXT = {GRADIENT_NOT_FINITE: "the reference gradients",
                   CREDIT_NOT_FINITE: "the rule's credits"}


# Statuses of an unfinished run that a process may be training again (resumed, forced).
AGAIN = ("interrupted", "failed")


def status_text(record: RunRecord, folder: Path | None = None) -> str:
    """The run's status; for one whose record says ``running``, what the claim in its
    ``folder`` says of the process (:mod:`creditaudit.records.claim_files`): ``running
    (held by pid 123 on host-a)``, or ``running (no process holds it: interrupted? …)``
    where the claim's process is gone or its heartbeat stopped (killed: out of memory, a
    lost machine). The process that trains a run (a sweep's worker, ``creditaudit train``, a
    ``Recorder``) holds the claim and releases it however the run ends — also when the
    run's failure could not be written (a full disk) — so such a run says ``running``
    whether its process lives or not: nothing on disk tells. An ``interrupted`` or
    ``failed`` record whose run a live process holds is being trained again (``--resume``,
    ``--force``, a sweep's retry) and says so: ``interrupted (being trained again by pid
    123 on host-a)``."""
    if folder is None or record.status not in ("running", *AGAIN):
        return record.status
    claim = claim_state(folder)
    if claim is None:
        return record.status
    if record.status in AGAIN:
        return (f"{record.status} (being trained again by {claim.who})"
                if claim.stale is None else record.status)
    if claim.stale is None:
        return f"running (held by {claim.who})"
    return f"running ({NOT_HELD}: interrupted? {claim.why_not_held()})"


NOT_HELD = "no process holds it"


def status_count_text(record: RunRecord, folder: Path | None = None) -> str:
    """The run's status as a report's first line counts it: its record's, but ``running
    (no process holds it)`` for a ``running`` record whose claim's process is gone or
    silent (:func:`status_text`), so a killed run is not counted as running."""
    if status_text(record, folder).startswith(f"running ({NOT_HELD}"):
        return f"running ({NOT_HELD})"
    return record.status


def diverged_text(record: RunRecord) -> str | None:
    """``diverged in epoch 3: ‡ numbers of epoch 2, the last whose evaluation was finite``
    for a diverged run (whose headline numbers, each marked ‡ by :func:`headline_cell`, are
    those of that epoch; where that epoch took no diagnostics, saying that its measures are
    not measured; where the protocol was last evaluated at a later epoch, saying that its
    verdict and diagnostics' values are of that one), else None."""
    text = diverged_epoch_text(record, mark=DIVERGED_MARK,
                               nothing="so no test acc nor any other number")
    epoch = record.numbers_epoch
    if text is None or record.final is None or epoch is None:
        return text
    entry = record.entry(epoch)
    if entry is not None and not entry.has_diagnostics:
        # An earlier epoch's measures are of another network: the row shows none.
        text += (f"; epoch {epoch} took no diagnostics (diagnostics.every = "
                 f"{record.config.diagnostics.every}), so its ‖h_L‖, ‖g_L‖, deep cos and Γ "
                 "are not measured (—)")
    protocol = record.protocol.epoch
    if protocol is not None and protocol != epoch:  # the protocol judged a later network
        text += (f"; its verdict and diagnostics are of epoch {protocol}, the protocol's "
                 "last evaluation")
    if protocol is None and epoch == 0:  # diverged in its first epoch
        text += (f"; no trained epoch was finite, so the protocol never judged it: every "
                 f"diagnostic but {DepthUtility.id_label()} is not evaluated (epoch 0 is the "
                 "network at initialisation, which shows nothing of the rule), and "
                 f"{DepthUtility.id_label()} compares epoch 0's accuracy with a frozen-blocks "
                 "baseline when one is given")
    return text


def credit_not_finite_text(record: RunRecord) -> str | None:
    """One line naming the rule whose credits were NaN/Inf on the evaluation set (a guest's
    — a plugin, a class of the user's own — as :mod:`creditaudit.guests.blame` names a
    guest's failure: its own error), where and when, and what that leaves unmeasured; None
    when they never were."""
    fault = record.credit_not_finite
    if not fault:
        return None
    states = fault["states"]
    where = f"state{'s' if len(states) != 1 else ''} {', '.join(map(str, states))}"
    detail = (f"returned NaN/Inf credits at {where} of the evaluation set in epoch "
              f"{fault['epoch']}, where the reference gradients are finite: no cosine of "
              "its credits is valid (nor Γ, ρ or nudging, which read them); its training and "
              "accuracy are recorded as they are")
    if fault.get("part"):
        return (f"{fault['rule']} {detail}; {fault['part']}, not the network: check those "
                "settings")
    if fault.get("guest"):
        return value_message(fault["rule"], detail)
    return (f"{fault['rule']} {detail}; it computes them from the network's own outputs: "
            "check that the network's forward is finite in eval mode, with and without "
            "gradients, else report it to creditaudit")


def code_versions_text(record: RunRecord) -> str | None:
    """``was resumed on another version of creditaudit or torch: … from epoch 1 on
    aaaaaaaaaaaa, from epoch 3 on bbbbbbbbbbbb+dirty`` for a run whose parts ran different
    versions of creditaudit or of torch (the commit or the torch install changed between
    an interruption and its resume), else None."""
    versions = record.code_versions()
    if len(versions) < 2:
        return None
    parts = ", ".join(f"from epoch {epoch} on {_short(code)}" for epoch, code in versions)
    return (f"was resumed on another version of creditaudit or torch: its numbers come from "
            f"{len(versions)} versions of the code ({parts})")


def _short(code: str) -> str:
    """A 40-digit commit cut to 12 (``+dirty`` and a ``with torch VERSION`` kept); other
    names as they are."""
    code, with_torch, torch_version = code.partition(" with torch ")
    return _short_commit(code) + with_torch + torch_version


def _short_commit(code: str) -> str:
    """A 40-digit commit (``+dirty`` kept) cut to 12; other names as they are."""
    commit, plus, rest = code.partition("+")
    if len(commit) == 40 and all(c in "0123456789abcdef" for c in commit):
        return commit[:12] + plus + rest
    return code


# A credit whose deep cosine with the reference gradient is this close to 1 is that gradient.
EXACT_COSINE = 1.0 - 1e-6


def reference_growth_text(record: RunRecord, statuses: dict[str, str]) -> str | None:
    """For a run whose credit is the reference gradient itself (deep cosine 1: BP) and
    whose (a) fired, what that means; else None. (a) compares growth with a fixed limit,
    and exact gradients grow some models' residual streams past it in the first epochs (a
    ViT on Fashion-MNIST: 78× after one epoch), which would otherwise read as BP failing."""
    a = ResidualStreamScale
    cos = record.deep_cos
    if statuses.get(a.name) != FIRED or cos is None or cos < EXACT_COSINE:
        return None
    result = ((record.protocol.report or {}).get("diagnostics") or {}).get(a.name) or {}
    value = result.get("value")
    growth = f" (growth {value:.3g}×)" if isinstance(value, int | float) else ""
    return (f"{a.id_label()} fired for backprop itself{growth} at epoch {record.protocol.epoch}: "
            f"exact gradients grow this {record.model.label}'s residual stream too, so here "
            f"{a.id_label()} alone says nothing against a local rule: compare a rule's growth "
            "with BP's of the same recipe epoch by epoch (`creditaudit figures`, the temporal "
            "view fig2_temporal) before reading it")


def format_run_summary(records: Sequence[RunRecord], *, use_frozen_runs: bool = True,
                       names: Sequence[str] | None = None) -> str:
    """One line per run: method, status, accuracy, ‖h_L‖, ‖g_L‖, deep cos, verdict; then a
    line for each run that stopped early, saying at which epoch and why, for each that
    diverged (its numbers marked ‡), which epoch its numbers are from, for each whose rule
    returned NaN/Inf credits, the rule (its deep cosine marked §: not valid, for that cause,
    never the † of exactly-zero vectors), and for each resumed on another version of
    creditaudit, which versions its epochs ran.

    Diagnostic (d) is evaluated against the frozen-blocks runs of the same recipe among
    ``records`` (unless ``use_frozen_runs`` is off); the frozen runs themselves are labelled
    as the baseline, and a line under the table counts the runs judged so. "trustworthy" is
    printed only when all four diagnostics were evaluated and the reference gradient was
    verified; a number measured against a reference that was not (deep cos, ‖g_L‖: (b)'s)
    is marked "(unverified)", with the reason under the table.
    Every number is marked by :func:`headline_cell`, as in the report's tables. Every line
    is one line of plain text (:func:`~creditaudit.formatting.plain_line`): a guest's name
    or note cannot break the table or reach the terminal as an escape sequence.

    ``names``: how the lines under the table name each run (default: its method; a sweep,
    whose runs may share one, gives each its label).
    """
    index = RecordSet(records, use_frozen_runs=use_frozen_runs)
    named = list(zip(records, [r.method for r in records] if names is None else names,
                     strict=True))
    rows = []
    unverified: list[str] = []  # why a run's reference is not verified, for the footnote
    notes: list[str] = []
    judged_here = 0  # runs whose (d) is judged against the frozen runs among ``records``
    for record, name in named:
        run_verdict = index.verdict(record)
        judged, statuses = run_verdict.judgement, run_verdict.statuses
        if is_frozen_baseline(record):
            verdict = baseline_text(record)
        elif record.protocol.epoch is None:
            verdict = "—"
        else:
            verdict = judged.text
            judged_here += run_verdict.frozen_acc is not None  # (d) against frozen runs here
            note = reference_growth_text(record, statuses)
            if note is not None:
                notes.append(f"{name}: {note}")
        cells = [headline_cell(text, what, [record], [judged]) for text, what in (
            (fmt(record.final_acc, ".3f"), ACC),
            (fmt(record.headline_value("h_L_norm"), ".3g"), H_NORM),
            (fmt(record.headline_value("g_L_norm"), ".3g"), G_NORM),
            (fmt(record.deep_cos, "+.3f"), DEEP_COS))]
        if any(cell.endswith(UNVERIFIED_MARK) for cell in cells):
            unverified.append(f"{name}: {judged.reference_note}")
        rows.append((record, cells, verdict))
    titles, least = ("test acc", "‖h_L‖", "‖g_L‖", "deep cos"), (10, 11, 11, 10)
    widths = [max([least[i], *(len(cells[i]) + 2 for _, cells, _ in rows)])
              for i in range(len(titles))]
    header = (f"{'method':<14}{'status':<12}{'epochs':>6}"
              + "".join(f"{t:>{w}}" for t, w in zip(titles, widths)) + "  verdict")
    lines = [header, "-" * len(header)]
    for record, cells, verdict in rows:
        last = record.log[-1] if record.log else None
        lines.append(f"{record.method:<14}{record.status:<12}{last.epoch if last else 0:>6}"
                     + "".join(f"{c:>{w}}" for c, w in zip(cells, widths)) + f"  {verdict}")
    lines += notes
    for record, name in named:
        for note in (stopped_early_text(record), diverged_text(record),
                     code_versions_text(record)):
            if note is not None:
                lines.append(f"{name} {note}")
    lines += dict.fromkeys(filter(None, map(credit_not_finite_text, records)))
    footnotes = deep_cos_footnotes(records)
    lines += [footnotes[mark] for mark in ("*", "§") if mark in footnotes]
    unverified_note = unverified_footnote(unverified)
    if unverified_note is not None:
        lines.append(unverified_note)
    if "†" in footnotes:
        lines.append(footnotes["†"])
    if judged_here:
        d = DepthUtility.id_label()
        lines.append(f"{d} of {counted(judged_here, 'run')}: against the mean final accuracy "
                     "of the frozen-blocks runs of the same recipe in this table, as `creditaudit "
                     f"report` judges it (a record's own {d} may differ)")
    # Names, labels and notes may be a guest's (a plugin's label, a sweep's grid values): one
    # table line each, no terminal escape sequence.
    return "\n".join(map(plain_line, lines))


def _not_finite(record: RunRecord) -> list[str]:
    return [why for why in record.deep_cos_invalid or () if why in NOT_FINITE_TEXT]


def _partial_coverage(record: RunRecord) -> float | None:
    """The deep cosine's smallest sample coverage when below 1 because some vectors are
    exactly zero (a NaN/Inf one is § instead), else None."""
    coverage = record.deep_cos_coverage
    if coverage is None or coverage >= 1 or _not_finite(record):
        return None
    return coverage


def deep_cos_marks(record: RunRecord) -> str:
    """The marks of a run's deep cosine, wherever it is shown: § not valid (NaN/Inf credits
    or reference gradients at a deep state), * not valid (reference below the floor), †
    averaged over fewer than all samples (the others' vectors exactly zero); footnotes:
    :func:`deep_cos_footnotes`."""
    invalid = record.deep_cos_invalid or ()
    return (("§" if _not_finite(record) else "")
            + ("*" if BELOW_FLOOR in invalid and record.deep_cos is not None else "")
            + ("†" if _partial_coverage(record) is not None else ""))


def deep_cos_footnotes(records: Sequence[RunRecord]) -> dict[str, str]:
    """Mark → its footnote line, for the marks :func:`deep_cos_marks` gives ``records``."""
    notes = {}
    if any("*" in deep_cos_marks(r) for r in records):  # a deep cos "—" carries none
        notes["*"] = ("* measured against reference gradients below the 1e-7 floor: not a "
                      "valid cosine")
    causes = dict.fromkeys(why for r in records for why in _not_finite(r))
    if causes:
        what = " or ".join(NOT_FINITE_TEXT[why] for why in causes)
        notes["§"] = (f"§ not a valid cosine: at some deep state {what} are NaN or Inf (not "
                      "zero): those samples have no direction")
    partial = [c for r in records if (c := _partial_coverage(r)) is not None]
    if partial:
        notes["†"] = (f"† at some deep state the cosine averages over fewer than all samples "
                      f"(as few as {min(partial):.0%}): the others' credits or gradients are "
                      "exactly zero")
    return notes


# The headline numbers tables show, by the marks each can carry; ‖g_L‖ is (b)'s statistic,
# and it, the cosines and Γ read the reference gradient.
ACC, H_NORM, G_NORM, DEEP_COS, GAMMA = "acc", "h_L", "g_L", "deep cos", "Γ"
READS_REFERENCE = frozenset({G_NORM, DEEP_COS, GAMMA})


def headline_cell(text: str, what: str, records: Sequence[RunRecord],
                  judgements: Sequence[Judgement]) -> str:
    """``text``, the headline number ``what`` (:data:`ACC` … :data:`GAMMA`) of ``records``
    (one run, or the runs a summary row averages), with every mark it carries, in one
    order in every table: the deep cosine's validity marks (§ * †, :func:`deep_cos_marks`),
    :data:`DIVERGED_MARK` where a run diverged (its numbers are of its last finite epoch),
    :data:`UNVERIFIED_MARK` where the number reads the reference gradient and a run's
    judgement (``judgements``) says it is not verified. A missing value (—) is not a number
    of any epoch: no ‡."""
    number = text.strip() not in ("", "—")
    if what == DEEP_COS:
        text += "".join(m for m in "§*†" if any(m in deep_cos_marks(r) for r in records))
    if number and any(r.status == "diverged" for r in records):
        text += DIVERGED_MARK
    unverified = next((j for j in judgements if j.reference_verified is False), None)
    return text if what not in READS_REFERENCE or unverified is None else unverified.mark(text)


def diverged_footnote(records: Sequence[RunRecord]) -> str | None:
    """What :data:`DIVERGED_MARK` means, where one of ``records`` diverged, else None."""
    if not any(r.status == "diverged" for r in records):
        return None
    return (f"{DIVERGED_MARK} of a diverged run: its numbers are those of its last epoch "
            "whose evaluation was finite, not of the epoch it diverged in")


def unverified_footnote(reasons: Sequence[str]) -> str | None:
    """What :data:`UNVERIFIED_MARK` means, with ``reasons`` (why each marked run's reference
    is not verified: ``dfa: reference gradient failed its check …``; repeats shown once),
    where there are any, else None."""
    if not reasons:
        return None
    return (f"{UNVERIFIED_MARK} the reference gradient every cosine, Γ and (b) compares with "
            "is not verified: " + "; ".join(dict.fromkeys(reasons)))
