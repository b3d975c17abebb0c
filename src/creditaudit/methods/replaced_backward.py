"""A weight layer's backward with a feedback matrix B in W's place: the mechanism of the
per-layer feedback rules (:mod:`creditaudit.methods.linear_feedback`).

Inside :func:`replaced_backward`, each ``nn.Linear`` computes its input gradient with B (of
W's shape, out × in) instead of W,

    δ_in = δ_out · B          (row form; autograd's exact backward is δ_out · W),

so in Lillicrap's column notation Bᵀ stands where Wᵀ stood. Every weight gradient
(δ_outᵀ · x) stays exact, and so does every other module: only the signal passed *down*
through a weight layer changes.

Convolutions (``nn.Conv2d``, as in BioTorch) work the same way: B is a kernel of W's shape
(out_channels, in_channels/groups, kh, kw) — for a depthwise convolution (groups = channels)
one k×k kernel per channel, shape (C, 1, k, k) — and the input gradient is the adjoint of
the convolution with B instead of W, δ_in = conv_transpose(δ_out; B), with W's stride,
padding, dilation and groups; δW and δb stay exact. The embedding's convolutions (the patch
embeddings of ViT-Mini and ConvMixer) keep their exact backward: their input is the data,
so the signal they pass down trains nothing (:func:`feedback_layers`).

B is a tensor, or a function that builds it when the backward needs it (the sign-concordant
rules' :class:`~creditaudit.methods.linear_feedback.SignFeedback`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor, nn
from torch.autograd.function import FunctionCtx
from torch.nn import functional as F

from creditaudit.errors import ModelContractError
from creditaudit.methods.adapted_feedback import Feedback
from creditaudit.methods.replaceable import LayersNotCalled, check_own_forward

# Layers whose weights act on an input the rule would have to feed a replaced backward
# through, but which this module cannot patch (only nn.Linear and nn.Conv2d are supported).
# Transposed convolutions are not subclasses of nn.Conv2d: without this entry their backward
# would silently stay exact.
UNSUPPORTED = (nn.Conv1d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
               nn.ConvTranspose3d, nn.MultiheadAttention, nn.Bilinear, nn.RNNBase,
               nn.RNNCellBase)

FeedbackLayer = nn.Linear | nn.Conv2d


def _as_dtype(tensor: Tensor, dtype: torch.dtype | None) -> Tensor:
    """``tensor`` in ``dtype``, without the dispatch of a cast that changes nothing."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def _not_a_view(out: Tensor) -> Tensor:
    """``out`` as a tensor of its own rather than a view: F.linear of a (…, in) input with a
    bias returns a view of its 2-D product, and autograd forbids changing a view made inside
    a Function in place — a ``ReLU(inplace=True)`` or ``h += x`` after a token Linear raised.
    The same memory and values (ATen's own matmul hands out its products this way)."""
    return torch.ops.aten._unsafe_view(out, out.shape) if out._is_view() else out


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
        return _not_a_view(F.linear(x, weight, bias))

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
        # An unbatched (C, H, W) input, which nn.Conv2d takes, as a batch of one: the
        # convolution's backward op wants four dimensions.
        unbatched = x.dim() == 3
        x, padding = _conv_input(layer, x.unsqueeze(0) if unbatched else x)
        y = _FeedbackConv2d.apply(x, layer.weight, layer.bias, feedback, layer.stride,
                                  padding, layer.dilation, layer.groups)
        return y.squeeze(0) if unbatched else y
    return _FeedbackLinear.apply(x, layer.weight, layer.bias, feedback)


def feedback_layers(model: nn.Module, rule: str) -> list[tuple[str, FeedbackLayer]]:
    """Every ``nn.Linear`` and every ``nn.Conv2d`` outside the embedding, with its name, in
    module order.

    ModelContractError when a block or the readout holds a weight layer whose backward this
    module cannot replace (Conv1d/3d, transposed convolutions, ``nn.MultiheadAttention``,
    ``nn.Bilinear``; a subclass with a forward of its own:
    :func:`~creditaudit.methods.replaceable.check_own_forward`). The embedding may hold
    such layers and keeps its convolutions exact: it reads the data, so nothing trainable
    sits below it to receive their input gradient.
    """
    layers = []
    for name, module in model.named_modules():
        in_embed = name.split(".")[0] == "embed"
        if isinstance(module, nn.Linear) or (isinstance(module, nn.Conv2d) and not in_embed):
            check_own_forward(f"{type(model).__name__}.{name}", module, rule)
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
    backward pass may run outside. :class:`~creditaudit.methods.replaceable.LayersNotCalled`
    when a layer was not called as a module (it did not run, or its weight was used
    directly, e.g. by a functional attention): its backward would silently stay exact.
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
    skipped = [(name, layer) for name, layer in layers if id(layer) not in called]
    if skipped:
        raise LayersNotCalled([name for name, _ in skipped], [layer for _, layer in skipped],
                              "training" if skipped[0][1].training else "eval")
