"""Parameters an adapted network's forward multiplies its signal by outside any weight layer.

The per-layer feedback rules (``fa-linear``, ``usf``, ``brsf``, ``frsf``, ``kp``) replace the
backward of nn.Linear, nn.Conv2d and nn.MultiheadAttention. A forward that multiplies its
signal by a parameter itself (``x @ self.W``, ``F.linear(x, self.W)``, ``torch.einsum(…,
self.W)``, a tied readout ``F.linear(h, self.embed.weight)``) passes the signal down through
W exactly while the record names the rule, so such a use must be refused.
:class:`DirectUses`, active during :func:`~creditaudit.adapt`'s probe forward, finds them:
a matrix product or convolution (:data:`PRODUCTS`) one of whose factors (the term an
``addmm`` adds is none, :data:`ADDED_TO`, nor the ``bias`` of ``F.linear`` or
``F.conv2d``, :data:`BIASED`) depends on the input batch and another on a parameter
of the network alone (the parameter, or a tensor
computed from parameters only: ``W.t()``, ``W * mask``, ``U @ V``, a buffer ``W`` is
written into: ``buf[:k, :k] = W``, ``x.new_zeros(d, d).copy_(W)``), called while no weight
layer's own forward (:data:`LAYERS`) is running. Elementwise uses of parameters (a scale
vector, a positional embedding added, a class token concatenated, a norm's affine, an
Embedding lookup) are no products and stay accepted.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

# Layers whose forward a per-layer rule replaces, or refuses by its type: what happens
# inside them is theirs (a Conv1d's or an LSTM's own products are refused as the layer).
REPLACED = (nn.Linear, nn.Conv2d, nn.MultiheadAttention)
UNSUPPORTED = (nn.Conv1d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
               nn.Bilinear, nn.RNNBase, nn.RNNCellBase)
LAYERS = REPLACED + UNSUPPORTED
# The calls that multiply a signal by a weight: the torch functions, their torch.linalg
# spellings (distinct objects: torch.linalg.matmul is not torch.matmul) and the Tensor
# methods, in-place ones included (zeros.addmm_(x, W), zeros.baddbmm(x, W)).
PRODUCTS = frozenset({
    F.linear, F.bilinear, torch.matmul, torch.mm, torch.bmm, torch.mv, torch.addmm,
    torch.baddbmm, torch.addbmm, torch.addmv, torch.addr, torch.dot, torch.vdot, torch.einsum,
    torch.tensordot, torch.inner, torch.outer, torch.chain_matmul, torch.linalg.matmul,
    torch.linalg.vecdot, torch.linalg.multi_dot, F.conv1d, F.conv2d, F.conv3d, F.conv_tbc,
    F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d, Tensor.__matmul__,
    Tensor.__rmatmul__, Tensor.matmul, Tensor.mm, Tensor.bmm, Tensor.mv, Tensor.dot,
    Tensor.vdot, Tensor.inner, Tensor.outer, Tensor.addmm, Tensor.addmm_, Tensor.addmv,
    Tensor.addmv_, Tensor.addbmm, Tensor.addbmm_, Tensor.baddbmm, Tensor.baddbmm_,
    Tensor.addr, Tensor.addr_,
})
# The products that add a term to the product (β·input + α·mat1·mat2, ``input`` the first
# argument, or ``self`` of the method): the term is added, not multiplied, so a parameter
# there (a learned attention bias, ``torch.baddbmm(self.bias, q, kᵀ)``) is no direct use.
ADDED_TO = frozenset({
    torch.addmm, torch.baddbmm, torch.addbmm, torch.addmv, torch.addr, Tensor.addmm,
    Tensor.addmm_, Tensor.addmv, Tensor.addmv_, Tensor.addbmm, Tensor.addbmm_, Tensor.baddbmm,
    Tensor.baddbmm_, Tensor.addr, Tensor.addr_,
})
# The products that add a ``bias`` to the product, by the bias's place among the positional
# arguments: a parameter there (a dynamic convolution's learned bias, its kernel computed
# from the signal: F.conv2d(x, kernel, self.bias)) is added, no direct use either.
BIASED = {F.linear: 2, F.conv1d: 2, F.conv2d: 2, F.conv3d: 2, F.conv_transpose1d: 2,
          F.conv_transpose2d: 2, F.conv_transpose3d: 2, F.conv_tbc: 2, F.bilinear: 3}

# Calls whose output takes only a shape, dtype or device from their tensor arguments, none
# of their values: a buffer made so (x.new_zeros(d, d), torch.zeros_like(x)) is neither
# signal nor weight until something is written into it.
SHAPED_LIKE = frozenset({
    torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like, torch.rand_like,
    torch.randn_like, torch.randint_like, Tensor.new_zeros, Tensor.new_ones,
    Tensor.new_empty, Tensor.new_full,
})


class DirectUses(TorchFunctionMode):
    """Within ``with DirectUses(net, x):`` a forward of ``net`` on ``x``: ``found`` lists
    (module, parameter) — the innermost module running (``""``: the network's own forward)
    and the parameter's name in ``net.named_parameters()`` — for each product that
    multiplies the input's signal by a parameter outside every :data:`LAYERS` module;
    ``called`` names every module called (``""``: the network)."""

    def __init__(self, net: nn.Module, x: Tensor) -> None:
        super().__init__()
        self.found: list[tuple[str, str]] = []
        self.called: set[str] = set()
        self._parameters = {id(p): name for name, p in net.named_parameters()}
        self._data: set[int] = {id(x)}
        self._derived: dict[int, str] = {}  # id of a tensor computed from parameters alone
        self._alive: list[Tensor] = [x]  # keeps the ids above from being reused
        self._running: list[str] = []
        self._inside_layers = 0
        named = list(net.named_modules())
        self._handles = [h for name, m in named for h in (
            m.register_forward_pre_hook(functools.partial(self._started, name, m)),
            m.register_forward_hook(functools.partial(self._ended, m), always_call=True))]

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        super().__exit__(*exc)

    def _started(self, name: str, module: nn.Module, *_: Any) -> None:
        self._running.append(name)
        self.called.add(name)
        self._inside_layers += isinstance(module, LAYERS)

    def _ended(self, module: nn.Module, *_: Any) -> None:
        self._running.pop()
        self._inside_layers -= isinstance(module, LAYERS)

    def _weight(self, tensor: Tensor) -> str | None:
        return self._parameters.get(id(tensor)) or self._derived.get(id(tensor))

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if func in SHAPED_LIKE:
            return result
        tensors = _tensors(args, kwargs)
        data = any(id(t) in self._data for t in tensors)
        weight = next((w for t in tensors if (w := self._weight(t)) is not None), None)
        if func in PRODUCTS and not self._inside_layers:
            self._product(*_factors(func, args, kwargs))
        # buf[i] = v writes into buf, and returns None
        outputs = [args[0]] if func is Tensor.__setitem__ else [
            t for t in tree_flatten(result)[0] if isinstance(t, Tensor)]
        for out in outputs:
            if data:  # an in-place op's output may be a tensor computed from weights alone
                self._data.add(id(out))
                self._derived.pop(id(out), None)
            elif weight is not None and id(out) not in self._parameters:
                self._derived[id(out)] = weight
        if data or weight is not None:
            self._alive += outputs
        return result

    def _product(self, *factors: Tensor) -> None:
        """Record a product of ``factors`` that multiplies the signal by a parameter."""
        weight = next((w for t in factors if (w := self._weight(t)) is not None), None)
        if weight is not None and any(id(t) in self._data for t in factors):
            found = (self._running[-1] if self._running else "", weight)
            if found not in self.found:
                self.found.append(found)


def _tensors(args: tuple, kwargs: dict) -> list[Tensor]:
    return [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, Tensor)]


def _factors(func: Any, args: tuple, kwargs: dict) -> list[Tensor]:
    """The tensors a :data:`PRODUCTS` call ``func`` multiplies: all but the term it adds
    (an :data:`ADDED_TO` form's first argument or ``input=``, a :data:`BIASED` one's
    ``bias``)."""
    if func in ADDED_TO:
        return _tensors(args[1:], {k: v for k, v in kwargs.items()
                                   if k not in ("input", "self")})
    if (at := BIASED.get(func)) is not None:
        return _tensors(args[:at] + args[at + 1:],
                        {k: v for k, v in kwargs.items() if k != "bias"})
    return _tensors(args, kwargs)


def direct_use_refusal(rule: str, module: str, parameter: str, cls: str) -> str:
    """The one-line refusal of a per-layer rule for a parameter multiplied directly."""
    where = f"module {module!r} ({cls})" if module else f"the forward of {cls}"
    return (f"--method {rule} cannot replace the backward of parameter {parameter!r}: "
            f"{where} multiplies its signal by it directly (x @ W, F.linear, einsum, bmm…) "
            "rather than through an nn.Linear or nn.Conv2d, so the signal would go down "
            "through it exactly while the record names the rule; wrap it in nn.Linear "
            "(or nn.Conv2d), or train with bp")


__all__ = ["REPLACED", "UNSUPPORTED", "LAYERS", "PRODUCTS", "ADDED_TO", "BIASED",
           "SHAPED_LIKE", "DirectUses", "direct_use_refusal"]
