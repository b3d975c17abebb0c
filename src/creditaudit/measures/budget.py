"""ρ's compute budget: how many samples ρ uses, decided before its first forward.

With a budget ``budget_flops`` ρ uses only as many samples as the budget pays for (never
fewer than :data:`MIN_RHO_SAMPLES`), from the floating-point operations of one sample's
perturbed forwards, counted on one sample (:func:`rho_sample_flops`): the count depends on
the model's shapes only, so the same run gives the same samples on any machine under any
load.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from creditaudit.measures.working import WorkingCopy
from creditaudit.models.contract import ResidualNet

# ρ's compute budget never cuts it below this many samples (the jackknife needs two).
MIN_RHO_SAMPLES = 8


@torch.no_grad()
def rho_sample_flops(model: ResidualNet, x: Tensor, *, n_directions: int,
                     layers: Sequence[int] | None = None) -> int:
    """Floating-point operations of one sample's perturbed forwards for ρ: at each state in
    ``layers`` (default every state h_0 … h_L), ``1 + n_directions`` forwards from it (the
    unmoved state and one per direction) through ``model.forward_from``.

    Counted exactly on the first sample of ``x`` ``(N, …)`` by torch's ``FlopCounterMode``
    (matrix products and convolutions, 2 per multiply-add; elementwise operations are not
    counted), with attention run as its two batched matrix products — the fused kernels of
    some devices are missing from torch's table, and the count must not depend on the
    device. Depends on the model's shapes only: the same number on every machine, whatever
    its load.
    """
    states, _ = model.forward_states(x[:1])
    layers = range(len(states)) if layers is None else layers
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        for layer in layers:
            model.forward_from(layer, states[layer])
    return (1 + n_directions) * counter.get_total_flops()


@dataclass(frozen=True)
class RhoBudget:
    """How many samples ρ uses under a compute budget.

    ``asked``: the samples asked for (``n_samples``, at most N); ``sample_flops``: one
    sample's perturbed forwards (:func:`rho_sample_flops`); ``budget_flops``: the budget in
    floating-point operations (None: no budget). ``samples`` =
    min(asked, max(:data:`MIN_RHO_SAMPLES`, ⌊budget_flops / sample_flops⌋)).
    """

    asked: int
    sample_flops: int
    budget_flops: float | None

    @property
    def samples(self) -> int:
        if self.budget_flops is None:
            return self.asked
        affordable = math.floor(self.budget_flops / max(1, self.sample_flops))
        return min(self.asked, max(MIN_RHO_SAMPLES, affordable))

    @property
    def reached(self) -> bool:
        """Whether the budget holds fewer samples than asked for."""
        return self.samples < self.asked

    def describe(self) -> str:
        """What the budget did, for a progress line (empty when it held every sample)."""
        if not self.reached:
            return ""
        return (f"the budget of {self.budget_flops:.3g} FLOPs holds {self.samples} of the "
                f"{self.asked} samples asked for at {self.sample_flops:.3g} FLOPs each")


def rho_budget(working: WorkingCopy, asked: int, *, n_directions: int,
               budget_flops: float | None, layers: Sequence[int] | None = None
               ) -> RhoBudget:
    """The :class:`RhoBudget` of ρ on ``working``'s model with ``asked`` samples."""
    flops = rho_sample_flops(working.model, working.x, n_directions=n_directions,
                             layers=layers)
    return RhoBudget(min(asked, working.n), flops, budget_flops)
