"""The per-epoch diagnostic record of a training run (science.md §2, §5, §6)."""

from __future__ import annotations

import torch
from torch import Tensor

from creditaudit.diagnostics.alignment import deep_mean, layer_cosine_coverage
from creditaudit.diagnostics.gradients import (
    REFERENCE_FLOOR,
    StateGradients,
    max_block_growth,
    median_norms,
    state_gradients,
    zero_gradient_stats,
)
from creditaudit.methods.base import CreditRule
from creditaudit.methods.bp import BP
from creditaudit.models.contract import summary_vectors


def rule_credits(rule: CreditRule, x: Tensor, y: Tensor, *, chunk: int = 512) -> list[Tensor]:
    """The rule's per-sample credit summaries ``(N, d)`` per layer, in chunks."""
    parts = [rule.credits(x[s:s + chunk], y[s:s + chunk]) for s in range(0, x.shape[0], chunk)]
    return [torch.cat([summary_vectors(p[l]) for p in parts]) for l in range(len(parts[0]))]


def epoch_diagnostics(rule: CreditRule, x: Tensor, y: Tensor) -> tuple[dict[str, object],
                                                                         StateGradients]:
    """Norms, per-sample BP gradient norms and per-layer cosines on the evaluation set.

    Each cosine carries its validity: ``cos_valid[l]`` is False where the reference ‖g_l‖
    is below the floor (1e-7), and ``deep_cos_valid`` says whether every deep layer's is valid;
    ``cos_defined[l]`` is the fraction of samples the cosine averages over (a zero credit
    has no direction).

    Runs under a forked RNG so that no random stream used by training advances: weights
    trained with and without diagnostics are bit-identical. Returns the record fields and
    the raw :class:`StateGradients` (for the protocol).
    """
    model = rule.model
    devices = [x.device] if x.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        sg = state_gradients(model.forward_states, x, y)
        # BP's credits are the reference gradients themselves (up to a scale the cosine
        # ignores): reuse them rather than run the same forward and backward twice.
        credits = sg.grads if type(rule).credits is BP.credits else rule_credits(rule, x, y)
    hidden = median_norms(sg.states)
    grads = median_norms(sg.grads)
    cos, defined = layer_cosine_coverage(credits, sg.grads)
    valid = [bool(g >= REFERENCE_FLOOR) for g in grads]
    zero_fraction, nonzero_median = zero_gradient_stats(sg.grads[-1])
    record: dict[str, object] = {
        "hidden_norms": hidden,
        "bp_grad_norms_per_sample_med": grads,
        "h_L_norm": hidden[-1],
        "g_L_norm": grads[-1],
        "g_2_norm": grads[2] if len(grads) > 2 else grads[-1],
        "g_L_zero_fraction": zero_fraction,
        "g_L_nonzero_median": nonzero_median,
        "max_block_growth": max_block_growth(hidden),
        "cos_per_layer": cos,
        "cos_valid": valid,
        "cos_defined": defined,
        "deep_cos": deep_mean(cos),
        "deep_cos_valid": all(valid[1:]),
    }
    if sg.layout == "tokens":
        record["hidden_norms_cls"] = hidden
    alignment = rule.weight_alignment()
    if alignment is not None:
        record["feedback_layers"] = list(alignment["layers"])
        record["feedback_angle"] = [float(v) for v in alignment["angle"]]
        record["feedback_norm_ratio"] = [float(v) for v in alignment["norm_ratio"]]
    return record, sg
