"""What is measured on the evaluation set at an epoch (science.md §2, §5, §6).

:func:`epoch_diagnostics` returns an :class:`~creditaudit.descriptions.EpochMeasures` —
the per-layer norms, reference gradient norms, cosines and their validity, each computed
once — plus the raw :class:`StateGradients` the protocol's diagnostics may look at. The
same object goes to the protocol (which reads its norms without recomputing them) and into
the epoch's entry of the run record (:class:`creditaudit.records.EpochEntry` ``.measures``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from creditaudit.descriptions import EpochMeasures
from creditaudit.measures.alignment import cosine_invalid, layer_cosine_coverage
from creditaudit.measures.gradients import (
    REFERENCE_FLOOR,
    StateGradients,
    median_norms,
    state_gradients,
    zero_gradient_stats,
)
from creditaudit.methods.base import CreditRule
from creditaudit.methods.bp import BackpropRule
from creditaudit.models.contract import summary_vectors


def rule_credits(rule: CreditRule, x: Tensor, y: Tensor, *, chunk: int = 512) -> list[Tensor]:
    """The rule's per-sample credit summaries ``(N, d)`` per layer, in chunks."""
    parts = [rule.credits(x[s:s + chunk], y[s:s + chunk]) for s in range(0, x.shape[0], chunk)]
    return [torch.cat([summary_vectors(p[l]) for p in parts]) for l in range(len(parts[0]))]


def epoch_diagnostics(rule: CreditRule, x: Tensor, y: Tensor
                      ) -> tuple[EpochMeasures, StateGradients]:
    """Norms, per-sample BP gradient norms and per-layer cosines on the evaluation set.

    Runs under a forked RNG so that no random stream used by training advances: weights
    trained with and without diagnostics are bit-identical. Returns the measures and the
    raw :class:`StateGradients` (for the protocol).
    """
    model = rule.model
    devices = [x.device] if x.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        sg = state_gradients(model.forward_states, x, y)
        # Backprop's credits (BP, frozen) are the reference gradients themselves (up to a
        # scale the cosine ignores): reuse them rather than run the same forward and
        # backward twice.
        exact = type(rule).credits is BackpropRule.credits
        credits = sg.grads if exact else rule_credits(rule, x, y)
    grads = median_norms(sg.grads)
    cos, defined = layer_cosine_coverage(credits, sg.grads)
    invalid = cosine_invalid(credits, sg.grads, grads, REFERENCE_FLOOR)
    zero_fraction, nonzero_median = zero_gradient_stats(sg.grads[-1])
    alignment = rule.weight_alignment()
    feedback = {} if alignment is None else {
        "feedback_layers": list(alignment["layers"]),
        "feedback_angle": [float(v) for v in alignment["angle"]],
        "feedback_norm_ratio": [float(v) for v in alignment["norm_ratio"]]}
    measures = EpochMeasures(
        hidden_norms=median_norms(sg.states), bp_grad_norms_per_sample_med=grads,
        g_L_zero_fraction=zero_fraction, g_L_nonzero_median=nonzero_median,
        cos_per_layer=cos, cos_valid=[why is None for why in invalid], cos_invalid=invalid,
        cos_defined=defined, **feedback)
    return measures, sg
