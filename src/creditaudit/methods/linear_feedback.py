"""Rules that keep backprop's graph and replace every weight layer's weight in the backward pass.

The field's per-layer feedback rules — FA as Lillicrap et al. (2016) and BioTorch define it,
the sign-concordant uSF, brSF, frSF (Liao et al. 2016; Moskovitz et al. 2018) and
Kolen–Pollack (Akrout et al. 2019) — train end to end like backprop, with one change: each
``nn.Linear`` computes its input gradient with a feedback matrix B of W's shape (out × in)
instead of W,

    δ_in = δ_out · B          (row form; autograd's exact backward is δ_out · W),

so in Lillicrap's column notation Bᵀ stands where Wᵀ stood. LayerNorm, GELU, attention, the
identity skips and every weight gradient (δ_outᵀ · x) stay exact; only the signal passed
*down* through a weight layer changes. A rule's credit a_l is the signal this backward pass
leaves at state h_l (batch-mean scale, like backprop's g_l); with B = W it is g_l exactly.

Convolutions (``nn.Conv2d``, as in BioTorch) work the same way: B is a kernel of W's shape
(out_channels, in_channels/groups, kh, kw) — for a depthwise convolution (groups = channels)
one k×k kernel per channel, shape (C, 1, k, k) — and the input gradient is the adjoint of
the convolution with B instead of W, δ_in = conv_transpose(δ_out; B), with W's stride,
padding, dilation and groups; δW and δb stay exact. The embedding's convolutions (the patch
embeddings of ViT-Mini and ConvMixer) keep their exact backward: their input is the data,
so the signal they pass down trains nothing.

Feedback scale: entries of a random B are N(0, s²/n) and uSF's magnitude is s/√n, where n
is the fan-in of the backward map — how many entries of δ_out sum into one entry of δ_in:
out for a Linear, (out_channels/groups)·kh·kw for a Conv2d. BioTorch takes its fan counts
from ``torch.nn.init._calculate_fan_in_and_fan_out``, whose fan_out = out_channels·kh·kw
is the same number for every ungrouped convolution (and out for a Linear); for a grouped
convolution it still counts all out_channels, although only out_channels/groups of them
read a given input channel — a depthwise B scaled that way would be √channels times smaller
than every other layer's, so the groups are divided out here. Stride and borders are
ignored, as in both libraries.

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
from torch.autograd.function import FunctionCtx
from torch.nn import functional as F

from creditaudit.config import MethodConfig
from creditaudit.errors import ModelContractError
from creditaudit.methods import adapted_feedback
from creditaudit.methods.adapted_feedback import Feedback
from creditaudit.methods.base import (
    CreditRule,
    FeedbackOptions,
    RuleOptionsT,
    StepResult,
    loss_precision,
)
from creditaudit.methods.bp import end_to_end_step
from creditaudit.methods.feedback import draw_feedback
from creditaudit.models.adapted import AdaptedModel
from creditaudit.models.contract import ResidualNet

# Layers whose weights act on an input the rule would have to feed a replaced backward
# through, but which this module cannot patch (only nn.Linear and nn.Conv2d are supported).
# Transposed convolutions are not subclasses of nn.Conv2d: without this entry their backward
# would silently stay exact.
UNSUPPORTED = (nn.Conv1d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
               nn.ConvTranspose3d, nn.MultiheadAttention, nn.Bilinear)

FeedbackLayer = nn.Linear | nn.Conv2d


class SignFeedback:
    """B = |M| ∘ sign(W) (or s·sign(W) for a scalar magnitude s), built when called: a layer
    whose input gradient nothing needs (the first one, reading the data) never builds it.

    The backward pass calls it between the forward and the optimiser's step, so W is the W
    of the forward pass; a W changed in place in between is refused (its version is kept).
    """

    __slots__ = ("magnitude", "weight", "version")

    def __init__(self, magnitude: Tensor | float, weight: Tensor) -> None:
        self.magnitude, self.weight, self.version = magnitude, weight, weight._version

    def __call__(self) -> Tensor:
        if self.weight._version != self.version:
            raise RuntimeError("a weight was modified in place between a feedback rule's "
                               "forward and backward pass; step the optimiser after backward")
        sign = torch.sign(self.weight.detach())
        if isinstance(self.magnitude, Tensor):
            return self.magnitude.to(device=sign.device, dtype=sign.dtype).abs() * sign
        return self.magnitude * sign


def _as_dtype(tensor: Tensor, dtype: torch.dtype | None) -> Tensor:
    """``tensor`` in ``dtype``, without the dispatch of a cast that changes nothing."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def _save_feedback(ctx: FunctionCtx, x: Tensor, weight: Tensor, feedback: Feedback) -> None:
    """Save x and B — or, for B given as the function that builds it (:class:`SignFeedback`),
    x and W (of B's shape: a convolution's backward needs a kernel of that shape for δW)."""
    if isinstance(feedback, Tensor):
        ctx.save_for_backward(x, feedback)
        ctx.build = None
    else:
        ctx.save_for_backward(x, weight)
        ctx.build = feedback


