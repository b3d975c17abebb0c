"""Credit Bridge: credit as the gradient of a learned value of the state (science.md §4).

A scalar value net V_φ(h_l, l, e) = MLP([LN(h_l), embed(l), e]) (3 hidden layers ×
``bridge_hidden`` = 256, GELU; per token / position and summed for token states and feature
maps) estimates the loss still to come from state l. The credit is its input gradient

    a_l = ∇_{h_l} V_φ(h_l, l, e)        (l = 0 … L; batch-mean scale, i.e. ∇ of mean_i V_i),

taken with respect to the state only (no ``.grad`` reaches φ or the model). Training, on
detached states, one AdamW step (``bridge_lr``) per batch of

- **bridge consistency** (l < L): V(h_l) ≈ softmin_τ over K = ``bridge_copies`` (8) noisy
  copies of the EMA target V̄(h_{l+1} + ξ_k, l+1, e), ξ_k ~ N(0, σ_i² I) with
  σ_i = ``bridge_noise`` (0.1) × RMS(h_{l+1,i}) per sample — the noise is relative to the
  stream's scale because V reads LN(h), which is blind to absolute scale;
  softmin_τ(v) = −τ·log((1/K)·Σ_k exp(−v_k/τ)) with τ = ``bridge_temperature`` = 0.1 nats
  (V is anchored in nats, below): well above fp resolution, yet small against the O(1)
  spread of losses between samples, so the target leans to the best nearby continuation
  without collapsing to a hard min over 8 draws (τ → ∞ would give their mean);
- **terminal gradient matching** (l = L): 1 − cos(∇_{h_L}V, ∂CE_i/∂h_L) per sample, i.e.
  half the MSE between the unit-normalised vectors (scale-free, unlike an eps-guarded RMS
  normalisation, so it still works when ‖∂CE/∂h_L‖ shrinks to 1e-9 on an exploded stream;
  the block updates only ever see the RMS-normalised credit anyway); needs create_graph;
- **terminal value anchor** (l = L): (V(h_L, L, e) − CE_i)², our addition: without it the
  level of V is free and the consistency targets have no unit.

The three terms are summed with weight 1. The EMA target (decay ``ema_decay`` = 0.995)
follows φ after every step. During the first ``warmup_fraction`` (0.2) of the epochs
(ceil(fraction × epochs), at least one when the fraction is > 0) the blocks are trained with
DFA credit a_l = B_lᵀ e from the rule's own feedback matrices while V is already fitted. The
record of epoch k shows the credit the rule uses in epoch k + 1 (``bridge_warmup`` says
whether epoch k itself was a warm-up epoch). Noise comes from the rule's generator (the
feedback generator, continued), saved with every checkpoint; torch's global RNG is never
used.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.config import MethodConfig, opt
from creditaudit.methods.base import (
    CreditRule,
    FeedbackOptions,
    LocalOptions,
    StepResult,
    output_error,
    step_result,
)
from creditaudit.methods.epoch_fields import EndedEpoch
from creditaudit.methods.feedback import aux_dtype, draw_feedback, state_width
from creditaudit.methods.logits import checked_logits
from creditaudit.methods.registry import register
from creditaudit.methods.state_bridge import (
    AUX_WEIGHT_DECAY,
    BridgeInput,
    BridgeOptions,
    mlp,
    readout_dtype,
    seeded_init,
    split_rows,
)
from creditaudit.methods.surrogate import local_backward, local_forward, state_credit_shape
from creditaudit.models.contract import ResidualNet, feature_rows
from creditaudit.optim import make_adamw

VALUE_DEPTH = 3


class ValueNet(nn.Module):
    """V(h, l, e) → (N,) per-sample value; token states are scored per token and feature
    maps per position, and summed."""

    def __init__(self, d: int, n_layers: int, n_classes: int, *, hidden: int = 256,
                 depth: int = VALUE_DEPTH) -> None:
        super().__init__()
        self.inputs = BridgeInput(d, n_layers, n_classes)
        self.net = mlp(self.inputs.out_dim, hidden, depth, 1)

    def forward(self, h: Tensor, layer: int | Tensor, e: Tensor) -> Tensor:
        v = self.net(self.inputs(feature_rows(h), layer, e)).squeeze(-1)
        return v.flatten(1).sum(dim=1) if v.dim() > 1 else v


# Up to this temperature (nats) soft_min takes the direct form, whose absolute error is about
# τ·eps·log K; above it, the form shifted to the minimum, exact however large τ grows.
DIRECT_SOFT_MIN_UP_TO = 1.0


def soft_min(values: Tensor, temperature: float, dim: int = 0) -> Tensor:
    """−τ·log(mean_k exp(−v_k/τ)) along ``dim``: between min (τ→0) and mean (τ→∞).

    Written directly, the log of the mean is log K plus a term of order spread/τ, so for a
    large τ the difference cancels to rounding times τ (float32, values ≈ 2: off by 0.03 at
    τ = 1e5 and by 2.5 at 1e8, where it should be their mean). Above
    :data:`DIRECT_SOFT_MIN_UP_TO` it is min_k v_k − τ·log1p(mean_k expm1(−(v_k − min)/τ)),
    the same value with every term computed to full precision."""
    k = values.shape[dim]
    if temperature <= DIRECT_SOFT_MIN_UP_TO:
        return -temperature * (torch.logsumexp(-values / temperature, dim=dim) - math.log(k))
    low = values.amin(dim=dim, keepdim=True)
    shortfall = torch.expm1((low - values) / temperature).mean(dim=dim)
    return low.squeeze(dim) - temperature * torch.log1p(shortfall)


def unit_cosine(a: Tensor, b: Tensor) -> Tensor:
    """Per-sample cosine of flattened a and b, without an eps floor on small norms."""
    a, b = a.flatten(1), b.flatten(1)
    tiny = torch.finfo(a.dtype).tiny
    return (a * b).sum(dim=1) / (a.norm(dim=1) * b.norm(dim=1)).clamp_min(tiny)


@dataclass
class CreditBridgeOptions(FeedbackOptions, LocalOptions, BridgeOptions):
    warmup_fraction: float = opt(
        0.2, "Credit Bridge: fraction of epochs trained with DFA credit before ∇V takes over",
        min=0.0, max=1.0)
    bridge_noise: float = opt(
        0.1, "Credit Bridge: noise std of the consistency copies, × per-sample RMS of h_{l+1}",
        min=0.0)
    bridge_copies: int = opt(8, "Credit Bridge: noisy copies K in the soft-min target", min=1)
    bridge_temperature: float = opt(
        0.1, "Credit Bridge: soft-min temperature τ in nats (→0 hard min, →∞ mean)", min=1e-6)
    ema_decay: float = opt(0.995, "Credit Bridge: EMA decay of the target value net",
                           min=0.0, max=1.0)


@register
class CreditBridge(CreditRule[CreditBridgeOptions]):
    """Credit a_l = ∇_{h_l} V_φ(h_l, l, e) after a DFA warm-up; V_φ fitted on the fly."""

    name = "credit-bridge"
    residual_reason = "its value net reads states of one width d along the residual stream"
    label = "Credit Bridge"
    credit_formula = "a_l = ∇_{h_l} V(h_l, l, e); B_l^T e in the DFA warm-up"
    feedback_kind = "learned"
    local = True
    color, marker = "#5289C7", "P"
    rank = 50
    own_parts = {"value": ("value net V_φ", ("bridge_lr", "bridge_temperature")),
                 "target": ("EMA target V̄", ("bridge_lr", "ema_decay"))}

    def __init__(self, model: ResidualNet, config: MethodConfig, *, n_classes: int,
                 generator: torch.Generator, value: nn.Module | None = None) -> None:
        super().__init__(model, config, n_classes=n_classes, generator=generator)
        self.generator = generator
        self.dtype = aux_dtype(model)
        d, n_states = state_width(model), model.n_blocks + 1
        # Not called ``feedback``: after the warm-up the credit no longer depends on these
        # matrices, so the fresh-B null of FA/DFA does not apply.
        self.warmup_feedback = draw_feedback([(n_classes, d)] * n_states,
                                             scale=self.options.feedback_scale, generator=generator,
                                             dtype=self.dtype)
        if value is None:
            with seeded_init(generator, self.dtype):
                value = ValueNet(d, n_states, n_classes, hidden=self.options.bridge_hidden)
        self.value = value.to(self.dtype)
        self.target = copy.deepcopy(self.value).requires_grad_(False)
        self.value_optimizer = make_adamw(self.value.parameters(), lr=self.options.bridge_lr,
                                          weight_decay=AUX_WEIGHT_DECAY)
        self.epochs_done = 0
        self.n_epochs: int | None = None
        self.sums = self._empty_sums()
        self.ended = EndedEpoch()

    @staticmethod
    def _empty_sums() -> dict[str, float]:
        return {"consistency": 0.0, "anchor": 0.0, "terminal_cos": 0.0, "steps": 0.0,
                "warmup_steps": 0.0}

    @classmethod
    def ignored_options(cls, options: Any) -> dict[str, str]:
        """``feedback_scale`` with ``warmup_fraction=0``: the warm-up's DFA matrices, the
        only thing it scales, are then drawn (the same draws, whatever the scale) but never
        used. ``bridge_copies`` with ``bridge_noise=0``, and ``bridge_temperature`` then or
        with one copy: the soft-min target is over copies of one value, which is that value
        (to rounding) whatever their number and τ."""
        defaults = {f: CreditBridgeOptions.__dataclass_fields__[f].default
                    for f in ("feedback_scale", "bridge_copies", "bridge_temperature")}
        out = {}
        if options.warmup_fraction == 0 and options.feedback_scale != defaults["feedback_scale"]:
            out["feedback_scale"] = ("method.warmup_fraction=0 skips the DFA warm-up, the only "
                                     "use of the matrices it scales")
        if options.bridge_noise == 0 and options.bridge_copies != defaults["bridge_copies"]:
            out["bridge_copies"] = ("with method.bridge_noise=0 every copy is h_{l+1} itself, "
                                    "so the soft-min target is V̄(h_{l+1}) whatever their number")
        single = ("method.bridge_noise=0" if options.bridge_noise == 0
                  else "method.bridge_copies=1" if options.bridge_copies == 1 else None)
        if single and options.bridge_temperature != defaults["bridge_temperature"]:
            out["bridge_temperature"] = (f"with {single} the soft-min target is over one value, "
                                         "which it equals whatever τ")
        return out

    # --- warm-up ------------------------------------------------------------------------
    def reads_run_length(self) -> str | None:
        fraction = self.options.warmup_fraction
        if fraction <= 0:
            return None
        return (f"method.warmup_fraction={fraction:g} trains the first "
                f"ceil({fraction:g} × optim.epochs) epochs with DFA credit")

    def in_warmup(self) -> bool:
        """Whether the next epoch trains with DFA credit."""
        fraction = self.options.warmup_fraction
        if fraction <= 0:
            return False
        if self.n_epochs is None:  # ceil(fraction × epochs) ≥ 1 whatever the epoch count
            return True
        return self.epochs_done < math.ceil(fraction * self.n_epochs - 1e-9)

    # --- credit -------------------------------------------------------------------------
    def value_credits(self, states: list[Tensor], e: Tensor) -> list[Tensor]:
        """[∇_{h_l} mean_i V(h_l,i, l, e_i)] for l = 0 … L, all layers in one batch."""
        batch = e.shape[0]
        stacked = torch.cat([h.detach().to(self.dtype) for h in states]).requires_grad_(True)
        layers = torch.arange(len(states), device=stacked.device).repeat_interleave(batch)
        e_rows = e.to(device=stacked.device, dtype=self.dtype).repeat(len(states), 1)
        with torch.enable_grad():
            v = self.value(stacked, layers, e_rows)
            (grad,) = torch.autograd.grad(v.sum() / batch, stacked)
        return split_rows(grad.detach(), batch)

    def dfa_credits(self, states: list[Tensor], e: Tensor) -> list[Tensor]:
        e = e.to(self.dtype)
        return [state_credit_shape(e @ b.to(device=e.device, dtype=self.dtype), h)
                for b, h in zip(self.warmup_feedback, states)]

    def rule_credits(self, states: list[Tensor], e: Tensor) -> list[Tensor]:
        return self.dfa_credits(states, e) if self.in_warmup() else self.value_credits(states, e)

    @torch.no_grad()
    def credits(self, x: Tensor, y: Tensor) -> list[Tensor]:
        states, logits = self.model.forward_states(x)
        return self.rule_credits(states, output_error(logits, y))

    def step_credits(self, states: list[Tensor], e: Tensor, y: Tensor) -> list[Tensor]:
        """The credits a training step uses (a seam for zero-leak tests)."""
        return self.rule_credits(states, e)

    # --- fitting V ----------------------------------------------------------------------
    def consistency_targets(self, states: list[Tensor], e: Tensor) -> Tensor:
        """softmin_τ over K noisy copies of V̄(h_{l+1} + ξ, l+1, e), rows layer-major (L·B,)."""
        batch, n_low, k = e.shape[0], len(states) - 1, self.options.bridge_copies
        nxt = torch.cat([h.detach().to(self.dtype) for h in states[1:]])
        rms = nxt.flatten(1).pow(2).mean(dim=1).sqrt()
        sigma = (self.options.bridge_noise * rms).view(1, -1, *([1] * (nxt.dim() - 1)))
        noise = torch.randn((k, *nxt.shape), generator=self.generator, dtype=self.dtype)
        noisy = (nxt.unsqueeze(0) + sigma * noise.to(nxt.device)).flatten(0, 1)
        layers = torch.arange(1, n_low + 1, device=nxt.device).repeat_interleave(batch)
        e_rows = e.to(device=nxt.device, dtype=self.dtype).repeat(n_low * k, 1)
        with torch.no_grad():
            values = self.target(noisy, layers.repeat(k), e_rows).view(k, n_low * batch)
        return soft_min(values, self.options.bridge_temperature, dim=0)

    def value_losses(self, states: list[Tensor], e: Tensor, y: Tensor,
                     logits: Tensor) -> dict[str, Tensor]:
        """The three terms of V's objective on one batch (see the module docstring)."""
        batch, n_low = e.shape[0], len(states) - 1
        top = states[-1].detach().to(self.dtype).requires_grad_(True)
        with torch.enable_grad():
            h = states[-1].detach().to(readout_dtype(self.model)).requires_grad_(True)
            ce = F.cross_entropy(self.model.readout(h), y, reduction="sum")
            (g_top,) = torch.autograd.grad(ce, h)
        ce_rows = F.cross_entropy(logits.detach().to(self.dtype), y, reduction="none")
        v_top = self.value(top, n_low, e.to(self.dtype))
        (grad_v,) = torch.autograd.grad(v_top.sum(), top, create_graph=True)
        cos = unit_cosine(grad_v, g_top.detach().to(self.dtype))
        losses = {"anchor": (v_top - ce_rows).pow(2).mean(),
                  "terminal_cos": cos.detach().mean(),
                  "match": (1.0 - cos).mean()}
        if n_low > 0:
            targets = self.consistency_targets(states, e)
            low = torch.cat([h.detach().to(self.dtype) for h in states[:-1]])
            layers = torch.arange(n_low, device=low.device).repeat_interleave(batch)
            v_low = self.value(low, layers, e.to(self.dtype).repeat(n_low, 1))
            losses["consistency"] = (v_low - targets).pow(2).mean()
        else:
            losses["consistency"] = top.new_zeros(())
        return losses

    def fit_value(self, states: list[Tensor], e: Tensor, y: Tensor, logits: Tensor) -> None:
        """One AdamW step of φ, then the EMA update of the target."""
        with torch.enable_grad():
            losses = self.value_losses(states, e, y, logits)
            loss = losses["consistency"] + losses["anchor"] + losses["match"]
        self.value_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.value_optimizer.step()
        decay = self.options.ema_decay
        with torch.no_grad():
            for p_target, p in zip(self.target.parameters(), self.value.parameters()):
                p_target.mul_(decay).add_(p.detach(), alpha=1.0 - decay)
        for key in ("consistency", "anchor", "terminal_cos"):
            self.sums[key] += float(losses[key].detach())
        self.sums["steps"] += 1

    # --- training -----------------------------------------------------------------------
    def train_step(self, x: Tensor, y: Tensor, optimizer: torch.optim.Optimizer) -> StepResult:
        optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            local = local_forward(self.model, x)
            ce = F.cross_entropy(checked_logits(self.model, local.logits, y), y)
        e = output_error(local.logits, y)
        warmup = self.in_warmup()
        credits = self.step_credits(local.states, e, y)
        result = step_result(ce, local.logits, y, local.states[-1])
        if result.finite:
            self.fit_value(local.states, e, y, local.logits)
            self.sums["warmup_steps"] += float(warmup)
            local_backward(local, ce, [self.credit_gradient(a, y.shape[0]) for a in credits],
                           self.options.penalty)
            optimizer.step()
        return result

    def end_epoch(self, epoch: int, n_epochs: int) -> dict[str, float]:
        """The epoch's means of V's losses and ``bridge_warmup``; counts the epoch for the
        warm-up. The same epoch ended again with no step since gives its fields again and
        counts nothing (:class:`EndedEpoch`)."""
        steps = self.sums["steps"]
        if (again := self.ended.again(epoch, steps)) is not None:
            return again

        def mean(key: str) -> float:
            return self.sums[key] / steps if steps else float("nan")

        out = {"bridge_consistency_error": mean("consistency"),
               "bridge_anchor_error": mean("anchor"),
               "bridge_terminal_cos": mean("terminal_cos"),
               "bridge_warmup": 1.0 if steps and self.sums["warmup_steps"] == steps else 0.0}
        self.epochs_done, self.n_epochs = epoch, n_epochs
        self.sums = self._empty_sums()
        return self.ended.keep(epoch, out)

    # --- persistence --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "warmup_feedback": [b.clone() for b in self.warmup_feedback],
            "value": self.value.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.value_optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "epochs_done": self.epochs_done,
            "n_epochs": self.n_epochs,
            "sums": dict(self.sums),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.warmup_feedback = [b.clone() for b in state["warmup_feedback"]]
        self.value.load_state_dict(state["value"])
        self.target.load_state_dict(state["target"])
        # a copy: Optimizer.load_state_dict would share a live state's moment tensors
        self.value_optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        self.generator.set_state(state["generator"].cpu())
        self.epochs_done, self.n_epochs = state["epochs_done"], state["n_epochs"]
        self.sums = dict(state["sums"])
        self.ended = EndedEpoch()

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"optimizer": self.value_optimizer}

    def to(self, device: torch.device) -> CreditBridge:
        super().to(device)
        self.warmup_feedback = [b.to(device) for b in self.warmup_feedback]
        self.value.to(device)
        self.target.to(device)
        return self
