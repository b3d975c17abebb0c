"""State Bridge: credit through a learned predictor of the terminal state (science.md §4).

A predictor G_ψ(h_l, l, e) estimates the terminal state h_L from the state h_l, the layer
index l and the output error e = softmax(logits) − onehot(y). The credit of state l is the
gradient of the loss the readout would give the *predicted* terminal state:

    a_l = ∇_{h_l} CE(readout(G_ψ(h_l, l, e)), y)        (l < L),
    a_L = ∂CE/∂h_L through the readout (exact; G at l = L would be the identity).

The gradient flows through the predictor and the current readout but is taken with respect
to the state only, so neither the readout nor ψ receives ``.grad`` from it. The predictor is
fitted with its own AdamW on the normalised error ‖G − h_L‖² / (‖h_L‖² + eps) on detached
states, all layers l < L in one batch; the mean error over an epoch is logged as
``state_pred_error``.

Predictor (``BridgePredictor``, defaults): input [LN(h_l) (no affine), a learned 32-d
embedding of l, e] → 2 hidden layers × ``bridge_hidden`` (256) with GELU → d, the output
being the prediction G = MLP(…) itself (the recipe's design, and the default). With
``bridge_skip`` the MLP is instead a scaled correction of the current state,
G = h_l + RMS(h_l)·MLP(…), whose last layer starts at zero: G then starts as the identity —
the exact map of a residual net whose branches are zero, close to the N(0, 0.01) init of
science.md §3 — and the RMS factor lets the prediction follow the stream's scale, which the
LayerNorm'd input cannot carry. The variant changes the rule materially: its credit starts
as the readout gradient at h_l, close to BP's in a near-identity residual net. Any module or
function with the signature ``G(h, layer, e)`` can be plugged in (:meth:`StateBridge.
set_predictor`), e.g. the true map h_l → h_L in tests.

The shared pieces of the two bridges (input encoder, seeded initialisation of auxiliary
nets, their dtype) live here and are imported by :mod:`creditaudit.methods.credit_bridge`.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.config import MethodConfig, opt
from creditaudit.methods.base import (
    CreditRule,
    LocalOptions,
    SeededOptions,
    StepResult,
    output_error,
    step_result,
)
from creditaudit.methods.epoch_fields import EndedEpoch
from creditaudit.methods.feedback import aux_dtype, state_width
from creditaudit.methods.logits import checked_logits
from creditaudit.methods.registry import register
from creditaudit.methods.surrogate import local_backward, local_forward
from creditaudit.models.contract import (
    ResidualNet,
    feature_rows,
    from_feature_rows,
    readout_parameters,
)
from creditaudit.optim import make_adamw

LAYER_EMBED_DIM = 32
PREDICTION_EPS = 1e-6
AUX_WEIGHT_DECAY = 0.01  # the recipe's AdamW weight decay (science.md §4), for aux nets too

# G(h, layer, e) -> predicted h_L, shaped like h. ``layer`` is an int (every row at one
# layer) or a (N,) int64 tensor (one layer index per row); ``e`` is (N, C).
Predictor = Callable[[Tensor, "int | Tensor", Tensor], Tensor]


# --- shared by both bridges ---------------------------------------------------------------
@contextlib.contextmanager
def seeded_init(generator: torch.Generator, dtype: torch.dtype) -> Iterator[None]:
    """Initialise auxiliary nets from the rule's own generator, not torch's global RNG, in
    ``dtype`` (:func:`aux_dtype`), not the caller's default dtype.

    The global CPU stream is forked and reseeded from ``generator`` inside the block, so
    building a rule never moves the random stream that training and data use; the CUDA
    streams are not touched (``torch.manual_seed`` would reseed them too, outside the
    fork); torch's default dtype is ``dtype`` inside and the caller's after.
    """
    # on the generator's own device, also where tensors default to another (a run plan
    # sizes the rule on the meta device)
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
    before = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        torch.set_default_dtype(dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(before)


def layer_ids(layer: int | Tensor, n: int, device: torch.device) -> Tensor:
    """(N,) int64 layer index per row from an int or a (N,) tensor."""
    if isinstance(layer, Tensor):
        return layer.to(device=device, dtype=torch.long)
    return torch.full((n,), int(layer), dtype=torch.long, device=device)


def mlp(in_dim: int, hidden: int, depth: int, out_dim: int) -> nn.Sequential:
    """``depth`` hidden Linear+GELU layers of width ``hidden``, then Linear → ``out_dim``."""
    layers: list[nn.Module] = []
    width = in_dim
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.GELU()]
        width = hidden
    layers.append(nn.Linear(width, out_dim))
    return nn.Sequential(*layers)


class BridgeInput(nn.Module):
    """[LN(h), embed(l), e] per row (per token for (N, T, d) token states; feature maps come
    as (N, H·W, d) rows, see :func:`~creditaudit.models.contract.feature_rows`).

    LN has no affine parameters: it only removes the stream's scale, which grows by orders
    of magnitude under some rules. Output width d + 32 + C.
    """

    def __init__(self, d: int, n_layers: int, n_classes: int,
                 embed_dim: int = LAYER_EMBED_DIM) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d, elementwise_affine=False)
        self.layer_embed = nn.Embedding(n_layers, embed_dim)
        self.out_dim = d + embed_dim + n_classes

    def forward(self, h: Tensor, layer: int | Tensor, e: Tensor) -> Tensor:
        n = h.shape[0]
        context = torch.cat([self.layer_embed(layer_ids(layer, n, h.device)),
                             e.to(h.dtype)], dim=-1)
        if h.dim() == 3:
            context = context.unsqueeze(1).expand(-1, h.shape[1], -1)
        return torch.cat([self.ln(h), context], dim=-1)


def split_rows(stacked: Tensor, batch: int) -> list[Tensor]:
    """Undo a layer-major ``torch.cat`` of per-layer (B, …) tensors."""
    return list(stacked.split(batch))


def readout_dtype(model: ResidualNet) -> torch.dtype:
    """The dtype the readout computes in: its parameters' (``bfloat16`` for a network cast
    with ``.to(torch.bfloat16)``, below the bridges' own dtype, :func:`aux_dtype`, which is
    at least float32); :func:`aux_dtype` for a readout without parameters."""
    for param in readout_parameters(model):
        if param.is_floating_point():
            return param.dtype
    return aux_dtype(model)


def exact_top_credit(model: ResidualNet, h_last: Tensor, y: Tensor) -> Tensor:
    """a_L = ∂CE/∂h_L (batch-mean CE) through the readout, in its dtype
    (:func:`readout_dtype`); no param .grad."""
    h = h_last.detach().to(readout_dtype(model)).requires_grad_(True)
    with torch.enable_grad():
        ce = F.cross_entropy(checked_logits(model, model.readout(h), y), y)
        (grad,) = torch.autograd.grad(ce, h)
    return grad.detach()


# --- the State Bridge ---------------------------------------------------------------------
class BridgePredictor(nn.Module):
    """G_ψ(h, l, e) = MLP([LN(h), embed(l), e]) for layers l = 0 … L−1 (per token of token
    states, per position of feature maps); with ``skip``: G_ψ = h + RMS(h)·MLP(…), the last
    layer zero-initialised so G starts as the identity (RMS over the feature axis per row).

    ``hidden`` × ``depth`` GELU layers (default 256 × 2), output width d.
    """

    def __init__(self, d: int, n_layers: int, n_classes: int, *, hidden: int = 256,
                 depth: int = 2, skip: bool = False) -> None:
        super().__init__()
        self.skip = skip
        self.inputs = BridgeInput(d, n_layers, n_classes)
        self.net = mlp(self.inputs.out_dim, hidden, depth, d)
        if skip:
            nn.init.zeros_(self.net[-1].weight)
            nn.init.zeros_(self.net[-1].bias)

    def forward(self, h: Tensor, layer: int | Tensor, e: Tensor) -> Tensor:
        rows = feature_rows(h)  # feature maps: one row per position
        out = self.net(self.inputs(rows, layer, e))
        if self.skip:
            out = rows + rows.pow(2).mean(dim=-1, keepdim=True).sqrt() * out
        return from_feature_rows(out, h)


@dataclass
class BridgeOptions:
    """What both bridges' auxiliary nets share."""

    bridge_hidden: int = opt(256, "State/Credit Bridge: hidden width of the auxiliary net",
                             min=1)
    bridge_lr: float = opt(1e-3, "State/Credit Bridge: AdamW learning rate of the auxiliary "
                           "net, constant (optim.schedule does not apply to it)", min=0.0)


