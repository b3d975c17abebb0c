"""The probe of an adapted model: what ``adapt()`` checks and learns before any training.

:func:`~creditaudit.models.adapted.adapt` checks everything on a probe batch before any
training and raises one-line :class:`~creditaudit.errors.ModelContractError`\\ s: first how
the network behaves (:mod:`creditaudit.models.adapt_behaviour`: it fails on the probe
inputs, gives NaN/Inf logits, replaces its parameters on every forward, changes its input
batch in place, is random or mixes samples in eval mode), then its states, here: unknown
names (with close matches), a state whose output is not one floating tensor of shape (B, d),
(B, T, d) or (B, C, H, W), a state module called twice or not at all, states listed out of
order, a state that does not reach the output, a state that is not a cut. It also learns
the states' shapes, the segments, the classes and whether the readout ends in a LayerNorm —
the fact the protocol's diagnosis of (b) rests on: the logits of a readout that normalises
h_L do not change when h_L is scaled.
A fact declared to ``adapt`` (``terminal_ln``, ``n_classes``) must agree with what the probe
finds; a contradiction is refused.

On PyTorch's meta device (a run plan sizes a model there: no memory, no values) the probe
learns the shapes only and checks nothing but a declared class count.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor, nn

from creditaudit.errors import ModelContractError
from creditaudit.formatting import error_text
from creditaudit.models.adapt_arguments import backward_hook_cause, checkpoint_cause
from creditaudit.models.adapt_behaviour import (
    MIXING_RTOL,  # noqa: F401 — importable from here as before
    check_independence,
    check_runs,
)
from creditaudit.models.contract import without_zero_samples
from creditaudit.models.direct_uses import DirectUses

# forward_from(l, h_l) must give the logits to this precision, relative to their scale
# (the tolerance diagnose() holds a user's forward_from to).
REPRODUCE_RTOL = 1e-4
# A readout is scale-invariant (ends in a LayerNorm) when scaling a unit-RMS h_L by 4 moves the
# logits by less than this, relative: a LayerNorm's eps and float32 rounding move them by
# ~1e-5, a readout linear in h_L by O(1).
SCALE_INVARIANT_RTOL = 1e-3


class AdaptProbe:
    """The probe of :class:`~creditaudit.models.adapted.AdaptedModel`, its one subclass: the
    methods read its ``net``, ``state_names``, ``readout_names``, ``n_blocks``, ``_trace``
    and ``forward_from``, and set ``state_shapes``, ``state_widths``, ``n_classes``,
    ``terminal_ln`` (unless declared) and the ``_prefixes``, ``_segments`` and ``_readout``
    that ``forward_from`` and the segments read.

    ``probe_calls``: the names of the submodules called in the probe's eval-mode forward
    with gradients on, as the diagnostics' credits run it (None on the meta device, where
    nothing runs) — what a rule that replaces layers checks when it is bound, with
    ``probe_direct_uses``: (module, parameter) multiplied directly in that forward
    (:class:`~creditaudit.models.direct_uses.DirectUses`; empty on the meta device)."""

    probe_calls: frozenset[str] | None
    probe_direct_uses: tuple[tuple[str, str], ...] = ()

    def _probe(self, x: Tensor, source: str, n_classes: int | None) -> None:
        """Learn the shapes and segments on ``x`` (``source``: what the caller passed, for
        messages) and check every state (module docstring) and the declared facts
        (``terminal_ln``, ``n_classes``: refused when the probe contradicts them).

        Runs in eval mode under a forked RNG with every floating parameter temporarily requiring
        grad (to find the segments), outside the caller's ``torch.inference_mode()`` (inside
        it the forward failed, read as the network's error); restores every module's
        training flag and every ``requires_grad`` and leaves parameters, buffers and
        ``.grad`` untouched. An exception the network raises is a one-line
        ModelContractError naming it.
        """
        modes = [(m, m.training) for m in self.net.modules()]
        flags = [(p, p.requires_grad) for p in self.net.parameters()]
        devices = [x.device] if x.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices), torch.inference_mode(False), \
                    torch.enable_grad():
                self.net.eval()
                for p, _ in flags:
                    if p.is_floating_point():  # an integer parameter (an index table) has none
                        p.requires_grad_(True)
                check_runs(self.net, x, source)
                check_independence(  # its passes need no gradient
                    self.net, x, functools.partial(self._trace, detach=False, leaf=False),
                    self.state_names)
                self._find_prefixes(x)
                self._check_states(x)
                self._check_classes(n_classes)
                self._find_segments(x)
                self._check_terminal_ln(self._readout_is_scale_invariant(x))
        except ModelContractError:
            raise
        except Exception as err:  # noqa: BLE001 — the user's network: name it and its error
            cause = (checkpoint_cause(type(self.net).__name__, err)
                     or backward_hook_cause(self.net, err, error_text(err)))
            if cause:
                raise ModelContractError(cause) from None
            raise ModelContractError(
                f"{type(self.net).__name__} raised {type(err).__name__} while adapt() probed "
                f"it on {source}: {error_text(err)}") from None
        finally:
            for module, training in modes:
                module.training = training
            for p, requires in flags:
                p.requires_grad_(requires)

    def probe_reads(self, parameter: str) -> bool:
        """Whether the states or logits of the probe's eval-mode forward depend on
        ``parameter`` (a name of ``net.named_parameters()``); False on the meta device."""
        if self.probe_calls is None:
            return False
        return any(parameter in segment for segment in (*self._segments, self._readout))

    def _check_classes(self, declared: int | None) -> None:
        if declared is not None and declared != self.n_classes:
            raise ModelContractError(
                f"n_classes={declared}, but {type(self.net).__name__} returns "
                f"{self.n_classes} logits: leave n_classes out, or adapt the network whose "
                "head has that many outputs")

    def _check_terminal_ln(self, probed: bool) -> None:
        """Keep the declared ``terminal_ln`` when the probe agrees (refuse it otherwise), or
        take the probe's finding when none was declared."""
        if self.terminal_ln is None:
            self.terminal_ln = probed
            return
        if self.terminal_ln != probed:
            does = "normalises" if probed else "does not normalise"
            moves = "do not move" if probed else "move"
            raise ModelContractError(
                f"terminal_ln={self.terminal_ln}, but the probe finds that "
                f"{type(self.net).__name__}'s readout {does} h_L (its logits {moves} when h_L "
                "is scaled ×4): leave terminal_ln out to use what the probe finds")

    def _check_states(self, x: Tensor) -> None:
        """Check the states and learn :attr:`probe_calls` from a pass run as the credits'
        is (eval mode, gradients on, every parameter requiring one, states in the graph: so
        neither PyTorch's attention fast path nor a fused detached-input path skips a
        submodule the credits' pass calls)."""
        order: list[int] = []
        with DirectUses(self.net, x) as probe:
            states, logits = self._trace(x, detach=False, leaf=True, order=order)
        self.probe_calls, self.probe_direct_uses = frozenset(probe.called), tuple(probe.found)
        if order != sorted(order):
            first, second = (self.state_names[i] for i in _first_inversion(order))
            raise ModelContractError(
                f"states must be listed in the order the forward pass computes them: "
                f"{first!r} runs after {second!r}")
        for name, h in zip(self.state_names, states):
            if h.dim() not in (2, 3, 4) or h.shape[0] != x.shape[0]:
                raise ModelContractError(
                    f"state {name!r} has shape {tuple(h.shape)} for a batch of {x.shape[0]}: "
                    "states must be (B, d) vectors, (B, T, d) tokens or (B, C, H, W) maps")
        self.state_shapes = tuple(tuple(h.shape[1:]) for h in states)
        self.state_widths = tuple(int(h.shape[1] if h.dim() == 4 else h.shape[-1])
                                  for h in states)
        self.n_classes = int(logits.shape[1])
        # (_trace makes a state without a graph a leaf: one without is computed with
        # gradients switched off inside the forward)
        cut = next((name for name, h in zip(self.state_names, states) if not h.requires_grad),
                   None)
        if cut is not None:
            raise ModelContractError(
                f"state {cut!r} is computed under torch.no_grad() inside the forward, so no "
                "gradient can be measured at it: to keep what it computes from training, "
                "remove the torch.no_grad() and freeze its parameters "
                "(p.requires_grad_(False)) instead, which the record then lists")
        grads = torch.autograd.grad(logits.sum(), states, allow_unused=True)
        for name, grad in zip(self.state_names, grads):
            if grad is None:
                raise ModelContractError(
                    f"state {name!r} does not reach the output: no gradient of the logits "
                    "flows back to it (they do not depend on it, or the forward uses it "
                    "through .detach() or under torch.no_grad()); name modules on the path "
                    "from the input to the logits, and keep that path differentiable")
        scale = float(logits.detach().abs().max()) + 1.0
        logits = logits.detach()

        def rerun_gap(layer: int, h: Tensor) -> float:
            # Rerun as the logits were computed, with gradients (the state in the graph):
            # under no_grad PyTorch's encoder layers take their fused fast path, which differs
            # from the slow one by the dtype's rounding — 0.016 in bfloat16, a false "not a cut".
            with torch.enable_grad():
                rerun = self.forward_from(layer, h.detach().requires_grad_(True))
            return float((rerun.detach() - logits).abs().max())

        for layer, (name, h) in enumerate(zip(self.state_names, states)):
            gap = rerun_gap(layer, h)
            if not gap <= REPRODUCE_RTOL * scale and self._prefixes[layer]:
                # a prefix read by shape-dependent code: run it after all
                self._prefixes[layer] = ()
                gap = rerun_gap(layer, h)
            if not gap <= REPRODUCE_RTOL * scale:
                raise ModelContractError(
                    f"state {name!r} is not a cut of the network: the logits depend on "
                    f"the input other than through it (rerun from it they differ by "
                    f"{gap:.3g}), e.g. a skip connection jumps over it; name block "
                    "outputs, whose value is all the rest of the network reads")

    def _learn_shapes(self, x: Tensor, n_classes: int | None) -> None:
        """On the meta device: the states' shapes and the classes from one traced forward
        (values do not exist there, so only the declared class count is checked and no
        segment is found)."""
        with torch.no_grad():
            states, logits = self._trace(x, detach=False, leaf=False)
        self.state_shapes = tuple(tuple(h.shape[1:]) for h in states)
        self.state_widths = tuple(int(h.shape[1] if h.dim() == 4 else h.shape[-1])
                                  for h in states)
        self.n_classes = int(logits.shape[1])
        self.probe_calls, self.probe_direct_uses = None, ()
        self._check_classes(n_classes)

    def _readout_is_scale_invariant(self, x: Tensor) -> bool:
        """Whether the logits stay put when h_L is scaled by 4: a readout that normalises
        h_L. Each sample's h_L (a fixed random one where it is exactly zero, which scaling
        leaves as it is) is first brought to unit RMS, where a LayerNorm's eps is
        negligible (~1e-5) and a saturating nonlinearity (tanh) is not saturated yet. It is
        divided by its largest magnitude before its RMS is taken, so that squaring an h_L of
        1e-25 or 1e25 neither underflows nor overflows."""
        with torch.no_grad():
            states, _ = self._trace(x, detach=True, leaf=False)
            h = without_zero_samples(states[-1])
            per_sample = (-1, *([1] * (h.dim() - 1)))
            h = h / h.flatten(1).abs().amax(dim=1).view(per_sample)
            h = h / h.flatten(1).pow(2).mean(dim=1).sqrt().view(per_sample)
            base = self.forward_from(self.n_blocks, h)
            scaled = self.forward_from(self.n_blocks, 4.0 * h)
        change = float((scaled - base).norm()) / max(float(base.norm()), 1e-30)
        return change < SCALE_INVARIANT_RTOL

    def _find_prefixes(self, x: Tensor) -> None:
        """For each state, the largest modules that finish before its module starts, run
        once and return one batch-first floating tensor: :meth:`forward_from` skips them (zeros of
        their output shape), since behind a cut their values reach nothing."""
        events: list[tuple[str, str]] = []
        shapes: dict[str, tuple[int, ...] | None] = {}
        calls: dict[str, int] = {}

        def started(name: str, module: nn.Module, args: Any) -> None:
            events.append(("start", name))
            calls[name] = calls.get(name, 0) + 1

        def ended(name: str, module: nn.Module, args: Any, output: Any) -> None:
            events.append(("end", name))
            batch_first = (isinstance(output, Tensor) and output.is_floating_point()
                           and output.dim() >= 1 and output.shape[0] == x.shape[0])
            shapes[name] = tuple(output.shape[1:]) if batch_first else None

        named = [(name, m) for name, m in self.net.named_modules() if name]
        handles = [h for name, m in named for h in (
            m.register_forward_pre_hook(functools.partial(started, name)),
            m.register_forward_hook(functools.partial(ended, name)))]
        try:
            with torch.no_grad():
                self.net(x)
        finally:
            for handle in handles:
                handle.remove()
        ends = {name: i for i, (kind, name) in enumerate(events) if kind == "end"}
        prefixes = []
        for state in self.state_names:
            start = events.index(("start", state))
            done = {name for name, end in ends.items()
                    if end < start and calls[name] == 1 and shapes[name] is not None}
            prefixes.append(tuple((name, shapes[name]) for name, _ in named if name in done
                                  and name.rpartition(".")[0] not in done))
        self._prefixes: list[tuple[tuple[str, tuple[int, ...]], ...]] = prefixes

    def _find_segments(self, x: Tensor) -> None:
        named = [(name, p) for name, p in self.net.named_parameters() if p.requires_grad]
        names, params = [name for name, _ in named], [p for _, p in named]
        outputs, logits = self._trace(x, detach=True, leaf=False)

        def reached(out: Tensor) -> list[str]:
            if not out.requires_grad:
                return []
            grads = torch.autograd.grad(out.sum(), params, allow_unused=True,
                                        retain_graph=True)
            return [name for name, g in zip(names, grads) if g is not None]

        self._segments = [reached(out) for out in outputs]
        self._readout = reached(logits)
        if self.readout_names is not None:
            self._check_readout()

    def _check_readout(self) -> None:
        """The named readout modules' parameters must be exactly the detected readout's."""
        named = {id(p): name for name, p in self.net.named_parameters()}
        declared = {named[id(p)] for module in self.readout_names
                    for p in self.net.get_submodule(module).parameters()}
        before = sorted(declared - set(self._readout))
        if before:
            raise ModelContractError(
                f"readout: parameter {before[0]!r} acts before the last state "
                f"{self.state_names[-1]!r}; the readout is what runs after it")
        missing = sorted(set(self._readout) - declared)
        if missing:
            raise ModelContractError(
                f"readout: parameter {missing[0]!r} also acts after the last state "
                f"{self.state_names[-1]!r}; add its module to readout= or leave readout out "
                "(it is then everything after the last state)")


def _first_inversion(order: list[int]) -> tuple[int, int]:
    """(i, j): the first pair of listed states whose calls came in the other order."""
    for a, b in zip(order, order[1:]):
        if b < a:
            return b, a
    raise AssertionError("no inversion")  # pragma: no cover


__all__ = ["AdaptProbe"]