def _saved_feedback(ctx: FunctionCtx, saved: tuple[Tensor, ...]) -> Tensor:
    return saved[1] if ctx.build is None else ctx.build()


class _FeedbackLinear(torch.autograd.Function):
    """y = x·Wᵀ + b forward; backward δx = δy·B, δW = δyᵀ·x, δb = Σ δy (x: (…, in)).

    Not wrapped in ``once_differentiable`` (its wrapper cost ~15 µs a layer a step): without
    create_graph the backward runs without grad mode anyway.
    """

    @staticmethod
    def forward(ctx: FunctionCtx, x: Tensor, weight: Tensor, bias: Tensor | None,
                feedback: Feedback) -> Tensor:
        _save_feedback(ctx, x, weight, feedback)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        # Under autocast this linear runs in bf16 exactly as nn.Linear's would.
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: FunctionCtx, grad_out: Tensor
                 ) -> tuple[Tensor | None, Tensor | None, Tensor | None, None]:
        saved = ctx.saved_tensors
        x = saved[0]
        weight_dtype, bias_dtype = ctx.dtypes
        need_x, need_w, need_b, _ = ctx.needs_input_grad
        g = grad_out if grad_out.dim() == 2 else grad_out.reshape(-1, grad_out.shape[-1])
        grad_x = grad_w = grad_b = None
        if need_x:
            feedback = _saved_feedback(ctx, saved)
            grad_x = g.mm(_as_dtype(feedback, g.dtype))
            if grad_out.dim() != 2:
                grad_x = grad_x.view(*grad_out.shape[:-1], feedback.shape[1])
            grad_x = _as_dtype(grad_x, x.dtype)
        if need_w:
            x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
            grad_w = _as_dtype(g.t().mm(_as_dtype(x2, g.dtype)), weight_dtype)
        if need_b:
            grad_b = _as_dtype(g.sum(dim=0), bias_dtype)
        return grad_x, grad_w, grad_b, None


