"""The cross-entropy every rule trains on, at the logits: the precision it is computed in
(:func:`loss_precision`) and its per-sample gradient there, the output error
e = softmax − onehot (:func:`output_error`, from :func:`one_hot` rows) that feedback
credits start from. Importable from :mod:`creditaudit.methods.base` too."""

from __future__ import annotations

import torch
from torch import Tensor


def loss_precision(logits: Tensor) -> Tensor:
    """Logits in at least fp32 (bf16 autocast outputs are upcast; float64 stays float64)."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def one_hot(y: Tensor, n_classes: int, dtype: torch.dtype) -> Tensor:
    """(B, C) one-hot rows of the (B,) int64 labels ``y``, in ``dtype`` on ``y``'s device.

    ``F.one_hot`` reads the labels' range back to the host to check it, a device sync in
    every step on a GPU; labels are checked where data are loaded, and an out-of-range one
    still fails here (scatter's index check) and in the step's cross-entropy.
    """
    rows = torch.zeros((y.shape[0], n_classes), dtype=dtype, device=y.device)
    return rows.scatter_(1, y.unsqueeze(1), 1.0)


def output_error(logits: Tensor, y: Tensor) -> Tensor:
    """e = softmax(logits) − onehot(y): (B, C), the per-sample gradient of CE at the logits."""
    logits = loss_precision(logits.detach())
    return torch.softmax(logits, dim=1) - one_hot(y, logits.shape[1], logits.dtype)


__all__ = ["loss_precision", "one_hot", "output_error"]
