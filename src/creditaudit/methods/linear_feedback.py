"""Rules that keep backprop's graph and replace every Linear's weight in the backward pass.

The field's per-layer feedback rules — FA as Lillicrap et al. (2016) and BioTorch define it,
the sign-concordant uSF, brSF, frSF (Liao et al. 2016; Moskovitz et al. 2018) and
Kolen–Pollack (Akrout et al. 2019) — train end to end like backprop, with one change: each
``nn.Linear`` computes its input gradient with a feedback matrix B of W's shape (out × in)
instead of W,

    δ_in = δ_out · B          (row form; autograd's exact backward is δ_out · W),

so in Lillicrap's column notation Bᵀ stands where Wᵀ stood. LayerNorm, GELU, attention, the
identity skips and every weight gradient (δ_outᵀ · x) stay exact; only the signal passed
*down* through a Linear changes. A rule's credit a_l is the signal this backward pass leaves
at state h_l (batch-mean scale, like backprop's g_l); with B = W it is g_l exactly.

Weight alignment — the angle between B and W (equal to the angle between Lillicrap's B and
Wᵀ) and ‖B‖/‖W‖ (Frobenius), BioTorch's two layer metrics — is reported per layer through
:meth:`LinearFeedbackRule.weight_alignment` and lands in every per-epoch record.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor, nn
from torch.autograd.function import FunctionCtx, once_differentiable
from torch.nn import functional as F

from creditaudit.config import MethodConfig
from creditaudit.errors import ModelContractError
from creditaudit.methods.base import CreditRule, StepResult, loss_precision, step_result
from creditaudit.methods.bp import end_to_end_objective
from creditaudit.models.contract import ResidualNet

# Layers whose weights act on an input the rule would have to feed a replaced backward
# through, but which this module cannot patch (only nn.Linear is supported).
UNSUPPORTED = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.MultiheadAttention, nn.Bilinear)


class _FeedbackLinear(torch.autograd.Function):
    """y = x·Wᵀ + b forward; backward δx = δy·B, δW = δyᵀ·x, δb = Σ δy (x: (…, in))."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: Tensor, weight: Tensor, bias: Tensor | None,
                feedback: Tensor) -> Tensor:
        ctx.save_for_backward(x, feedback)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        # Under autocast this linear runs in bf16 exactly as nn.Linear's would.
        return F.linear(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: Tensor
                 ) -> tuple[Tensor | None, Tensor | None, Tensor | None, None]:
        x, feedback = ctx.saved_tensors
        weight_dtype, bias_dtype = ctx.dtypes
        need_x, need_w, need_b, _ = ctx.needs_input_grad
        g = grad_out.reshape(-1, grad_out.shape[-1])
        grad_x = grad_w = grad_b = None
        if need_x:
            grad_x = g.mm(feedback.to(g.dtype)).view(*grad_out.shape[:-1], feedback.shape[1])
            grad_x = grad_x.to(x.dtype)
        if need_w:
            grad_w = g.t().mm(x.reshape(-1, x.shape[-1]).to(g.dtype)).to(weight_dtype)
        if need_b:
            grad_b = g.sum(dim=0).to(bias_dtype)
        return grad_x, grad_w, grad_b, None


def _feedback_forward(layer: nn.Linear, feedback: Tensor, called: set[int], x: Tensor
                      ) -> Tensor:
    called.add(id(layer))
    return _FeedbackLinear.apply(x, layer.weight, layer.bias, feedback)


def feedback_layers(model: nn.Module, rule: str) -> list[tuple[str, nn.Linear]]:
    """Every ``nn.Linear`` of ``model`` with its name, in module order.

    ModelContractError when a block or the readout holds a weight layer whose backward this
    module cannot replace (convolutions, ``nn.MultiheadAttention``); the embedding may hold
    them, since nothing trainable sits below it to receive their input gradient.
    """
    layers = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            layers.append((name, module))
        elif isinstance(module, UNSUPPORTED) and name.split(".")[0] != "embed":
            raise ModelContractError(
                f"--method {rule} replaces the backward of nn.Linear layers only, but "
                f"{type(model).__name__}.{name} is a {type(module).__name__}; use an MLP or "
                "ViT architecture (or a block-level rule such as fa or dfa)")
    if not layers:
        raise ModelContractError(f"--method {rule} needs nn.Linear layers; "
                                 f"{type(model).__name__} has none")
    return layers