class _FeedbackConv2d(torch.autograd.Function):
    """y = conv2d(x, W, b) forward; backward δx = conv2d_input(δy; B), δW and δb exact.

    x: (N, C_in, H, W); W, B: (C_out, C_in/groups, kh, kw); y: (N, C_out, H', W'). δx is the
    adjoint of x ↦ conv2d(x, B) applied to δy: ⟨δy, conv2d(x, B)⟩ = ⟨δx, x⟩ for every x.
    """

    @staticmethod
    def forward(ctx: FunctionCtx, x: Tensor, weight: Tensor, bias: Tensor | None,
                feedback: Feedback, stride: tuple[int, int], padding: tuple[int, int],
                dilation: tuple[int, int], groups: int) -> Tensor:
        _save_feedback(ctx, x, weight, feedback)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        ctx.geometry = (stride, padding, dilation, groups)
        # Under autocast this convolution runs in bf16 exactly as nn.Conv2d's would.
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx: FunctionCtx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        saved = ctx.saved_tensors
        x = saved[0]
        weight_dtype, bias_dtype = ctx.dtypes
        stride, padding, dilation, groups = ctx.geometry
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dtype = grad_out.dtype
        # B is built only when δx is needed; δW and δb read only the kernel's shape, so the
        # saved W or B serves for them alone.
        kernel = _saved_feedback(ctx, saved) if need_x else saved[1]
        # The op autograd's own convolution backward calls, with B in W's place: it computes
        # δx from the kernel it is given, and δW and δb from x and δy alone (so with B = W
        # this is backprop's backward bit for bit).
        grad_x, grad_w, grad_b = torch.ops.aten.convolution_backward(
            grad_out, _as_dtype(x, dtype), _as_dtype(kernel, dtype),
            [kernel.shape[0]] if need_b else None, list(stride), list(padding),
            list(dilation), False, [0, 0], groups, [need_x, need_w, need_b])
        return (_as_dtype(grad_x, x.dtype) if need_x else None,
                _as_dtype(grad_w, weight_dtype) if need_w else None,
                _as_dtype(grad_b, bias_dtype) if need_b else None,
                None, None, None, None, None)


