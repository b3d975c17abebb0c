"""Is the backward the diagnostics use the one the reference check verified?

The state-by-state check (:mod:`creditaudit.measures.reference_check`) verifies the backward
of a float64 copy of the model on four probes. The diagnostics take gradients of the model
itself: in its own dtype (float32, bfloat16), through the kernels that dtype selects, on
batches of up to :data:`AS_USED_BATCH` samples. A backward that is right only in float64 (a
hand-written kernel taken for float32 inputs only) or only on small batches (a fused
kernel's tiling) passes the probes and would make every cosine a comparison with another
gradient. So the check goes on: ∂CE/∂h at h_0 and h_L of the model as the diagnostics run it
— its dtype, one batch of the first :data:`AS_USED_BATCH` evaluation samples with the probes
in their places — against the verified float64 gradient at the same probes.

They agree within :data:`TOLERANCE` of the dtype (relative, per probe): float32 rounding
through a deep network stays below 1e-4 of the gradient; a wrong backward, such as FA's, is
off by 0.4 or more. A probe whose loss is too small for the dtype to resolve its gradient
(a confident sample's p − 1 cancels in float32) says nothing, and so does every probe when
the model's forward on the batch differs from the float64 one by more than the tolerance: a
model whose samples interact in eval mode (capacity-routed experts) computes another
function on another batch, which the float64 check did not verify either way.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor
from torch.nn import functional as F

from creditaudit.measures.gradients import StatesFn
from creditaudit.measures.reference_modules import FIX, ReferenceGradientError

AS_USED_BATCH = 512  # the largest batch the diagnostics take gradients on (COSINE_CHUNK)
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-2, torch.float16: 0.1,
             torch.bfloat16: 0.25}  # relative difference from the float64 gradient
RESOLVED = 10.0  # a probe is compared when its loss exceeds RESOLVED·eps/tolerance


class _Float64States(Protocol):
    def forward_states(self, x: Tensor) -> tuple[list[Tensor], Tensor]: ...


def _end_gradients(states_fn: StatesFn, x: Tensor, y: Tensor
                   ) -> tuple[list[Tensor], Tensor, Tensor]:
    """([∂CE/∂h_0, ∂CE/∂h_L] flattened per sample, logits, per-sample losses) of
    ``states_fn`` on ``x`` ``(n, …)``, labels ``y`` ``(n,)``: the gradients and losses in
    float64 on the CPU, the logits as computed (detached)."""
    with torch.enable_grad():
        states, logits = states_fn(x)
        ends = [states[0], states[-1]]
        losses = F.cross_entropy(logits, y, reduction="none")
        grads = torch.autograd.grad(losses.sum(), ends, allow_unused=True)
    flat = [(torch.zeros_like(h) if g is None else g).detach().flatten(1).double().cpu()
            for g, h in zip(grads, ends)]
    return flat, logits.detach(), losses.detach().double().cpu()


def _precision(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The precision ``dtype``'s products run in on ``device``: float32 on a GPU whose
    matrix products or convolutions may use TF32 (10 mantissa bits) counts as float16."""
    tf32 = (torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32
            or torch.get_float32_matmul_precision() != "highest")
    if dtype == torch.float32 and device.type == "cuda" and tf32:
        return torch.float16
    return dtype


def _relative(a: Tensor, b: Tensor) -> Tensor:
    """‖a_i − b_i‖ / ‖b_i‖ per row ``(k,)`` (inf where b_i = 0 and a_i ≠ 0, 0 where both
    are 0, inf where a_i or b_i is not finite: NaN would compare as agreeing)."""
    gap = torch.linalg.vector_norm(a - b, dim=1)
    size = torch.linalg.vector_norm(b, dim=1)
    relative = torch.where(size > 0, gap / size.clamp_min(torch.finfo(torch.float64).tiny),
                           torch.where(gap > 0, torch.inf, 0.0))
    return relative.nan_to_num(nan=torch.inf)


def check_as_used(states_fn: StatesFn, work: _Float64States, x: Tensor, y: Tensor,
                  keep: Tensor, probes: Tensor, probes64: Tensor) -> str:
    """Compare the model's own backward on the diagnostics' batch with the verified float64
    one (module docstring). ``states_fn``: the model as the diagnostics run it; ``work``:
    its float64 copy, whose backward agreed with central differences at ``probes64``;
    ``x`` ``(N, …)``, ``y`` ``(N,)``: the evaluation set; ``keep`` ``(k,)``: the probes'
    indices among its first samples; ``probes``: the probe inputs in ``x``'s dtype (moved
    off ties), ``probes64`` the same in float64.

    Raises :class:`ReferenceGradientError` when most compared probes disagree at h_0 or at
    h_L; returns what was compared, to end the check's detail ("" when nothing was)."""
    n = min(x.shape[0], AS_USED_BATCH)
    batch = x[:n].clone()
    batch[keep.to(batch.device)] = probes.to(batch.device)
    used, used_logits, _ = _end_gradients(states_fn, batch, y[:n])
    rows = keep.cpu()
    reference, logits64, losses64 = _end_gradients(work.forward_states, probes64,
                                                   y[keep.to(y.device)])
    dtype = used_logits.dtype
    precision = _precision(dtype, used_logits.device)
    tolerance = TOLERANCE.get(precision, TOLERANCE[torch.bfloat16])
    kind = str(dtype).removeprefix("torch.")
    if not bool(used_logits.isfinite().all()):
        return (f"; its own {kind} forward on a batch of {n} samples is not finite (it "
                "overflows), so its backward, which the diagnostics use, was not compared")
    if bool((_relative(used_logits.double().cpu()[rows], logits64.cpu()) > tolerance).any()):
        return ""  # another function on this batch (module docstring): nothing to compare
    resolved = losses64 > RESOLVED * torch.finfo(precision).eps / tolerance
    if not bool(resolved.any()):
        return ""
    for name, got, want in zip(("h_0", "h_L"), used, reference, strict=True):
        off = _relative(got[rows][resolved], want[resolved])
        bad = int((off > tolerance).sum())
        if bad > 0 and bad >= int((off <= tolerance).sum()):
            raise ReferenceGradientError(
                f"the model's own {kind} backward on a batch of {n} samples, which the "
                f"diagnostics use, differs at {name} by {float(off.max()):.2g} (relative) "
                "from its float64 backward, which agrees with central differences on the "
                f"probes: the backward depends on the dtype or the batch size; {FIX}")
    return (f"; its own {kind} backward on a batch of {n} samples gives the same gradients "
            f"(within {tolerance:g})")


__all__ = ["AS_USED_BATCH", "TOLERANCE", "check_as_used"]
