"""A network identified by what it is made of, where no source file of the user's says it.

A network built only from installed classes — an ``nn.Sequential`` of ``nn.Linear`` and
``nn.Tanh`` written in a script, a torchvision ResNet — has no code of the user's to
digest: the classes' code is named by the versions of their distributions. What tells two
such networks apart is how they are put together, so :func:`structure_digest` hashes the
module tree: each module's name and class (``torch.nn.modules.activation.Tanh``), its
settings (the plain public attributes its constructor keeps, ``in_features``, ``eps``,
``batch_first``, …, and its ``extra_repr``), and the name, shape and dtype of each
parameter and buffer — never their values, nor ``requires_grad`` (a rule freezes
parameters; the network stays the same), nor anything of the process (ids, addresses), so
the same network built in another process has the same digest. What a module keeps that is
no plain setting still tells networks apart where it changes what they compute: a callable
attribute (``TransformerEncoderLayer(activation=torch.tanh)`` against ``torch.sigmoid``) by
its module and qualified name (a lambda or a nested function, whose name is no identity,
also by its source, the names and constants its code reads and its closure's values), a
tensor attribute that is no parameter or buffer by its shape and dtype, and each forward
(pre-)hook registered on a module as a callable attribute is. A module with none of these
hashes as it did before they were counted. So does a network that holds no module,
parameter or buffer in two places; one that does (weight tying, ``net[4].weight =
net[0].weight``; one activation module placed twice) adds which names share one object
(:func:`sharing`), since tying other layers is another network of the same module tree.
:func:`parameter_dtype` names the dtype the parameters are held in.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import re
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

# Object addresses (`<function relu at 0x7f…>`) differ between processes: never hashed.
ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
# Attributes a module keeps that are no setting of the network: the train/eval mode.
NOT_SETTINGS = frozenset({"training"})
PLAIN = (bool, int, float, str, type(None))
# How deep lambdas and nested functions held in closures are hashed by their bodies (a
# function whose closure holds itself would recurse forever); deeper ones by name.
MAX_DEPTH = 4


def structure_digest(net: nn.Module, *, shared: bool = True) -> str:
    """sha256 (hex) of the module tree of ``net`` (module docstring): equal for two
    networks built the same way, whatever their weights, their ``requires_grad`` flags or
    the process; different when a module's class, a setting, or a parameter's or buffer's
    name, shape or dtype differs, or which names share one module, parameter or buffer
    (:func:`sharing`). ``shared=False``: the digest without the sharing, as it was before
    the sharing was counted (what a record of a tied network written then keeps)."""
    rows: Any = [_module_row(name, module) for name, module in net.named_modules()]
    # Added only where present, as a module's extras are: an untied network keeps its digest.
    if shared and (found := sharing(net)):
        rows = {"modules": rows, "shared": found}
    text = json.dumps(rows, sort_keys=True)
    return hashlib.sha256(ADDRESS.sub("", text).encode()).hexdigest()


def sharing(net: nn.Module) -> dict[str, list[list[str]]]:
    """What ``net`` holds in more than one place, by name: each module, parameter and
    buffer reached under several names (``{"parameters": [["0.weight", "4.weight"]]}``
    for ``net[4].weight = net[0].weight``; ``{"modules": [["1", "5"]]}`` for one
    ``nn.Tanh`` placed twice in an ``nn.Sequential``), the names of each object sorted and
    the groups sorted, so the same in any process; the kinds without any left out (``{}``
    for a network that shares nothing). ``named_modules`` lists such an object once, under
    its first name, so the module tree alone does not say where else it is used.

    Read from what the modules hold (``nn.Module``'s own walk and each module's
    ``_parameters`` and ``_buffers``, as ``named_parameters`` reads them), not through a
    network's overrides of ``named_parameters`` or ``named_buffers``, which may take no
    ``remove_duplicate`` (torch before 2.0's signature) or leave tensors out."""
    modules = list(nn.Module.named_modules(net, remove_duplicate=False))

    def held(kind: str) -> Iterator[tuple[str, Any]]:
        for prefix, module in modules:
            for name, value in getattr(module, kind).items():
                yield (f"{prefix}.{name}" if prefix else name), value

    found = {"modules": _groups(modules), "parameters": _groups(held("_parameters")),
             "buffers": _groups(held("_buffers"))}
    return {kind: groups for kind, groups in found.items() if groups}


def _groups(named: Any) -> list[list[str]]:
    """The names under which one object is reached, for each object reached under more
    than one (``named``: ``(name, object)`` pairs)."""
    names: dict[int, list[str]] = {}
    for name, value in named:
        if value is not None:
            names.setdefault(id(value), []).append(name)
    return sorted(sorted(group) for group in names.values() if len(group) > 1)


def parameter_dtype(net: nn.Module) -> str | None:
    """The dtype the parameters of ``net`` are held in (``float32``; ``bfloat16`` for a
    network cast with ``.to(torch.bfloat16)``); several in order of first appearance,
    joined with ``+`` (``bfloat16+float32``); None for a network without parameters."""
    dtypes = dict.fromkeys(_dtype_name(p.dtype) for p in net.parameters())
    return "+".join(dtypes) or None


def _module_row(name: str, module: nn.Module) -> dict[str, Any]:
    cls = type(module)
    public = {key: value for key, value in vars(module).items()
              if not key.startswith("_") and key not in NOT_SETTINGS}
    row = {"name": name, "class": f"{cls.__module__}.{cls.__qualname__}",
           "settings": {key: value for key, value in public.items() if _plain(value)},
           "extra_repr": module.extra_repr(),
           "parameters": _tensors(module.named_parameters(recurse=False)),
           "buffers": _tensors(module.named_buffers(recurse=False))}
    # Added only where present, so that a module without them keeps the digest it had
    # before they were counted (records written then still match runs made now).
    callables = {key: _callable_name(value) for key, value in public.items()
                 if callable(value) and not isinstance(value, nn.Module | torch.Tensor)}
    tensors = {key: [list(value.shape), _dtype_name(value.dtype)]
               for key, value in public.items() if isinstance(value, torch.Tensor)}
    hooks = {kind: [_callable_name(hook) for hook in getattr(module, kind).values()]
             for kind in ("_forward_hooks", "_forward_pre_hooks") if getattr(module, kind)}
    extras = {"callables": callables, "tensors": tensors, "hooks": hooks}
    row.update({key: value for key, value in extras.items() if value})
    return row


def _callable_name(value: Any, depth: int = 0) -> Any:
    """What a callable is, the same in any process: ``module.qualname`` of a function, a
    builtin or a class; a bound method's function's; a ``functools.partial``'s function
    with its plain arguments (others by their type); a callable object's class."""
    if isinstance(value, functools.partial):
        return {"partial": _callable_name(value.func, depth),
                "args": [_argument(arg, depth) for arg in value.args],
                "keywords": {key: _argument(arg, depth) for key, arg in value.keywords.items()}}
    if isinstance(value, types.MethodType):
        return _callable_name(value.__func__, depth)
    named = value if hasattr(value, "__qualname__") else type(value)
    owner = getattr(named, "__module__", None) or getattr(
        getattr(named, "__objclass__", None), "__module__", None)
    name = f"{owner}.{named.__qualname__}"
    if isinstance(value, types.FunctionType) and _unnamed(value) and depth < MAX_DEPTH:
        return {"function": name, **_function_body(value, depth + 1)}
    return name


def _unnamed(function: types.FunctionType) -> bool:
    """Whether the qualified name leaves the function open: a lambda (every one is
    ``<lambda>``) or a function defined inside another (``make.<locals>.act``, one name for
    every closure the outer function returns)."""
    return "<lambda>" in function.__qualname__ or "<locals>" in function.__qualname__


def _function_body(function: types.FunctionType, depth: int) -> dict[str, Any]:
    """What a lambda or nested function computes, the same in any process: its source text
    (where there is a file), the global and attribute names and the plain constants its code
    reads (two lambdas on one line differ there), and its closure's and defaults' values as
    ``functools.partial`` arguments are hashed."""
    code = function.__code__
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        source = None
    cells = [cell.cell_contents for cell in function.__closure__ or ()
             if _filled(cell)]
    return {"source": source, "names": list(code.co_names),
            "constants": [c for c in code.co_consts if _plain(c) and c is not None],
            "closure": [_argument(value, depth) for value in cells],
            "defaults": [_argument(value, depth) for value in function.__defaults__ or ()]}


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _argument(value: Any, depth: int = 0) -> Any:
    """A ``functools.partial`` argument as hashed: itself when plain, a callable by its
    name, anything else by its type (never its repr, which may hold an address)."""
    if _plain(value):
        return value
    return _callable_name(value, depth) if callable(value) else _callable_name(type(value))


def _tensors(named: Any) -> list[list[Any]]:
    return [[key, list(tensor.shape), _dtype_name(tensor.dtype)] for key, tensor in named
            if tensor is not None]


def _plain(value: Any) -> bool:
    """A setting JSON keeps as it is: a number, string, bool or None, or a tuple or list
    of them (``normalized_shape``, ``kernel_size``)."""
    if isinstance(value, tuple | list):
        return all(isinstance(v, PLAIN) for v in value)
    return isinstance(value, PLAIN)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


__all__ = ["structure_digest", "parameter_dtype", "sharing"]
