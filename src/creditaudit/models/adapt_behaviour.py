"""What :func:`~creditaudit.models.adapted.adapt` requires of how a network behaves, checked
on the probe batch before its states are looked at (:mod:`creditaudit.models.adapt_probe`
then learns and checks those): the network runs on the inputs given (named with its error;
one whose forward needs several inputs is told so), keeps its parameters (BioTorch's uSF and
brSF layers replace theirs on every forward), gives finite logits (the parameter holding
NaN/Inf named) — :func:`check_runs` —, and in eval mode, where the diagnostics run, leaves
its input batch alone, is deterministic and keeps samples apart (each sample's outputs must
not depend on the other samples of the batch) — :func:`check_independence`. Each failure
is a one-line :class:`~creditaudit.errors.ModelContractError` saying how to fix the
network."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from creditaudit.errors import ModelContractError
from creditaudit.formatting import counted, error_text
from creditaudit.models import adapt_arguments

# Sample 0's outputs may move by this much (relative) when the other samples change:
# rounding of batched kernels, never a mixing layer (those move it by O(1)).
MIXING_RTOL = 1e-5

# (states, logits) of the network's forward on a batch, as the probe traces it.
Trace = Callable[[Tensor], tuple[list[Tensor], Tensor]]


def check_runs(net: nn.Module, x: Tensor, source: str) -> None:
    """The network ``net`` runs on ``x`` (``source``: what the caller passed, for messages),
    keeps its parameters (the same objects after a forward) and gives finite logits — before
    any check that would misread a failure of these."""
    name = type(net).__name__
    before = list(net.named_parameters())
    try:
        with torch.no_grad():
            logits = net(x)
    except Exception as err:  # noqa: BLE001 — the user's network on the user's input
        raise ModelContractError(adapt_arguments.several_inputs_cause(net, err) or (
            f"adapt() ran {name} on {source} ({_dtype(x)}, shape {tuple(x.shape)}) and it "
            f"raised {type(err).__name__}: {error_text(err)}; pass inputs its forward "
            "takes")) from None
    after = dict(net.named_parameters())
    replaced = next((n for n, p in before if after.get(n) is not p), None)
    if replaced is not None:
        raise ModelContractError(
            f"{name} replaces its parameter {replaced!r} with a new one on every forward "
            "(as BioTorch's uSF and brSF layers do): rules train and diagnostics read "
            "parameters that stay the same objects; adapt the plain network and bind "
            "creditaudit's own rule, e.g. rule('usf', model) or rule('brsf', model)")
    if isinstance(logits, Tensor) and logits.is_floating_point() \
            and not bool(torch.isfinite(logits).all()):
        tensors = [*net.named_parameters(), *net.named_buffers()]
        bad = next((n for n, t in tensors if t.is_floating_point()
                    and not bool(torch.isfinite(t).all())), None)
        why = (f"its {'parameter' if bad in after else 'buffer'} {bad!r} holds NaN/Inf; "
               "adapt a network with finite weights" if bad is not None else
               "its weights and the probe inputs are finite, so an operation overflows")
        raise ModelContractError(f"{name} gives NaN/Inf logits on the probe batch: {why}")


def check_independence(net: nn.Module, x: Tensor, trace: Trace,
                       state_names: Sequence[str]) -> None:
    """Eval-mode outputs (the states ``state_names`` and the logits, as ``trace`` gives them)
    must be the same on a second pass over the same batch ``x``, and sample 0's must not
    move when the other samples change. Runs in whatever mode the caller set (the probe:
    eval)."""
    if x.shape[0] < 2:
        raise ModelContractError(f"the probe batch has {counted(x.shape[0], 'sample')}: give "
                                 "adapt() at least 2 (example=x[:8])")
    rest = x[1:] * 2.0 + 1.0 if x.is_floating_point() else x[1:].flip(-1)
    with torch.no_grad():
        probe = x.clone()  # the first pass on a copy: did the forward edit it?
        again, again_logits = trace(probe)
        if not torch.equal(probe, x) and not (
                x.is_floating_point() and torch.allclose(probe, x, rtol=0.0, atol=0.0,
                                                         equal_nan=True)):
            raise ModelContractError(
                "the model's forward changes its input batch in place (an in-place op "
                "on its input, such as x.mul_(…) or x -= …?), and the diagnostics "
                "forward one batch many times: make the forward work on a copy "
                "(x = x * …)")
        states, logits = trace(x)
        other_states, other_logits = trace(torch.cat([x[:1], rest]))
    names = [*state_names, "the logits"]
    for name, a, b in zip(names, [*states, logits], [*again, again_logits], strict=True):
        # the mixing tolerance: a device's own non-determinism in sums is not randomness
        if float((a - b).abs().max()) > MIXING_RTOL * (float(a.abs().max()) + 1.0):
            raise ModelContractError(
                f"the model's eval-mode forward is random: two passes over the same batch "
                f"differ at {name!r} (dropout called with training=True, or torch.rand… "
                "in its forward?), and the diagnostics compare outputs of the same "
                "samples; make the forward deterministic in eval mode (nn.Dropout, or "
                "F.dropout(..., training=self.training))")
    pairs = [*zip(state_names, states, other_states), ("the logits", logits, other_logits)]
    for name, a, b in pairs:
        scale = float(a[0].abs().max()) + 1.0
        if float((a[0] - b[0]).abs().max()) > MIXING_RTOL * scale:
            culprit = next((n for n, m in net.named_modules()
                            if isinstance(m, nn.modules.batchnorm._BatchNorm)
                            and m.running_mean is None), None)
            why = (f"BatchNorm {culprit!r} has track_running_stats=False, so it "
                   "normalises with batch statistics in eval mode too" if culprit
                   else f"at {name!r} or before it")
            raise ModelContractError(
                f"the model mixes samples in eval mode ({why}): sample 0's output "
                "changes with the other samples of the batch, and the diagnostics need "
                "per-sample outputs; use layers that act per sample in eval mode "
                "(BatchNorm with running statistics, LayerNorm, GroupNorm)")


def _dtype(x: Tensor) -> str:
    return str(x.dtype).removeprefix("torch.")


__all__ = ["MIXING_RTOL", "Trace", "check_independence", "check_runs"]
