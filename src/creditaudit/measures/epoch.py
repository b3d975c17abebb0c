"""What is measured on the evaluation set at an epoch (science.md §2, §5, §6), typed.

:func:`epoch_diagnostics` returns an :class:`EpochMeasures` — the per-layer norms, reference
gradient norms, cosines and their validity, each computed once — plus the raw
:class:`StateGradients` the protocol's diagnostics may look at. The run record stores the
measures field for field (:class:`creditaudit.records.EpochEntry` has the same names) and the
protocol reads them without recomputing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from creditaudit.deep_layers import deep_mean
from creditaudit.measures.alignment import layer_cosine_coverage
from creditaudit.measures.gradients import (
    REFERENCE_FLOOR,
    StateGradients,
    max_block_growth,
    median_norms,
    state_gradients,
    zero_gradient_stats,
)
from creditaudit.methods.base import CreditRule
from creditaudit.methods.bp import BackpropRule
from creditaudit.models.contract import summary_vectors


@dataclass
class EpochMeasures:
    """The diagnostics of one evaluation set (names as the run record stores them).

    Norms are medians over samples of per-sample L2 norms; gradients follow the
    (1/128)·∂CE_i/∂h_l convention. Per-layer lists run over h_0 … h_L. ``cos_valid[l]`` is
    False where the reference ‖g_l‖ is below the floor (1e-7); ``cos_defined[l]`` is the
    share of samples the cosine averages over (a zero credit has no direction).
    ``feedback_*``: the rule's per-layer feedback alignment, where it has one.
    """

    hidden_norms: list[float]
    bp_grad_norms_per_sample_med: list[float]
    g_L_zero_fraction: float
    g_L_nonzero_median: float
    cos_per_layer: list[float]
    cos_valid: list[bool]
    cos_defined: list[float]
    layout: str = "vectors"
    feedback_layers: list[str] | None = None
    feedback_angle: list[float] | None = None
    feedback_norm_ratio: list[float] | None = None

    @property
    def grad_norms(self) -> list[float]:
        return self.bp_grad_norms_per_sample_med

    @property
    def h_L_norm(self) -> float:
        return self.hidden_norms[-1]

    @property
    def g_L_norm(self) -> float:
        return self.bp_grad_norms_per_sample_med[-1]

    @property
    def max_block_growth(self) -> float:
        return max_block_growth(self.hidden_norms)

    @property
    def deep_cos(self) -> float | None:
        return deep_mean(self.cos_per_layer)

    def record_fields(self) -> dict[str, object]:
        """The fields a run record's epoch entry takes over, by name."""
        fields: dict[str, object] = {
            "hidden_norms": self.hidden_norms,
            "bp_grad_norms_per_sample_med": self.bp_grad_norms_per_sample_med,
            "g_L_zero_fraction": self.g_L_zero_fraction,
            "g_L_nonzero_median": self.g_L_nonzero_median,
            "cos_per_layer": self.cos_per_layer, "cos_valid": self.cos_valid,
            "cos_defined": self.cos_defined,
        }
        if self.feedback_layers is not None:
            fields.update(feedback_layers=self.feedback_layers,
                          feedback_angle=self.feedback_angle,
                          feedback_norm_ratio=self.feedback_norm_ratio)
        return fields


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
    zero_fraction, nonzero_median = zero_gradient_stats(sg.grads[-1])
    measures = EpochMeasures(
        hidden_norms=median_norms(sg.states), bp_grad_norms_per_sample_med=grads,
        g_L_zero_fraction=zero_fraction, g_L_nonzero_median=nonzero_median,
        cos_per_layer=cos, cos_valid=[bool(g >= REFERENCE_FLOOR) for g in grads],
        cos_defined=defined, layout=sg.layout)
    alignment = rule.weight_alignment()
    if alignment is not None:
        measures.feedback_layers = list(alignment["layers"])
        measures.feedback_angle = [float(v) for v in alignment["angle"]]
        measures.feedback_norm_ratio = [float(v) for v in alignment["norm_ratio"]]
    return measures, sg
