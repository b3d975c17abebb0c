"""What the diagnostics measure at an epoch, typed once: :class:`EpochMeasures`.

The one type of an epoch's diagnostics: :func:`creditaudit.measures.epoch.epoch_diagnostics`
computes it, the training loop and the :class:`~creditaudit.run.recorder.Recorder` hand it
to the protocol and keep it in the epoch's entry
(:class:`creditaudit.records.EpochEntry` ``.measures``), and the run record writes its
fields as keys of the entry (the per-epoch keys of the original study). Each field carries
its documentation and domain (:func:`creditaudit.descriptions.fields.doc`;
``docs/records.md`` is generated from them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from creditaudit.deep_layers import deep_mean
from creditaudit.descriptions.fields import (
    COSINE,
    DEGREES,
    FRACTION,
    NONNEGATIVE,
    doc,
    finite_number,
)

# Why a state's cosine cos(a_l, g_l) is not a valid measurement (``cos_invalid``), the most
# fundamental first: a non-finite reference gradient, then a non-finite credit (neither has a
# direction, so no cosine can be measured), then a reference below the numerical floor (a
# cosine is measured, against noise).
GRADIENT_NOT_FINITE = "gradient_not_finite"
CREDIT_NOT_FINITE = "credit_not_finite"
BELOW_FLOOR = "reference_below_floor"
COSINE_INVALID = (GRADIENT_NOT_FINITE, CREDIT_NOT_FINITE, BELOW_FLOOR)
NOT_FINITE = (GRADIENT_NOT_FINITE, CREDIT_NOT_FINITE)


def deep_invalid(reasons: Sequence[str | None]) -> tuple[str, ...]:
    """The distinct reasons among the deep states' (l ≥ 1) of a per-state ``cos_invalid``
    list, most fundamental first; () when every deep cosine is valid."""
    found = set(reasons[1:])
    return tuple(reason for reason in COSINE_INVALID if reason in found)


def max_block_growth(norms: Sequence[float]) -> float:
    """max_l ‖h_{l+1}‖/‖h_l‖ over consecutive median norms (diagnostic (a)); inf after a
    zero norm, except 1 from a zero norm to a zero norm (a stream that stays exactly 0,
    e.g. behind dead ReLUs, does not grow); 1 for a single state."""
    ratios = [b / a if a > 0 else (1.0 if b == 0 else math.inf)
              for a, b in zip(norms[:-1], norms[1:])]
    return max(ratios) if ratios else 1.0


@dataclass
class EpochMeasures:
    """The diagnostics of one epoch on the evaluation set.

    Norms are medians over the evaluation samples of per-sample L2 norms; gradients follow
    the (1/128)·∂CE_i/∂h_l scale convention (the batch-mean loss of a batch of 128).
    Per-layer lists run over the states h_0 … h_L.
    """

    hidden_norms: list[float] = doc("median ‖h_l‖ per state l = 0 … L", required=True,
                                    domain=NONNEGATIVE)
    bp_grad_norms_per_sample_med: list[float] = doc(
        "median ‖g_l‖ per state (g_l = backprop gradient, 1/128 scale)", required=True,
        domain=NONNEGATIVE)
    g_L_zero_fraction: float = doc("fraction of samples whose g_L is exactly 0",
                                   required=True, domain=FRACTION)
    g_L_nonzero_median: float = doc("median ‖g_L‖ over the samples where it is not 0 (NaN "
                                    "where every sample's g_L is 0)", required=True,
                                    domain=NONNEGATIVE)
    cos_per_layer: list[float] = doc(
        "cos(a_l, g_l) per state: per sample, then mean over samples", required=True,
        domain=COSINE)
    cos_valid: list[bool] | None = doc(
        "per state: whether the cosine is a valid measurement: the reference ‖g_l‖ is at or "
        "above the floor (1e-7; a cosine against a gradient below the floor is measured "
        "against numerical noise) and no sample's credit or reference gradient is NaN/Inf "
        "(`cos_invalid` says which failed)")
    cos_invalid: list[str | None] | None = doc(
        "per state: why the cosine is not valid, null where it is: `gradient_not_finite` "
        "(some sample's reference gradient is NaN/Inf), `credit_not_finite` (some sample's "
        "credit is NaN/Inf: the rule's credit could not be measured), "
        "`reference_below_floor` (‖g_l‖ below the floor). Records from before it lack it")
    cos_defined: list[float] | None = doc(
        "per state: the fraction of samples cos_per_layer averages over (a sample whose "
        "credit or gradient is exactly zero has no direction and is left out, as is one "
        "whose credit or gradient is NaN/Inf, which `cos_invalid` then names)",
        domain=FRACTION)
    feedback_layers: list[str] | None = doc(
        "rules whose feedback matrix B stands in for one weight matrix W in the backward "
        "pass (fa-linear, usf, brsf, frsf, kp): the names of those layers, in module order")
    feedback_angle: list[float] | None = doc(
        "per feedback layer: the angle between B and W in degrees, of the flattened "
        "matrices (Lillicrap's angle between B and Wᵀ; BioTorch's layer alignment): 0 = B ∝ W, "
        "90 = unrelated", domain=DEGREES)
    feedback_norm_ratio: list[float] | None = doc(
        "per feedback layer: ‖B‖/‖W‖ (Frobenius norms; BioTorch's weight ratio)",
        domain=NONNEGATIVE)

    # --- values read from the stored ones (each number is stored once) -------------------
    @property
    def h_L_norm(self) -> float | None:
        """Median ‖h_L‖ (deepest state)."""
        return self.hidden_norms[-1] if self.hidden_norms else None

    @property
    def g_L_norm(self) -> float | None:
        """Median ‖g_L‖: the statistic of diagnostic (b)."""
        grads = self.bp_grad_norms_per_sample_med
        return grads[-1] if grads else None

    @property
    def g_2_norm(self) -> float | None:
        """Median ‖g_2‖ (the original study's mid-depth gradient; ‖g_L‖ for L < 2)."""
        grads = self.bp_grad_norms_per_sample_med
        if not grads:
            return None
        return grads[2] if len(grads) > 2 else grads[-1]

    @property
    def max_block_growth(self) -> float | None:
        """max_l ‖h_{l+1}‖/‖h_l‖ of the median norms: the statistic of diagnostic (a)."""
        return max_block_growth(self.hidden_norms) if self.hidden_norms else None

    @property
    def deep_cos(self) -> float | None:
        """Mean of ``cos_per_layer`` over the deep states l ≥ 1 (finite values)."""
        return finite_number(deep_mean(self.cos_per_layer))

    @property
    def deep_cos_valid(self) -> bool | None:
        """Whether every deep state's cosine is valid (None: not recorded)."""
        return None if self.cos_valid is None else all(self.cos_valid[1:])

    @property
    def deep_cos_invalid(self) -> tuple[str, ...] | None:
        """Why some deep state's cosine is not valid (:func:`deep_invalid`; () when all are,
        None: not recorded). Records from before ``cos_invalid``: an invalid cosine there
        was one against a reference below the floor, the only check made then."""
        if self.cos_invalid is not None:
            return deep_invalid(self.cos_invalid)
        if self.cos_valid is None:
            return None
        return deep_invalid([None if ok else BELOW_FLOOR for ok in self.cos_valid])


# The values EpochMeasures derives from its fields (properties), by record key.
MEASURES_DERIVED = ("h_L_norm", "g_L_norm", "g_2_norm", "max_block_growth", "deep_cos",
                    "deep_cos_valid")
