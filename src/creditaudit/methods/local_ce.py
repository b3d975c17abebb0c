"""Local classifiers (Nøkland & Eidnes 2019, "Training neural networks with local error
signals", their loss 'pred'): every state trains on the cross-entropy of its own linear
classifier.

State l has a classifier (D_l, c_l), D_l of shape (C, d_l), that reads the detached state
through φ — identity for (B, d) vectors, the mean over tokens for (B, T, d) token states and
over positions for (B, d, H, W) feature maps (global average pooling, as the source pools its
convolutional maps). The credit of h_l is the per-sample gradient of that local loss:

    a_l = ∂/∂h_l CE(D_l φ(h_l) + c_l, y) = (softmax(D_l φ(h_l) + c_l) − onehot(y)) D_l,

spread evenly over the tokens or positions (the gradient of the mean), for every state h_0 …
h_L (the last one too, as in the source). The blocks train on the local surrogate with it;
with ``normalise_credit=false`` (this rule's default) the surrogate sends a_l/B, exactly
∂(batch-mean local CE_l)/∂h_l: the source's update of its hidden layers. The readout trains on
its exact cross-entropy of the detached h_L, as the source's output layer does.

The classifiers are the rule's own, not the model's (records describe the model): zeros at
init (the source zeroes D; the bias is zeroed here too, so the rule draws nothing), each
trained at every step on its own batch-mean local CE by an AdamW of its own without weight
decay, at the learning rate of the run's optimiser (read at every step, schedules included)
times ``classifier_lr_scale``. With D = 0 every credit of the first step is zero, so the
first step trains the readout alone: the source's behaviour.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor, nn

from creditaudit.config import MethodConfig, opt
from creditaudit.methods import adapted
from creditaudit.methods.base import CreditRule, LocalOptions, StepResult, output_error
from creditaudit.methods.feedback import aux_dtype, state_width
from creditaudit.methods.registry import register
from creditaudit.methods.surrogate import state_credit_shape
from creditaudit.models.adapted import AdaptedModel
from creditaudit.models.contract import ResidualNet
from creditaudit.optim import make_adamw

_NORMALISE_HELP = next(f.metadata["help"] for f in fields(LocalOptions)
                       if f.name == "normalise_credit")


@dataclass
class LocalCEOptions(LocalOptions):
    # Off here: the source trains its hidden layers on the raw local CE gradient.
    normalise_credit: bool = opt(False, _NORMALISE_HELP)
    classifier_lr_scale: float = opt(
        1.0, "local-ce: the classifiers' learning rate as a multiple of the run's (read from "
        "its optimiser at every step, schedules included); > 0: they start at zero, so at 0 "
        "every credit stays 0 and no block trains", min=0.0)


def pooled(state: Tensor) -> Tensor:
    """φ(h), (B, d): ``(B, d)`` unchanged, ``(B, T, d)`` mean over the tokens,
    ``(B, d, H, W)`` mean over the positions."""
    if state.dim() == 3:
        return state.mean(dim=1)
    if state.dim() == 4:
        return state.mean(dim=(2, 3))
    return state


def spread(gradient: Tensor, state: Tensor) -> Tensor:
    """∂φ/∂h applied to the (B, d) ``gradient``: shaped like ``state``, each token or
    position taking 1/(their count) of it."""
    positions = state[0, 0].numel() if state.dim() == 4 else (
        state.shape[1] if state.dim() == 3 else 1)
    return state_credit_shape(gradient / positions if positions > 1 else gradient, state)


@register
class LocalCE(CreditRule[LocalCEOptions]):
    """Every state's credit is the gradient of its own linear classifier's cross-entropy
    (module docstring)."""

    name = "local-ce"
    label = "Local CE"
    credit_formula = "a_l = D_l^T (softmax(D_l h_l + c_l) - onehot(y))"
    feedback_kind = "learned"
    local = True
    adapted_models = True
    color, marker = "#4400EE", "|"
    rank = 24
    own_parts = {"weights": ("local classifiers' weights", ("classifier_lr_scale",)),
                 "biases": ("local classifiers' biases", ("classifier_lr_scale",))}
    stacked_step = None

    @classmethod
    def refused_options(cls, options: Any) -> dict[str, str]:
        """``classifier_lr_scale=0``: the classifiers never leave their zero init, so every
        credit stays 0."""
        if options.classifier_lr_scale == 0:
            return {"classifier_lr_scale": (
                "keeps the local classifiers at their zero init: every credit would stay 0 "
                "and no block would train (they are learned, never fixed random); give a "
                "positive scale")}
        return {}

    def __init__(self, model: ResidualNet, config: MethodConfig, *, n_classes: int,
                 generator: torch.Generator) -> None:
        super().__init__(model, config, n_classes=n_classes, generator=generator)
        widths = (list(model.state_widths) if isinstance(model, AdaptedModel)
                  else [state_width(model)] * (model.n_blocks + 1))
        first = next(iter(model.parameters()), None)
        like = {"dtype": aux_dtype(model),
                "device": first.device if first is not None else torch.device("cpu")}
        self.weights = [nn.Parameter(torch.zeros(n_classes, width, **like)) for width in widths]
        self.biases = [nn.Parameter(torch.zeros(n_classes, **like)) for _ in widths]
        # lr 0 until the first step sets the run's (classifier_step)
        self.classifier_optimizer = make_adamw([*self.weights, *self.biases], lr=0.0,
                                               weight_decay=0.0)

    # --- credit -------------------------------------------------------------------------
    def local_errors(self, states: list[Tensor], y: Tensor) -> list[tuple[Tensor, Tensor]]:
        """(φ(h_l), e_l) per state: the (B, d_l) pooled detached state in the classifiers'
        dtype and e_l = softmax(D_l φ + c_l) − onehot(y), (B, C)."""
        out = []
        for h, weight, bias in zip(states, self.weights, self.biases, strict=True):
            features = pooled(h.detach().to(weight.dtype))
            out.append((features, output_error(features @ weight.T + bias, y)))
        return out

    @torch.no_grad()
    def classifier_credits(self, states: list[Tensor], y: Tensor, *,
                           keep_gradients: bool = False) -> list[Tensor]:
        """[a_0 … a_L], each shaped like its state (sum-CE scale: per-sample gradients).

        With ``keep_gradients`` each classifier's ``.grad`` is set to the gradient of its
        batch-mean local CE (eᵀφ/B, Σ_b e/B) for :meth:`classifier_step`. Autocast is off
        here: the classifiers stay in their own precision under a bf16 step.
        """
        with torch.autocast(y.device.type, enabled=False):
            errors = self.local_errors(states, y)
            credits = [spread(e @ weight, h)
                       for (_, e), weight, h in zip(errors, self.weights, states)]
            if keep_gradients:
                batch = y.shape[0]
                for (features, e), weight, bias in zip(errors, self.weights, self.biases):
                    weight.grad = e.T @ features / batch
                    bias.grad = e.sum(dim=0) / batch
        return credits

    @torch.no_grad()
    def credits(self, x: Tensor, y: Tensor) -> list[Tensor]:
        states, _ = self.model.forward_states(x)
        return self.classifier_credits(states, y)

    # --- training -----------------------------------------------------------------------
    def train_step(self, x: Tensor, y: Tensor, optimizer: torch.optim.Optimizer) -> StepResult:
        if isinstance(self.model, AdaptedModel):
            def credits_of(outputs: list[Tensor], logits: Tensor) -> Callable[[int], Tensor]:
                return self.classifier_credits(outputs, y, keep_gradients=True).__getitem__

            result = adapted.local_state_step(self, x, y, optimizer, credits_of)
        else:
            result = self.local_train_step(
                x, y, optimizer,
                lambda local: self.classifier_credits(local.states, y, keep_gradients=True))
        self.classifier_step(optimizer, result.finite)
        return result

    def classifier_step(self, optimizer: torch.optim.Optimizer, finite: bool) -> None:
        """One AdamW step of the classifiers on the gradients the step's credits left, at the
        run's current learning rate (its first parameter group's) × ``classifier_lr_scale``;
        none after a non-finite step."""
        if finite:
            lr = float(optimizer.param_groups[0]["lr"]) * self.options.classifier_lr_scale
            for group in self.classifier_optimizer.param_groups:
                group["lr"] = lr
            self.classifier_optimizer.step()
        self.classifier_optimizer.zero_grad(set_to_none=True)

    # --- persistence --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"weights": [w.detach().clone() for w in self.weights],
                "biases": [b.detach().clone() for b in self.biases],
                "optimizer": copy.deepcopy(self.classifier_optimizer.state_dict())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            for mine, saved in zip([*self.weights, *self.biases],
                                   [*state["weights"], *state["biases"]], strict=True):
                mine.copy_(saved)
        # a copy: Optimizer.load_state_dict would share a live state's moment tensors
        self.classifier_optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"optimizer": self.classifier_optimizer}

    def to(self, device: torch.device) -> LocalCE:
        super().to(device)
        n = len(self.weights)
        moved = [nn.Parameter(p.detach().to(device)) for p in [*self.weights, *self.biases]]
        self.weights, self.biases = moved[:n], moved[n:]
        state = self.classifier_optimizer.state_dict()
        self.classifier_optimizer = make_adamw(moved, lr=0.0, weight_decay=0.0)
        # load_state_dict casts the moments (and a fused AdamW's step) to the parameters'
        # device
        self.classifier_optimizer.load_state_dict(state)
        return self
