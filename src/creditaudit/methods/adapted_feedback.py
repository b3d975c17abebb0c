"""The per-layer feedback rules (``fa-linear``, ``usf``, ``brsf``, ``frsf``, ``kp``) on adapted
models: which weights get a feedback matrix, and attention's replaced backward.

On an adapted model every ``nn.Linear`` and ``nn.Conv2d`` gets one, as BioTorch converts them —
the first layer too: when its input is the data, what it passes down trains nothing and every
update is the same either way (a layer with parameters below it, a LayerNorm's affine before the
first Linear, trains through B, as under BioTorch's conversion). ``nn.MultiheadAttention``
(inside PyTorch's ``nn.TransformerEncoderLayer``, for one) does not call modules for its
projections: it uses ``in_proj_weight`` (q, k and v packed, (3E, E)) — or ``q/k/v_proj_weight``
when the key and value widths differ — and ``out_proj.weight`` directly, so swapping modules
(BioTorch's way) leaves its backward exact. Here they are weight layers like the others: within
:func:`replaced_attention_backward` the attention computes q, k, v and its output projection
with the rule's feedback linear and runs PyTorch's own attention between them (identity
projections inside, which are exact), so masks, dropout and the attention itself stay PyTorch's.
A packed projection's B is (3E, E), its fan-in 3E, as for a Linear of that shape.

Layers whose weights act on an input but which this cannot replace (Conv1d/3d, transposed
convolutions, ``nn.Bilinear``, the recurrent layers ``nn.RNN``/``LSTM``/``GRU`` and their
cells, whose weights carry the signal down through the sequence too), subclasses with a
forward of their own, and layers the probe of :func:`creditaudit.adapt` did not see called
are refused in one line when the rule is bound (:mod:`creditaudit.methods.replaceable`)
rather than left exact or replaced wrongly; so is a parameter the forward multiplies its
signal by outside these layers (``x @ self.W``: :mod:`creditaudit.models.direct_uses`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from creditaudit.errors import ModelContractError
from creditaudit.methods.replaceable import (
    OTHER_RULES,
    check_own_forward,
    did_not_run,
    used_directly,
)
from creditaudit.models.adapted import AdaptedModel
from creditaudit.models.direct_uses import UNSUPPORTED, direct_use_refusal

# B as a tensor, or as the function that builds it when the backward pass needs it.
Feedback = Tensor | Callable[[], Tensor]
# (x, W, b, B) -> x·Wᵀ + b whose backward passes δ·B down: linear_feedback's _FeedbackLinear.
FeedbackLinear = Callable[[Tensor, Tensor, Tensor | None, Feedback], Tensor]
_ATTENTION_SIGNATURE = inspect.signature(F.multi_head_attention_forward)
# Set while PyTorch's attention runs between projections already replaced (:func:`_projected`):
# an attention around this one (a subclass whose forward calls another attention) leaves
# that call alone, as it is no call of its own.
_BETWEEN_PROJECTIONS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "creditaudit_between_projections", default=False)


class ProjectionWeight:
    """An input-projection weight of an ``nn.MultiheadAttention`` (``in_proj_weight`` or
    ``q/k/v_proj_weight``), seen as a layer: its ``weight`` and ``out_features``."""

    def __init__(self, attention: nn.MultiheadAttention, attribute: str) -> None:
        self.attention, self.attribute = attention, attribute

    @property
    def weight(self) -> Tensor:
        return getattr(self.attention, self.attribute)

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])


def feedback_sites(model: AdaptedModel, rule: str) -> list[tuple[str, Any]]:
    """Every weight layer of ``model`` with its name, in module order: each ``nn.Linear``
    and ``nn.Conv2d`` (attention's ``out_proj`` included) and each attention's input
    projection(s) as a :class:`ProjectionWeight`. ModelContractError for weight layers
    whose backward cannot be replaced, or a model without any."""
    sites: list[tuple[str, Any]] = []
    for name, module in model.net.named_modules():
        if isinstance(module, nn.MultiheadAttention):
            attributes = (("in_proj_weight",) if module._qkv_same_embed_dim
                          else ("q_proj_weight", "k_proj_weight", "v_proj_weight"))
            sites += [(f"{name}.{a}", ProjectionWeight(module, a)) for a in attributes]
        elif isinstance(module, nn.Linear | nn.Conv2d):
            check_own_forward(repr(name), module, rule)
            sites.append((name, module))
        elif isinstance(module, UNSUPPORTED):
            raise ModelContractError(
                f"--method {rule} replaces the backward of nn.Linear, nn.Conv2d and "
                f"nn.MultiheadAttention layers only, but {name!r} is a "
                f"{type(module).__name__}; use those layers (or a rule such as dfa)")
    if not sites:
        raise ModelContractError(f"--method {rule} needs nn.Linear, nn.Conv2d or "
                                 f"nn.MultiheadAttention layers; {type(model.net).__name__} "
                                 "has none")
    check_called(model, sites, rule)
    if model.probe_direct_uses:
        module, parameter = model.probe_direct_uses[0]
        cls = type(model.net.get_submodule(module)).__name__
        raise ModelContractError(direct_use_refusal(rule, module, parameter, cls))
    return sites


def check_called(model: AdaptedModel, sites: Sequence[tuple[str, Any]], rule: str) -> None:
    """ModelContractError (one line, naming the layer and the cause) for a site that
    adapt()'s probe did not see called as a module in the eval-mode forward the credits run
    (:mod:`~creditaudit.methods.replaceable`); nothing to check on the meta device."""
    calls = model.probe_calls
    if calls is None:
        return
    outputs = {id(site.attention.out_proj) for _, site in sites
               if isinstance(site, ProjectionWeight)}
    parameters = {id(p): name for name, p in model.net.named_parameters()}
    for name, site in sites:
        # An attention runs its projections itself: it, not they, must be called.
        attention = isinstance(site, ProjectionWeight)
        module = name.rpartition(".")[0] if attention else name
        if module in calls or id(site) in outputs:
            continue
        cls = type(site.attention if attention else site).__name__
        if model.probe_reads(parameters.get(id(site.weight), "")):
            raise used_directly(rule, module, cls)
        raise did_not_run(rule, module, cls, "eval", probe=True)


@dataclass
class AttentionFeedback:
    """One attention's feedback: ``projections`` B per input projection (its
    :class:`ProjectionWeight` order), ``output`` B of its ``out_proj``."""

    attention: nn.MultiheadAttention
    projections: list[Feedback]
    output: Feedback


def split_sites(sites: Sequence[tuple[str, Any]], feedback: Sequence[Feedback]
                ) -> tuple[list[tuple[str, nn.Module]], list[Feedback], list[AttentionFeedback]]:
    """(layers called as modules, their feedback, the attentions' feedback) from
    :func:`feedback_sites` and one B per site."""
    outputs = {id(site.attention.out_proj): site.attention for _, site in sites
               if isinstance(site, ProjectionWeight)}
    layers, layer_feedback = [], []
    attentions: dict[int, AttentionFeedback] = {}
    for (name, site), b in zip(sites, feedback, strict=True):
        if isinstance(site, ProjectionWeight):
            entry = attentions.setdefault(id(site.attention),
                                          AttentionFeedback(site.attention, [], b))
            entry.projections.append(b)
        elif id(site) in outputs:
            attentions[id(outputs[id(site)])].output = b
        else:
            layers.append((name, site))
            layer_feedback.append(b)
    return layers, layer_feedback, list(attentions.values())


@contextlib.contextmanager
def replaced_attention_backward(attentions: Sequence[AttentionFeedback],
                                linear: FeedbackLinear) -> Iterator[None]:
    """Inside the block each attention's projections run through ``linear`` with their
    feedback (module docstring); PyTorch's fused fast path, which would bypass them, is off.

    Graphs built inside keep their feedback after the block. ModelContractError when an
    attention was not run, or any call of it ran without F.multi_head_attention_forward (a
    subclass with a forward of its own, on every call or on some): its backward would not
    have been replaced.
    """
    called: set[int] = set()
    bypassed: set[int] = set()  # attentions with a call that ran without it
    own = [a.attention.__dict__.get("forward") for a in attentions]
    fast_path = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    for entry, previous in zip(attentions, own):
        run = previous or type(entry.attention).forward.__get__(entry.attention)
        entry.attention.forward = functools.partial(  # type: ignore[method-assign]
            _attention_forward, run, entry, linear, called, bypassed)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fast_path)
        for entry, previous in zip(attentions, own):
            del entry.attention.forward
            if previous is not None:
                entry.attention.forward = previous  # type: ignore[method-assign]
    skipped = [a.attention for a in attentions if id(a.attention) in bypassed] or [
        a.attention for a in attentions if id(a.attention) not in called]
    if skipped:
        attention = skipped[0]
        what = (f"an nn.MultiheadAttention ({type(attention).__name__} with "
                f"embed_dim={attention.embed_dim})")
        if id(attention) in bypassed:
            raise ModelContractError(
                f"{what} ran without nn.MultiheadAttention's own attention "
                "(F.multi_head_attention_forward), whose projections the rule replaces: its "
                "forward is its own, so its backward could not be replaced; let its forward "
                "call nn.MultiheadAttention.forward (super().forward(…)), "
                f"{OTHER_RULES}")
        raise ModelContractError(f"{what} was not run in the forward pass, so its backward "
                                 "could not be replaced; remove unused attention layers")


class _ProjectedAttention(TorchFunctionMode):
    """Within one attention's forward: F.multi_head_attention_forward → :func:`_projected`."""

    def __init__(self, entry: AttentionFeedback, linear: FeedbackLinear,
                 called: set[int]) -> None:
        super().__init__()
        self.entry, self.linear, self.called = entry, linear, called
        self.projected = False  # whether this forward's attention went through _projected

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.multi_head_attention_forward and not _BETWEEN_PROJECTIONS.get():
            self.called.add(id(self.entry.attention))
            self.projected = True
            return _projected(self.entry, self.linear, *args, **kwargs)
        return func(*args, **kwargs)


def _attention_forward(run: Callable[..., Any], entry: AttentionFeedback,
                       linear: FeedbackLinear, called: set[int], bypassed: set[int],
                       *args: Any, **kwargs: Any) -> Any:
    mode = _ProjectedAttention(entry, linear, called)
    with mode:
        out = run(*args, **kwargs)
    if not mode.projected:
        bypassed.add(id(entry.attention))
    return out


def _projected(entry: AttentionFeedback, linear: FeedbackLinear, *args: Any,
               **kwargs: Any) -> tuple[Tensor, Tensor | None]:
    """F.multi_head_attention_forward with its projections through ``linear``: q, k, v
    first, PyTorch's attention on them with identity projections, then the output's."""
    bound = _ATTENTION_SIGNATURE.bind(*args, **kwargs)
    bound.apply_defaults()
    a = dict(bound.arguments)
    bias = a["in_proj_bias"]
    biases = bias.chunk(3) if bias is not None else (None, None, None)
    if a["use_separate_proj_weight"]:
        weights = (a["q_proj_weight"], a["k_proj_weight"], a["v_proj_weight"])
        feedback = [_built(b) for b in entry.projections]
    else:
        weights = a["in_proj_weight"].chunk(3)
        feedback = _built(entry.projections[0]).chunk(3)
    q, k, v = (linear(a[role], w, b, fb) for role, w, b, fb in
               zip(("query", "key", "value"), weights, biases, feedback, strict=True))
    out_weight, out_bias = a["out_proj_weight"], a["out_proj_bias"]
    eye = torch.eye(q.shape[-1], dtype=q.dtype, device=q.device)
    a.update(query=q, key=k, value=v, in_proj_weight=None, in_proj_bias=None,
             use_separate_proj_weight=True, q_proj_weight=eye, k_proj_weight=eye,
             v_proj_weight=eye, out_proj_weight=eye, out_proj_bias=None)
    between = _BETWEEN_PROJECTIONS.set(True)
    try:
        attended, attention_weights = F.multi_head_attention_forward(**a)
    finally:
        _BETWEEN_PROJECTIONS.reset(between)
    return linear(attended, out_weight, out_bias, entry.output), attention_weights


def _built(feedback: Feedback) -> Tensor:
    """B as a tensor: a feedback given as the function that builds it is built here."""
    return feedback if isinstance(feedback, Tensor) else feedback()


__all__ = ["ProjectionWeight", "AttentionFeedback", "feedback_sites", "split_sites",
           "replaced_attention_backward"]
