"""The scalars a run logs, under grouped tags shared by every backend.

- ``train/``: ``loss``, ``acc`` (training, over the epoch), ``test_loss``, ``test_acc`` (the
  whole test split), ``lr``, ``seconds`` and the rule's own per-epoch values
  (``train/state_pred_error``, …; one named like those six, or ``extras/…``, as
  ``train/extras/NAME``);
- ``norms/``: ``h_L``, ``g_L``, ``g_2`` (median per-sample norms; gradients in the
  1/128 convention), ``max_block_growth``, ``g_L_zero_fraction``, ``g_L_nonzero_median``,
  and per state ``hidden/l{l}``, ``grad/l{l}``;
- ``credit/``: per epoch ``deep_cos``, ``deep_cos_valid`` (1 when every deep cosine is a
  valid measurement, 0 when one is not: the report's § or * mark; left out for records
  without ``cos_valid``), ``cos/l{l}`` and, for rules with a feedback matrix per layer,
  ``feedback_angle/{layer}`` (degrees) and ``feedback_norm_ratio/{layer}`` (‖B‖/‖W‖); at
  the end of the run ``rho/l{l}``
  with ``rho_bp/l{l}`` and ``rho_random/l{l}`` (controls), ``nudging_{η}/l{l}`` with
  ``nudging_bp_{η}``/``nudging_random_{η}``, ``null/mean``, ``null/std``, ``null/z``,
  ``null/training`` (fresh-feedback null, FA/DFA) and ``gamma/{aggregation}``;
- ``protocol/``: one tag per diagnostic of the run's protocol, named by its id (``a`` …
  ``d`` for the built-ins; 1 fired, 0 passed; a diagnostic not evaluated is not logged; one
  named ``walk_back`` or ``verdict``: ``protocol/diagnostics/NAME``) and
  ``walk_back`` (1 when the verdict needs walk-back), at evaluated epochs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from creditaudit.protocol import FIRED, PASSED, WALK_BACK, judge
from creditaudit.records import EpochEntry, RunRecord
from creditaudit.report.runs import stopped_early_text


def _number(value: Any) -> float | None:
    """A float for int/float values (NaN and inf kept: a diverged run shows them), else
    None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _put(out: dict[str, float], tag: str, value: Any) -> None:
    number = _number(value)
    if number is not None:
        out[tag] = number


def _per_layer(out: dict[str, float], prefix: str, values: Sequence[Any] | None,
               first: int = 0) -> None:
    for offset, value in enumerate(values or []):
        _put(out, f"{prefix}/l{first + offset}", value)


# The tool's own ``train/`` tags; a rule's or a loop's extra of one of these names (or one
# named ``extras/…``) is logged as ``train/extras/NAME``.
TRAIN_NAMES = ("loss", "acc", "test_loss", "test_acc", "lr", "seconds")
# The verdict's ``protocol/`` tags (``verdict``: W&B's text); a plugin diagnostic of one of
# these names is logged as ``protocol/diagnostics/NAME`` (a diagnostic's name is an
# identifier: never ``diagnostics/…``).
PROTOCOL_NAMES = ("walk_back", "verdict")


def _guest_tag(group: str, name: str, taken: Sequence[str], aside: str) -> str:
    """The tag of a value named by a guest (a rule's or a loop's extra, a plugin
    diagnostic): ``GROUP/NAME``, or ``GROUP/ASIDE/NAME`` when ``name`` is one of the tool's
    own (``taken``) or itself starts with ``ASIDE/`` — so no two names share a tag (``loss``
    is ``train/extras/loss``, ``extras/loss`` is ``train/extras/extras/loss``)."""
    if name in taken or name.startswith(f"{aside}/"):
        return f"{group}/{aside}/{name}"
    return f"{group}/{name}"


