"""Test-split evaluation: mean cross-entropy and accuracy, without forwarding a sample twice.

The per-epoch diagnostics forward the evaluation subset (``diagnostics.eval_samples`` test
samples) anyway; their logits are handed to :func:`evaluate` as :class:`KnownPredictions`,
and only the rest of the test split is forwarded again. Sums stay on the device until the
end, so a GPU run synchronises once per evaluation, not twice per batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from creditaudit.data import Dataset

EVAL_BATCH = 1024


@dataclass(frozen=True)
class KnownPredictions:
    """Predictions already made, in the model's current state, for some test samples.

    ``indices`` (n,) int64: their positions in the test split; ``losses`` (n,): per-sample
    cross-entropy (nats); ``correct`` (n,) bool: whether the argmax was the label.
    """

    indices: Tensor
    losses: Tensor
    correct: Tensor

    @classmethod
    def from_logits(cls, indices: Tensor, logits: Tensor, labels: Tensor) -> KnownPredictions:
        """From (n, C) logits and (n,) labels of the test samples at ``indices``."""
        logits = logits.detach().float()
        return cls(indices=indices,
                   losses=F.cross_entropy(logits, labels, reduction="none"),
                   correct=logits.argmax(dim=1) == labels)


@torch.no_grad()
def evaluate(model: torch.nn.Module, dataset: Dataset, device: torch.device, *, flatten: bool,
             known: KnownPredictions | None = None) -> tuple[float, float]:
    """(mean test CE in nats, test accuracy) over the whole test split.

    Samples in ``known`` are counted from their given predictions instead of being
    forwarded again. ``model`` maps a batch of model-ready inputs to (B, C) logits.
    """
    n_test = int(dataset.test_y.shape[0])
    skip = torch.zeros(n_test, dtype=torch.bool)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    if known is not None:
        skip[known.indices.cpu()] = True
        loss_sum += known.losses.to(device).double().sum()
        correct += known.correct.to(device).sum()
    start = 0
    for x, y in dataset.loader("test", EVAL_BATCH, flatten=flatten):
        keep = ~skip[start:start + y.shape[0]]
        start += y.shape[0]
        if not bool(keep.any()):
            continue
        if not bool(keep.all()):
            x, y = x[keep], y[keep]
        x, y = x.to(device), y.to(device)
        logits = model(x).float()
        loss_sum += F.cross_entropy(logits, y, reduction="sum").double()
        correct += (logits.argmax(dim=1) == y).sum()
    return float(loss_sum) / n_test, int(correct) / n_test
