"""Building a model on PyTorch's meta device: its shapes and description, no memory, no draws.

Run plans and reports size a model this way before (or instead of) building it for real. A
meta tensor holds no values, so the initialisers' in-place value fills are skipped there:
PyTorch computes the meta versions of ``normal_``, ``trunc_normal_``'s ``erfinv_`` and
``clamp_``, and a few other fills, through Python references that import its compiler on first
use (about 1.2 s in every process that plans a run; measured with
``python -c "import torch; torch.empty(3, device='meta').normal_()"``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

# In-place ops that only write values (never shape, dtype or autograd metadata) and whose meta
# versions import torch._dynamo, and the initialisers that call them. A mode sees only the
# outermost call (inside it, the initialiser's own ``tensor.normal_`` runs with no mode), so
# the initialisers are listed by name too.
_VALUE_FILLS: frozenset[Callable[..., Any]] = frozenset({
    Tensor.normal_, Tensor.erfinv_, Tensor.clamp_, Tensor.clamp_min_, Tensor.clamp_max_,
    Tensor.log_normal_, Tensor.exponential_, Tensor.cauchy_, Tensor.geometric_,
    nn.init.normal_, nn.init.trunc_normal_, nn.init.xavier_normal_, nn.init.kaiming_normal_,
    nn.init.sparse_,
})


# Random factories, and their meta tensors' equivalent without values.
_RANDOM_FACTORIES: dict[Callable[..., Any], Callable[..., Tensor]] = {
    torch.randn: torch.empty, torch.rand: torch.empty,
    torch.randn_like: torch.empty_like, torch.rand_like: torch.empty_like,
}


class _NoValueFillsOnMeta(TorchFunctionMode):
    """Returns a meta tensor unchanged from the value fills above, and an empty one from a
    random factory (a meta tensor has no values)."""

    def __torch_function__(self, func: Callable[..., Any], types: Any,
                           args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
                           ) -> Any:
        kwargs = kwargs or {}
        if func in _VALUE_FILLS:
            # nn.init passes its tensor by keyword to the mode, Tensor methods by position
            target = args[0] if args else kwargs.get("tensor")
            if isinstance(target, Tensor) and target.is_meta:
                return target
        empty = _RANDOM_FACTORIES.get(func)
        if empty is not None and kwargs.get("device") in (None, "meta") and "out" not in kwargs:
            # no device given: the meta device of the enclosing block applies
            return empty(*args, **{k: v for k, v in kwargs.items() if k != "generator"})
        return func(*args, **kwargs)


@contextlib.contextmanager
def on_meta_device() -> Iterator[None]:
    """Inside the block, modules and tensors are created on the meta device, no random stream
    of this process advances (the RNG is forked), value fills of meta tensors are skipped and
    random factories give empty meta tensors."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"), _NoValueFillsOnMeta():
        yield


__all__ = ["on_meta_device"]