def epoch_scalars(entry: EpochEntry) -> dict[str, float]:
    """Every number of one epoch entry under its grouped tag (missing values left out)."""
    out: dict[str, float] = {}
    numbers = [("train/loss", entry.train_loss), ("train/acc", entry.train_acc),
               ("train/test_loss", entry.test_loss), ("train/test_acc", entry.acc_eval),
               ("train/lr", entry.lr), ("train/seconds", entry.seconds)]
    measures = entry.measures
    if measures is not None:
        numbers += [("norms/h_L", measures.h_L_norm), ("norms/g_L", measures.g_L_norm),
                    ("norms/g_2", measures.g_2_norm),
                    ("norms/max_block_growth", measures.max_block_growth),
                    ("norms/g_L_zero_fraction", measures.g_L_zero_fraction),
                    ("norms/g_L_nonzero_median", measures.g_L_nonzero_median),
                    ("credit/deep_cos", measures.deep_cos)]
    for tag, value in numbers:
        _put(out, tag, value)
    if measures is not None:
        _per_layer(out, "norms/hidden", measures.hidden_norms)
        _per_layer(out, "norms/grad", measures.bp_grad_norms_per_sample_med)
        _per_layer(out, "credit/cos", measures.cos_per_layer)
        if measures.deep_cos_valid is not None:
            out["credit/deep_cos_valid"] = 1.0 if measures.deep_cos_valid else 0.0
        for layer, angle, ratio in zip(measures.feedback_layers or (),
                                       measures.feedback_angle or (),
                                       measures.feedback_norm_ratio or (), strict=False):
            _put(out, f"credit/feedback_angle/{layer}", angle)
            _put(out, f"credit/feedback_norm_ratio/{layer}", ratio)
    for key, value in entry.extras.items():  # never in place of the tool's own numbers
        _put(out, _guest_tag("train", key, TRAIN_NAMES, "extras"), value)
    for diagnostic, status in (entry.protocol or {}).items():
        if status in (FIRED, PASSED):  # never in place of the verdict's tags
            tag = _guest_tag("protocol", diagnostic, PROTOCOL_NAMES, "diagnostics")
            out[tag] = 1.0 if status == FIRED else 0.0
    if entry.verdict is not None:
        out["protocol/walk_back"] = 1.0 if entry.verdict == WALK_BACK else 0.0
    return out


def verdict_text(entry: EpochEntry, reference: dict[str, Any] | None = None) -> str | None:
    """``needs walk-back (a)(b)``, ``no walk-back in (a)–(c); (d) not evaluated``,
    ``unverified: …`` … for an epoch the protocol evaluated (judged with the run's
    ``reference`` check: :func:`~creditaudit.protocol.judge`), else None."""
    if not entry.protocol:
        return None
    return judge(entry.protocol, reference).text


def status_text(record: RunRecord) -> str:
    """How the run ended, in words: ``completed``, ``completed, stopped early at epoch 3:
    protocol verdict needs walk-back: (a)`` (its status alone does not say so), ``failed:
    ERROR``."""
    stopped = stopped_early_text(record)
    return (record.status + (f", {stopped}" if stopped else "")
            + (f": {record.error}" if record.error else ""))


def end_of_run_scalars(record: RunRecord) -> dict[str, float]:
    """The end-of-run credit-quality metrics (ρ, nudging, fresh-feedback null, Γ) under
    ``credit/``; empty when the run has none (no end-of-run block, or a diverged model)."""
    block = record.diagnostics
    out: dict[str, float] = {}
    _per_layer(out, "credit/rho", block.perturbation_rho)
    for control, values in (block.rho_controls or {}).items():
        _per_layer(out, f"credit/rho_{control}", values)
    # Nudging is measured at the deep states 1 … L.
    for eta, values in (block.nudging or {}).items():
        _per_layer(out, f"credit/nudging_{eta}", values, first=1)
    for control, by_eta in (block.nudging_controls or {}).items():
        for eta, values in by_eta.items():
            _per_layer(out, f"credit/nudging_{control}_{eta}", values, first=1)
    null = block.fresh_b_null or {}
    for key, tag in (("mean", "mean"), ("std", "std"), ("z", "z"),
                     ("training_value", "training")):
        _put(out, f"credit/null/{tag}", null.get(key))
    for aggregation, value in (block.gamma or {}).items():
        _put(out, f"credit/gamma/{aggregation}", value)
    return out


def final_scalars(record: RunRecord) -> dict[str, float]:
    """The run's headline numbers for summaries (W&B summary, TensorBoard hparams)."""
    out: dict[str, float] = {}
    final = record.final
    if final is not None:
        for tag, value in (("train/test_acc", final.test_acc),
                           ("train/test_loss", final.test_loss), ("norms/h_L", final.h_L_norm),
                           ("norms/g_L", final.g_L_norm), ("credit/deep_cos", final.deep_cos)):
            _put(out, tag, value)
    return out


def hparams(record_config: dict[str, dict[str, Any]], run_id: str) -> dict[str, Any]:
    """The config as flat ``section.key`` → value, nested tables as ``section.table.key``
    (None written as ``"none"``, lists as text: TensorBoard's hparams take numbers, strings
    and booleans only)."""
    flat: dict[str, Any] = {"run_id": run_id}

    def put(prefix: str, values: dict[str, Any]) -> None:
        for key, value in values.items():
            if isinstance(value, dict):
                put(f"{prefix}{key}.", value)
                continue
            if value is None:
                value = "none"
            elif isinstance(value, float) and not math.isfinite(value):
                value = str(value)
            elif isinstance(value, list | tuple):
                value = ",".join(map(str, value))
            flat[f"{prefix}{key}"] = value

    for section, values in record_config.items():
        put(f"{section}.", values)
    return flat