@dataclass
class StateBridgeOptions(SeededOptions, LocalOptions, BridgeOptions):
    bridge_skip: bool = opt(
        False, "State Bridge: predict h_L as h_l + RMS(h_l)·MLP(…) (identity at init) instead "
        "of MLP(…)")


@register
class StateBridge(CreditRule[StateBridgeOptions]):
    """Credit a_l = ∇_{h_l} CE(readout(G_ψ(h_l, l, e)), y); G_ψ fitted to h_L on the fly."""

    name = "state-bridge"
    residual_reason = ("its predictor maps states of one width d to h_L and reads them "
                       "through the readout")
    label = "State Bridge"
    credit_formula = "a_l = ∇_{h_l} CE(readout(G(h_l, l, e)), y)"
    feedback_kind = "learned"
    local = True
    color, marker = "#AE76A3", "<"
    rank = 40
    own_parts = {"predictor": ("predictor G_ψ", ("bridge_lr",))}

    def __init__(self, model: ResidualNet, config: MethodConfig, *, n_classes: int,
                 generator: torch.Generator, predictor: Predictor | None = None) -> None:
        super().__init__(model, config, n_classes=n_classes, generator=generator)
        self.generator = generator
        self.dtype = aux_dtype(model)
        if predictor is None:
            with seeded_init(generator, self.dtype):
                predictor = BridgePredictor(state_width(model), model.n_blocks, n_classes,
                                            hidden=self.options.bridge_hidden,
                                            skip=self.options.bridge_skip).to(self.dtype)
        self.predictor: Predictor
        self.predictor_optimizer: torch.optim.Optimizer | None = None
        self.set_predictor(predictor)
        self.error_sum, self.error_count = 0.0, 0
        self.ended = EndedEpoch()
        # the step's predictor forward, handed from step_credits to fit_predictor
        self.kept_prediction: Tensor | None = None

    def set_predictor(self, predictor: Predictor, *, train: bool = True) -> None:
        """Plug in a predictor ``G(h, layer, e)``.

        With ``train`` (and parameters) it gets its own AdamW (``bridge_lr``, the recipe's
        weight decay 0.01, constant rate); ``train=False`` keeps it fixed (e.g. a true map).
        """
        self.predictor = predictor
        params = list(predictor.parameters()) if isinstance(predictor, nn.Module) else []
        self.predictor_optimizer = (make_adamw(params, lr=self.options.bridge_lr,
                                               weight_decay=AUX_WEIGHT_DECAY)
                                    if train and params else None)

    # --- credit -------------------------------------------------------------------------
    def predict_low(self, states: list[Tensor], e: Tensor) -> tuple[Tensor, Tensor]:
        """(inputs, G(inputs)) for every layer l < L in one batch, rows layer-major.

        ``inputs`` (n·B, …) are the detached states in the bridge dtype, a leaf that
        requires grad (the credit is ∂/∂inputs); the prediction keeps its graph to ψ.
        """
        batch, n_low = e.shape[0], len(states) - 1
        stacked = torch.cat([h.detach().to(self.dtype) for h in states[:-1]])
        stacked.requires_grad_(True)
        layers = torch.arange(n_low, device=stacked.device).repeat_interleave(batch)
        e_rows = e.to(device=stacked.device, dtype=self.dtype).repeat(n_low, 1)
        with torch.enable_grad():
            return stacked, self.predictor(stacked, layers, e_rows)

    def bridge_credits(self, states: list[Tensor], e: Tensor, y: Tensor, *,
                       keep_prediction: bool = False) -> list[Tensor]:
        """[a_0 … a_L] from detached states and the output error (batch-mean CE scale).

        Credits come in the bridge dtype (the model's fp32/fp64, also under bf16 autocast).

        All layers l < L go through the predictor in one batch; the rows of different
        samples and layers never mix, so one gradient of the summed CE / B gives every
        layer's batch-mean-CE gradient. With ``keep_prediction`` the prediction (and its
        graph to ψ) is kept for :meth:`fit_predictor`, which then needs no second forward.
        """
        batch, n_low = y.shape[0], len(states) - 1
        credits: list[Tensor] = []
        if n_low > 0:
            stacked, predicted = self.predict_low(states, e)
            with torch.enable_grad():
                logits = self.model.readout(predicted.to(readout_dtype(self.model)))
                labels = y.repeat(n_low)
                ce = F.cross_entropy(checked_logits(self.model, logits, labels), labels,
                                     reduction="sum") / batch
                (grad,) = torch.autograd.grad(ce, stacked, retain_graph=keep_prediction)
            credits = split_rows(grad.detach(), batch)
            if keep_prediction:
                self.kept_prediction = predicted
        credits.append(exact_top_credit(self.model, states[-1], y).to(self.dtype))
        return credits

    @torch.no_grad()
    def credits(self, x: Tensor, y: Tensor) -> list[Tensor]:
        states, logits = self.model.forward_states(x)
        return self.bridge_credits(states, output_error(logits, y), y)

    def step_credits(self, states: list[Tensor], e: Tensor, y: Tensor) -> list[Tensor]:
        """The credits a training step uses (a seam for zero-leak tests); keeps the
        predictor's forward for the step's fit."""
        return self.bridge_credits(states, e, y, keep_prediction=True)

    # --- training -----------------------------------------------------------------------
    def prediction_error(self, states: list[Tensor], e: Tensor,
                         predicted: Tensor | None = None) -> Tensor:
        """Mean over layers l < L and samples of ‖G(h_l) − h_L‖² / (‖h_L‖² + 1e-6).

        ``predicted``: G on these states from :meth:`predict_low` (else it is run here).
        """
        n_low = len(states) - 1
        if predicted is None:
            predicted = self.predict_low(states, e)[1]
        target = states[-1].detach().to(self.dtype)
        # (n, B, …) against the (B, …) target by broadcasting, not n materialised copies
        error = (predicted.view(n_low, *target.shape) - target).flatten(2).pow(2).sum(dim=2)
        return (error / (target.flatten(1).pow(2).sum(dim=1) + PREDICTION_EPS)).mean()

    def fit_predictor(self, states: list[Tensor], e: Tensor,
                      predicted: Tensor | None = None) -> float:
        """One AdamW step of ψ on the normalised prediction error; returns the error before.

        ``predicted`` as in :meth:`prediction_error` (the step's own credit forward).
        """
        if len(states) < 2:
            return 0.0
        with torch.enable_grad():
            loss = self.prediction_error(states, e, predicted)
        if self.predictor_optimizer is not None:
            params = [p for group in self.predictor_optimizer.param_groups
                      for p in group["params"]]
            self.predictor_optimizer.zero_grad(set_to_none=True)
            loss.backward(inputs=params)  # ψ only: the inputs' gradient is not needed
            self.predictor_optimizer.step()
        return float(loss.detach())

    def train_step(self, x: Tensor, y: Tensor, optimizer: torch.optim.Optimizer) -> StepResult:
        optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            local = local_forward(self.model, x)
            ce = F.cross_entropy(checked_logits(self.model, local.logits, y), y)
        e = output_error(local.logits, y)
        self.kept_prediction = None
        credits = self.step_credits(local.states, e, y)
        # One predictor forward serves the credit and the fit (ψ has not moved in between).
        predicted, self.kept_prediction = self.kept_prediction, None
        result = step_result(ce, local.logits, y, local.states[-1])
        if result.finite:
            self.error_sum += self.fit_predictor(local.states, e, predicted)
            self.error_count += 1
            local_backward(local, ce, [self.credit_gradient(a, y.shape[0]) for a in credits],
                           self.options.penalty)
            optimizer.step()
        return result

    def end_epoch(self, epoch: int, n_epochs: int) -> dict[str, float]:
        """``state_pred_error``: the mean prediction error of the epoch's steps (the same
        epoch ended again with no step since gives it again: :class:`EndedEpoch`)."""
        if (again := self.ended.again(epoch, self.error_count)) is not None:
            return again
        error = self.error_sum / self.error_count if self.error_count else float("nan")
        self.error_sum, self.error_count = 0.0, 0
        return self.ended.keep(epoch, {"state_pred_error": error})

    # --- persistence --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        predictor = self.predictor
        return {
            "predictor": (predictor.state_dict() if isinstance(predictor, nn.Module) else None),
            "optimizer": (self.predictor_optimizer.state_dict()
                          if self.predictor_optimizer is not None else None),
            "generator": self.generator.get_state(),
            "error_sum": self.error_sum,
            "error_count": self.error_count,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("predictor") is not None and isinstance(self.predictor, nn.Module):
            self.predictor.load_state_dict(state["predictor"])
        if state.get("optimizer") is not None and self.predictor_optimizer is not None:
            # a copy: Optimizer.load_state_dict would share a live state's moment tensors
            self.predictor_optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        self.generator.set_state(state["generator"].cpu())
        self.error_sum, self.error_count = state["error_sum"], state["error_count"]
        self.ended = EndedEpoch()

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        optimizer = self.predictor_optimizer  # None when the predictor is fixed
        return {"optimizer": optimizer} if optimizer is not None else {}

    def to(self, device: torch.device) -> StateBridge:
        super().to(device)
        if isinstance(self.predictor, nn.Module):
            self.predictor.to(device)
        return self
