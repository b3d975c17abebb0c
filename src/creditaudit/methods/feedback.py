"""Rules with fixed random feedback matrices (FA, DFA, …): drawing, saving, swapping them.

The matrices are drawn once from the rule's own generator (:func:`feedback_generator`, seeded
from ``method.feedback_seed``, default the run seed), saved with every checkpoint — a cosine
measured with other matrices is a different quantity — and never trained. The fresh-feedback
null redraws them with :meth:`FixedFeedbackRule.draw_feedback` and measures the credit under
the fresh draw with :meth:`FixedFeedbackRule.using_feedback`.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeVar

import torch
from torch import Tensor, nn

from creditaudit.config import MethodConfig
from creditaudit.methods.base import CreditRule, FeedbackOptions, LocalOptions
from creditaudit.models.contract import ResidualNet


def feedback_generator(seed: int) -> torch.Generator:
    """The rule's own generator for feedback matrices and auxiliary nets, from ``seed``.

    Its seed is derived from ``seed`` by a hash rather than being ``seed`` itself: the model is
    initialised from the run seed too, and two Mersenne twisters with one seed produce the
    same stream, so a feedback matrix drawn from ``manual_seed(run_seed)`` has cosine ≈ −0.34
    with the embedding's initial weights — feedback that is not independent of the forward
    weights it is compared with.
    """
    digest = hashlib.sha256(f"creditaudit feedback stream {int(seed)}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def aux_dtype(model: nn.Module) -> torch.dtype:
    """Dtype of a rule's own tensors (feedback draws, auxiliary nets) for ``model`` (or a
    layer): its floating dtype, at least float32 — never torch's default dtype, so a caller's
    ``torch.set_default_dtype`` does not change a float32 model's feedback.

    Under bf16 autocast the model's parameters stay fp32, so bridges train in fp32; a
    float64 model (tests, a caller's float64 run) gets float64 feedback and bridges, so
    identities hold to rounding.
    """
    for param in model.parameters():
        if param.is_floating_point():
            return draw_dtype(param)
    return torch.float32


def draw_dtype(weight: Tensor) -> torch.dtype:
    """The dtype a rule draws in for ``weight`` (a layer's, an attention projection's, which
    is no module): float64 for a float64 weight, else float32 (:func:`aux_dtype`)."""
    return torch.float64 if weight.dtype == torch.float64 else torch.float32


def draw_feedback(shapes: list[tuple[int, ...]], *, scale: float, generator: torch.Generator,
                  dtype: torch.dtype | Sequence[torch.dtype],
                  fans: Sequence[int] | None = None, out: Sequence[Tensor] | None = None
                  ) -> list[Tensor]:
    """Fixed random feedback matrices, entries N(0, scale²/fan_in), drawn in order on the CPU.

    ``dtype``: the draws' dtype (:func:`aux_dtype` of what they pair with), one for all or
    one per shape. fan_in is ``fans[i]`` where given, else ``shape[0]`` (the fan-in of
    δ_in = δ_out·B for a matrix B of shape (out, in)). ``out``: CPU tensors of those shapes
    and dtypes to draw into (the same numbers; for a rule that draws every step, see brSF).
    """
    if fans is None:
        fans = [shape[0] for shape in shapes]
    dtypes = [dtype] * len(shapes) if isinstance(dtype, torch.dtype) else list(dtype)
    if out is not None:
        return [torch.randn(shape, generator=generator, dtype=kind, out=o).mul_(scale / fan ** 0.5)
                for shape, fan, kind, o in zip(shapes, fans, dtypes, out, strict=True)]
    return [torch.randn(*shape, generator=generator, dtype=kind, device="cpu")
            * (scale / fan ** 0.5) for shape, fan, kind in zip(shapes, fans, dtypes, strict=True)]


def state_width(model: ResidualNet) -> int:
    """Feature width d of the states (the embedding's output size)."""
    d = getattr(model, "d", None)
    if d is None:
        raise ValueError(f"{type(model).__name__} must expose its state width as `.d`")
    return int(d)


@dataclass
class LocalFeedbackOptions(FeedbackOptions, LocalOptions):
    """Local rules with fixed random feedback (block FA, DFA, DRTP)."""


FeedbackT = TypeVar("FeedbackT", bound=FeedbackOptions, covariant=True)


class FixedFeedbackRule(CreditRule[FeedbackT]):
    """A rule whose credit uses ``self.feedback``: a list of fixed random matrices.

    Subclasses give the shapes (:meth:`feedback_shapes`) and use ``self.feedback`` in their
    credits; drawing, the null's redraw, state_dict and device moves are handled here. A
    subclass names its options (``FixedFeedbackRule[LocalFeedbackOptions]``); one that
    names none has :class:`FeedbackOptions`.
    """

    feedback_kind: ClassVar[str] = "fixed_random"
    Options: ClassVar[type] = FeedbackOptions

    def __init__(self, model: ResidualNet, config: MethodConfig, *, n_classes: int,
                 generator: torch.Generator) -> None:
        super().__init__(model, config, n_classes=n_classes, generator=generator)
        self.feedback: list[Tensor] = self.draw_feedback(generator)

    def feedback_shapes(self) -> list[tuple[int, ...]]:
        """Shapes of the feedback matrices, in the order the credit uses them."""
        raise NotImplementedError

    def draw_feedback(self, generator: torch.Generator) -> list[Tensor]:
        return draw_feedback(self.feedback_shapes(), scale=self.options.feedback_scale,
                             generator=generator, dtype=aux_dtype(self.model))

    @contextlib.contextmanager
    def using_feedback(self, feedback: list[Tensor]) -> Iterator[None]:
        training = self.feedback
        self.feedback = [f.to(device=b.device, dtype=b.dtype) for f, b in zip(feedback, training)]
        try:
            yield
        finally:
            self.feedback = training

    def state_dict(self) -> dict[str, object]:
        return {"feedback": [b.clone() for b in self.feedback]}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.feedback = [b.clone() for b in state["feedback"]]

    def to(self, device: torch.device) -> FixedFeedbackRule[FeedbackT]:
        super().to(device)
        self.feedback = [b.to(device) for b in self.feedback]
        return self