@contextlib.contextmanager
def replaced_backward(layers: Sequence[tuple[str, nn.Linear]], feedback: Sequence[Tensor]
                      ) -> Iterator[None]:
    """Inside the block, layer i's forward builds a graph whose backward uses feedback[i].

    Graphs built inside keep their feedback after the block ends (autograd saved it), so the
    backward pass may run outside. ModelContractError when a layer was not called as a
    module (its weight used directly, e.g. by a functional attention): its backward would
    silently stay exact.
    """
    called: set[int] = set()
    own = [layer.__dict__.get("forward") for _, layer in layers]
    for (_, layer), b in zip(layers, feedback, strict=True):
        # An instance attribute shadows the class's forward for this module only.
        layer.forward = functools.partial(_feedback_forward, layer, b, called)
    try:
        yield
    finally:
        for (_, layer), previous in zip(layers, own):
            del layer.forward
            if previous is not None:
                layer.forward = previous
    skipped = [name for name, layer in layers if id(layer) not in called]
    if skipped:
        raise ModelContractError(
            f"the Linear layer(s) {', '.join(skipped[:3])} were not called as modules in the "
            "forward pass (their weights are used directly), so their backward cannot be "
            "replaced; call every nn.Linear as a module")


def matrix_alignment(feedback: Tensor, weight: Tensor) -> tuple[float, float]:
    """(∠(B, W) in degrees, ‖B‖/‖W‖) of two same-shaped matrices, in float64.

    The angle is that of the flattened matrices (BioTorch's ``compute_matrix_angle``, without
    its eps); NaN when either is exactly zero.
    """
    b = feedback.detach().double().flatten()
    w = weight.detach().to(b.device).double().flatten()
    nb, nw = float(torch.linalg.vector_norm(b)), float(torch.linalg.vector_norm(w))
    if nb == 0.0 or nw == 0.0:
        return math.nan, (nb / nw if nw > 0 else math.nan)
    cos = max(-1.0, min(1.0, float(b @ w) / (nb * nw)))
    return math.degrees(math.acos(cos)), nb / nw


def weight_shapes(layers: Sequence[tuple[str, nn.Linear]]) -> list[tuple[int, ...]]:
    """W's shape (out, in) per layer: the shapes of the feedback matrices."""
    return [tuple(layer.weight.shape) for _, layer in layers]


class LinearFeedbackRule(CreditRule):
    """End-to-end training through a backward pass with per-Linear feedback matrices.

    Subclasses give :meth:`feedback_matrices` (B per layer of :attr:`layers`, W's shape,
    as credits and the next step use them) and may draw new ones per step in
    :meth:`step_feedback`. Not local: the blocks are not trained on the local surrogate but
    by the modified backward pass of CE + λΣ‖f_l‖².
    """

    local = False

    def __init__(self, model: ResidualNet, config: MethodConfig, *, n_classes: int,
                 generator: torch.Generator) -> None:
        self.layers = feedback_layers(model, type(self).name)
        super().__init__(model, config, n_classes=n_classes, generator=generator)

    def feedback_matrices(self) -> list[Tensor]:
        """B per layer (shape of its W) as the credit and the next step use them."""
        raise NotImplementedError

    def step_feedback(self) -> list[Tensor]:
        """B for the coming training step (brSF draws new magnitudes here)."""
        return self.feedback_matrices()

    def weights(self) -> list[Tensor]:
        return [layer.weight for _, layer in self.layers]

    def credits(self, x: Tensor, y: Tensor) -> list[Tensor]:
        """The modified backward's signal at h_0 … h_L for the batch-mean CE (detached)."""
        with torch.enable_grad(), replaced_backward(self.layers, self.feedback_matrices()):
            states, logits = self.model.forward_states(x)
            ce = F.cross_entropy(loss_precision(logits), y)
            # States only: no parameter's .grad is touched.
            grads = torch.autograd.grad(ce, states)
        return [g.detach() for g in grads]

    def train_step(self, x: Tensor, y: Tensor, optimizer: torch.optim.Optimizer) -> StepResult:
        optimizer.zero_grad(set_to_none=True)
        feedback = self.step_feedback()
        with self.autocast(), replaced_backward(self.layers, feedback):
            objective, ce, logits, h_last = end_to_end_objective(self.model, x, y,
                                                                 self.config.penalty)
        result = step_result(ce, logits, y, h_last)
        if result.finite:
            objective.backward()
            optimizer.step()
        return result

    def weight_alignment(self) -> dict[str, list]:
        pairs = [matrix_alignment(b, w)
                 for b, w in zip(self.feedback_matrices(), self.weights(), strict=True)]
        return {"layers": [name for name, _ in self.layers],
                "angle": [angle for angle, _ in pairs],
                "norm_ratio": [ratio for _, ratio in pairs]}


def sign_feedback(magnitudes: Sequence[Tensor], weights: Sequence[Tensor]) -> list[Tensor]:
    """B = |M| ∘ sign(W) per layer, in W's dtype and on its device (sign(0) = 0)."""
    return [m.to(device=w.device, dtype=w.dtype).abs() * torch.sign(w.detach())
            for m, w in zip(magnitudes, weights, strict=True)]


def magnitude_scale(shape: tuple[int, ...], scale: float) -> float:
    """s/√out: the RMS of a feedback entry N(0, s²/fan_in), fan_in = out of the backward map."""
    return scale / shape[0] ** 0.5
