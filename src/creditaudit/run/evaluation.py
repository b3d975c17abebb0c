"""Test-split evaluation: mean cross-entropy and accuracy, without forwarding a sample twice.

The per-epoch diagnostics forward the evaluation subset (``diagnostics.eval_samples`` test
samples) anyway; their logits are handed to the evaluation as :class:`KnownPredictions`,
and only the rest of the test split is forwarded again (:class:`TestEvaluation` keeps that
rest apart, set up once per run). Sums stay on the device until the
end, so a GPU run synchronises once per evaluation, not twice per batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from creditaudit.data import Dataset
from creditaudit.methods.logits import checked_logits
from creditaudit.models.contract import measurement_mode

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


class TestEvaluation:
    """The test split, set up once per run for an evaluation every epoch.

    ``shared`` (n,) int64: test positions whose predictions each call brings along as
    :class:`KnownPredictions` (the diagnostics' evaluation subset); the rest of the split is
    copied apart once, so an epoch forwards only the rest and gathers nothing per batch.
    """

    def __init__(self, dataset: Dataset, *, flatten: bool, shared: Tensor | None = None
                 ) -> None:
        self.n_test = int(dataset.test_y.shape[0])
        self.shared = None if shared is None else shared.cpu()
        self.rest = dataset.test_loader(EVAL_BATCH, flatten=flatten, exclude=self.shared)

    @torch.no_grad()
    def run(self, model: torch.nn.Module, device: torch.device,
            known: KnownPredictions | None = None) -> tuple[float, float]:
        """(mean test CE in nats, test accuracy); ``known`` holds the shared samples'
        predictions (required when ``shared`` was given, and only then). Runs ``model`` in
        whatever mode it is in: the caller puts it in eval mode."""
        if (known is None) != (self.shared is None):
            raise ValueError("known predictions must cover exactly the shared samples")
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        correct = torch.zeros((), dtype=torch.int64, device=device)
        if known is not None:
            if not torch.equal(known.indices.cpu(), self.shared):
                raise ValueError("known predictions are for other test samples than the "
                                 "shared ones")
            loss_sum += known.losses.to(device).double().sum()
            correct += known.correct.to(device).sum()
        for x, y in self.rest:
            x, y = x.to(device), y.to(device)
            logits = checked_logits(model, model(x), y).float()
            loss_sum += F.cross_entropy(logits, y, reduction="sum").double()
            correct += (logits.argmax(dim=1) == y).sum()
        return float(loss_sum) / self.n_test, int(correct) / self.n_test


def evaluate(model: torch.nn.Module, dataset: Dataset, device: torch.device, *, flatten: bool,
             known: KnownPredictions | None = None) -> tuple[float, float]:
    """(mean test CE in nats, test accuracy) over the whole test split.

    Samples in ``known`` are counted from their given predictions instead of being
    forwarded again. ``model`` maps a batch of model-ready inputs to (B, C) logits; it runs
    in eval mode (BatchNorm on its running statistics, left unchanged) and gets its training
    flag back. For an evaluation every epoch, set up a :class:`TestEvaluation` once instead.
    """
    shared = None if known is None else known.indices
    with measurement_mode(model):
        return TestEvaluation(dataset, flatten=flatten, shared=shared).run(model, device,
                                                                           known)