def _conv_input(layer: nn.Conv2d, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
    """(x, p): x padded as ``layer`` pads it before convolving, and the symmetric zero padding
    p the convolution itself applies — so that conv2d(x, W, padding=p) is ``layer(x)``.

    The explicit padding (non-zero padding modes; the extra row/column of an asymmetric
    "same" padding, which ATen puts at the end) is ordinary autograd: its backward is exact.
    """
    if layer.padding_mode != "zeros":
        # nn.Conv2d's own rule: pad with the mode, then convolve without padding.
        return F.pad(x, layer._reversed_padding_repeated_twice, mode=layer.padding_mode), (0, 0)
    padding = layer.padding
    if padding == "valid":
        return x, (0, 0)
    if padding == "same":
        total = [d * (k - 1) for d, k in zip(layer.dilation, layer.kernel_size, strict=True)]
        extra = [t % 2 for t in total]
        if any(extra):
            x = F.pad(x, (0, extra[1], 0, extra[0]))
        return x, (total[0] // 2, total[1] // 2)
    assert not isinstance(padding, str)  # nn.Conv2d allows only "valid" and "same"
    pad_h, pad_w = padding  # nn.Conv2d keeps an int padding as a pair
    return x, (pad_h, pad_w)


def _feedback_forward(layer: FeedbackLayer, feedback: Feedback, called: set[int], x: Tensor
                      ) -> Tensor:
    called.add(id(layer))
    if isinstance(layer, nn.Conv2d):
        x, padding = _conv_input(layer, x)
        return _FeedbackConv2d.apply(x, layer.weight, layer.bias, feedback, layer.stride,
                                     padding, layer.dilation, layer.groups)
    return _FeedbackLinear.apply(x, layer.weight, layer.bias, feedback)


def feedback_layers(model: nn.Module, rule: str) -> list[tuple[str, FeedbackLayer]]:
    """Every ``nn.Linear`` and every ``nn.Conv2d`` outside the embedding, with its name, in
    module order.

    ModelContractError when a block or the readout holds a weight layer whose backward this
    module cannot replace (Conv1d/3d, transposed convolutions, ``nn.MultiheadAttention``,
    ``nn.Bilinear``). The embedding may hold such layers and keeps its convolutions exact:
    it reads the data, so nothing trainable sits below it to receive their input gradient.
    """
    layers = []
    for name, module in model.named_modules():
        in_embed = name.split(".")[0] == "embed"
        if isinstance(module, nn.Linear) or (isinstance(module, nn.Conv2d) and not in_embed):
            layers.append((name, module))
        elif isinstance(module, UNSUPPORTED) and not in_embed:
            raise ModelContractError(
                f"--method {rule} replaces the backward of nn.Linear and nn.Conv2d layers "
                f"only, but {type(model).__name__}.{name} is a {type(module).__name__}; use "
                "nn.Linear/nn.Conv2d layers there (or a block-level rule such as fa or dfa)")
    if not layers:
        raise ModelContractError(f"--method {rule} needs nn.Linear or nn.Conv2d layers; "
                                 f"{type(model).__name__} has none")
    return layers


@contextlib.contextmanager
def replaced_backward(layers: Sequence[tuple[str, FeedbackLayer]], feedback: Sequence[Feedback]
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
        # An instance attribute shadows the class's forward for this module only (set in
        # the instance's __dict__: nn.Module.__setattr__'s checks cost more than the call).
        layer.__dict__["forward"] = functools.partial(_feedback_forward, layer, b, called)
    try:
        yield
    finally:
        for (_, layer), previous in zip(layers, own):
            if previous is None:
                del layer.__dict__["forward"]
            else:
                layer.__dict__["forward"] = previous
    skipped = [name for name, layer in layers if id(layer) not in called]
    if skipped:
        raise ModelContractError(
            f"the layer(s) {', '.join(skipped[:3])} were not called as modules in the forward "
            "pass (their weights are used directly), so their backward cannot be replaced; "
            "call every nn.Linear and nn.Conv2d as a module")


def matrix_alignment(feedback: Tensor, weight: Tensor) -> tuple[float, float]:
    """(∠(B, W) in degrees, ‖B‖/‖W‖) of two same-shaped matrices, in float64.

    The angle is that of the flattened matrices (BioTorch's ``compute_matrix_angle``, without
    its eps), computed as 2·atan2(‖b̂ − ŵ‖, ‖b̂ + ŵ‖) of the unit vectors, which stays accurate
    near 0° and 180° where acos of the cosine loses half the digits; NaN when either is
    exactly zero.
    """
    b = feedback.detach().double().flatten()
    w = weight.detach().to(b.device).double().flatten()
    nb, nw = float(torch.linalg.vector_norm(b)), float(torch.linalg.vector_norm(w))
    if nb == 0.0 or nw == 0.0:
        return math.nan, (nb / nw if nw > 0 else math.nan)
    bu, wu = b / nb, w / nw
    angle = 2.0 * math.atan2(float(torch.linalg.vector_norm(bu - wu)),
                             float(torch.linalg.vector_norm(bu + wu)))
    return math.degrees(angle), nb / nw


def weight_shapes(layers: Sequence[tuple[str, FeedbackLayer]]) -> list[tuple[int, ...]]:
    """W's shape per layer — (out, in) or (out, in/groups, kh, kw): the shapes of the B's."""
    return [tuple(layer.weight.shape) for _, layer in layers]


def backward_fan_in(layer: FeedbackLayer) -> int:
    """How many entries of δ_out sum into one entry of δ_in: out for a Linear,
    (out_channels/groups)·kh·kw for a Conv2d (see the module docstring)."""
    if isinstance(layer, nn.Conv2d):
        kh, kw = layer.kernel_size
        return layer.out_channels // layer.groups * kh * kw
    return layer.out_features


def draw_layer_feedback(layers: Sequence[tuple[str, FeedbackLayer]], *, scale: float,
                        generator: torch.Generator, out: Sequence[Tensor] | None = None
                        ) -> list[Tensor]:
    """A random B per layer, W's shape, entries N(0, scale²/n), n = :func:`backward_fan_in`
    (float32, on the CPU; drawn in layer order from ``generator``, into ``out`` if given)."""
    return draw_feedback(weight_shapes(layers), scale=scale, generator=generator,
                         fans=[backward_fan_in(layer) for _, layer in layers], out=out)


class LinearFeedbackRule(CreditRule[RuleOptionsT]):
    """End-to-end training through a backward pass with per-layer feedback (every Linear and
    every Conv2d outside the embedding: :func:`feedback_layers`).

    Subclasses give :meth:`feedback_matrices` (B per layer of :attr:`layers`, W's shape,
    as credits and the next step use them) and may draw new ones per step in
    :meth:`step_feedback`. Not local: the blocks are not trained on the local surrogate but
    by the modified backward pass of CE + λΣ‖f_l‖².
    """

    local = False
    Options = FeedbackOptions
    adapted_models = True  # every Linear, Conv2d and attention projection: adapted_feedback

    def __init__(self, model: ResidualNet, config: MethodConfig, *, n_classes: int,
                 generator: torch.Generator) -> None:
        self.layers = (adapted_feedback.feedback_sites(model, type(self).name)
                       if isinstance(model, AdaptedModel)
                       else feedback_layers(model, type(self).name))
        # Attention's projections need their own replaced forward (adapted models only).
        self.attention_sites = any(isinstance(site, adapted_feedback.ProjectionWeight)
                                   for _, site in self.layers)
        super().__init__(model, config, n_classes=n_classes, generator=generator)

    def feedback_matrices(self) -> list[Tensor]:
        """B per layer (shape of its W) as the credit and the next step use them."""
        raise NotImplementedError

    def step_feedback(self) -> list[Feedback]:
        """B for the coming training step (brSF draws new magnitudes here): tensors, or
        :class:`SignFeedback` for the sign-concordant rules, built only where the backward
        pass needs a layer's input gradient."""
        return self.feedback_matrices()

    def weights(self) -> list[Tensor]:
        return [layer.weight for _, layer in self.layers]

    def credits(self, x: Tensor, y: Tensor) -> list[Tensor]:
        """The modified backward's signal at h_0 … h_L for the batch-mean CE (detached)."""
        with torch.enable_grad(), self.feedback_backward(self.feedback_matrices()):
            states, logits = self.model.forward_states(x)
            ce = F.cross_entropy(loss_precision(logits), y)
            # States only: no parameter's .grad is touched.
            grads = torch.autograd.grad(ce, states)
        return [g.detach() for g in grads]

    def train_step(self, x: Tensor, y: Tensor, optimizer: torch.optim.Optimizer) -> StepResult:
        feedback = self.step_feedback()
        return end_to_end_step(self, x, y, optimizer, self.feedback_backward(feedback))

    @contextlib.contextmanager
    def feedback_backward(self, feedback: Sequence[Feedback]) -> Iterator[None]:
        """:func:`replaced_backward` of :attr:`layers` (on an adapted model, attention's
        projections too: :mod:`.adapted_feedback`)."""
        if not self.attention_sites:
            with replaced_backward(self.layers, feedback):
                yield
            return
        layers, layer_feedback, attentions = adapted_feedback.split_sites(self.layers, feedback)
        with replaced_backward(layers, layer_feedback), \
                adapted_feedback.replaced_attention_backward(attentions, _FeedbackLinear.apply):
            yield

    def weight_alignment(self) -> dict[str, list]:
        pairs = [matrix_alignment(b, w)
                 for b, w in zip(self.feedback_matrices(), self.weights(), strict=True)]
        return {"layers": [name for name, _ in self.layers],
                "angle": [angle for angle, _ in pairs],
                "norm_ratio": [ratio for _, ratio in pairs]}


def sign_feedback(magnitudes: Sequence[Tensor], weights: Sequence[Tensor]) -> list[Tensor]:
    """B = |M| ∘ sign(W) per layer, in W's dtype and on its device (sign(0) = 0)."""
    return [SignFeedback(m, w)() for m, w in zip(magnitudes, weights, strict=True)]


def magnitude_scale(layer: FeedbackLayer, scale: float) -> float:
    """s/√n: the RMS of a feedback entry N(0, s²/n), n = :func:`backward_fan_in` (out for a
    Linear)."""
    return scale / backward_fan_in(layer) ** 0.5
