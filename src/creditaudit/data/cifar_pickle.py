"""The safe unpickler for CIFAR batch files.

The official CIFAR batch files are pickles, and a plain unpickler runs whatever code a file
names. :class:`BatchUnpickler` admits only what the official files contain (dicts, lists,
bytes, strings, numbers and numpy arrays): a file naming anything else — a planted payload —
is refused with :class:`RefusedContent` before any of it runs. Reading the files, and what a
batch must hold, is :mod:`creditaudit.data.cifar`'s.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np


class RefusedContent(pickle.UnpicklingError):
    """A batch pickle names something no CIFAR batch holds (raised before it runs)."""


def _latin1(text: Any, encoding: Any = "utf-8") -> bytes:
    """``_codecs.encode`` as pickle protocols 0–2 use it from Python 3: a ``bytes`` object
    written as its latin-1 string. Nothing else is encoded."""
    if not isinstance(text, str) or encoding != "latin1":
        raise RefusedContent("refusing _codecs.encode of anything but a latin-1 "
                             "string: a CIFAR batch holds only bytes there")
    return text.encode("latin1")


def _array_from_buffer(buffer: Any, dtype: Any, shape: Any, order: Any) -> np.ndarray:
    """numpy's ``_frombuffer``, as pickle protocol 5 rebuilds an array: plain bytes read as a
    plain (no objects, no fields) dtype, a tuple shape and C or F order, nothing else."""
    if not (isinstance(buffer, bytes | bytearray | pickle.PickleBuffer) and _plain(dtype)
            and isinstance(shape, tuple) and all(type(n) is int for n in shape)
            and order in ("C", "F")):
        raise RefusedContent("refusing numpy _frombuffer of anything but bytes as "
                             "a plain dtype: a CIFAR batch holds only such arrays")
    return np.frombuffer(buffer, dtype=dtype).reshape(shape, order=order)


def _plain(dtype: Any) -> bool:
    """Whether ``dtype`` is a numpy dtype of plain numbers (no objects, no fields)."""
    return isinstance(dtype, np.dtype) and not dtype.hasobject and dtype.fields is None


def _number(dtype: Any, data: Any = None) -> Any:
    """numpy's ``scalar``, as pickle rebuilds a numpy number (``list(labels_array)``
    written by hand): one value of a plain dtype from its bytes, nothing else."""
    if not (_plain(dtype) and isinstance(data, bytes) and len(data) == dtype.itemsize):
        raise RefusedContent("refusing numpy scalar of anything but the bytes of one plain "
                             "number: a CIFAR batch holds only such numbers")
    return np.frombuffer(data, dtype=dtype)[0]


# The only globals a CIFAR batch pickle names: numpy's array reconstruction (the official
# files, protocol 2 from Python 2), its protocol-5 form, the latin-1 bytes of protocols
# 0–2 written from Python 3, and numpy numbers (labels written as a list of them). The last
# three resolve to the checked stand-ins above.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
}
_STAND_INS: dict[tuple[str, str], Any] = {
    ("_codecs", "encode"): _latin1,
    ("numpy.core.numeric", "_frombuffer"): _array_from_buffer,
    ("numpy._core.numeric", "_frombuffer"): _array_from_buffer,
    ("numpy.core.multiarray", "scalar"): _number,
    ("numpy._core.multiarray", "scalar"): _number,
}


class BatchUnpickler(pickle.Unpickler):
    """An unpickler that resolves only numpy's ndarray/dtype reconstruction (and checked
    stand-ins for the other globals a batch written by any pickle protocol names)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if (module, name) in _STAND_INS:
            return _STAND_INS[module, name]
        raise RefusedContent(f"refusing to load {module}.{name}: a CIFAR batch holds "
                             "only dicts, lists, bytes and numpy arrays")


__all__ = ["BatchUnpickler", "RefusedContent"]
