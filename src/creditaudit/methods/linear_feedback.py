"""Rules that keep backprop's graph and replace every weight layer's weight in the backward pass.

The field's per-layer feedback rules — FA as Lillicrap et al. (2016) and BioTorch define it,
the sign-concordant uSF, brSF, frSF (Liao et al. 2016; Moskovitz et al. 2018) and
Kolen–Pollack (Akrout et al. 2019) — train end to end like backprop, with one change: each
``nn.Linear`` and each ``nn.Conv2d`` outside the embedding computes its input gradient with
a feedback matrix B of W's shape instead of W (δ_in = δ_out · B; the mechanism is
:mod:`creditaudit.methods.replaced_backward`). LayerNorm, GELU, attention, the identity
skips and every weight gradient stay exact; only the signal passed *down* through a weight
layer changes. A rule's credit a_l is the signal this backward pass leaves at state h_l
(batch-mean scale, like backprop's g_l); with B = W it is g_l exactly.

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
import math
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.config import MethodConfig
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
from creditaudit.methods.feedback import draw_dtype, draw_feedback
from creditaudit.methods.logits import checked_logits
from creditaudit.methods.replaceable import LayersNotCalled, not_called_cause
from creditaudit.methods.replaced_backward import (
    FeedbackLayer,
    _FeedbackLinear,
    feedback_layers,
    replaced_backward,
)
from creditaudit.models.adapted import AdaptedModel
from creditaudit.models.contract import ResidualNet


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
    (on the CPU, in the :func:`~creditaudit.methods.feedback.draw_dtype` of its weight: float32, or
    float64 for a float64 layer; drawn in layer order from ``generator``, into ``out`` if
    given)."""
    return draw_feedback(weight_shapes(layers), scale=scale, generator=generator,
                         dtype=[draw_dtype(layer.weight) for _, layer in layers],
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
        try:
            with torch.enable_grad(), self.feedback_backward(self.feedback_matrices()):
                states, logits = self.model.forward_states(x)
                ce = F.cross_entropy(loss_precision(checked_logits(self.model, logits, y)), y)
                # States only: no parameter's .grad is touched.
                grads = torch.autograd.grad(ce, states)
        except LayersNotCalled as err:
            raise not_called_cause(self.model, x, err, type(self).name) from None
        return [g.detach() for g in grads]

    def train_step(self, x: Tensor, y: Tensor, optimizer: torch.optim.Optimizer) -> StepResult:
        feedback = self.step_feedback()
        try:
            return end_to_end_step(self, x, y, optimizer, self.feedback_backward(feedback))
        except LayersNotCalled as err:
            raise not_called_cause(self.model, x, err, type(self).name) from None

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
