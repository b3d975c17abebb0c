"""The per-layer values are medians over samples in the usual sense: with an even number
of samples, the mean of the two middle ones (``Tensor.median`` returns the lower one)."""

from __future__ import annotations

import statistics

import pytest
import torch
from torch import nn

from creditaudit import diagnose
from creditaudit.measures.gradients import median, median_norms, zero_gradient_stats


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 10, 1280])
def test_median_is_the_statistics_median(n):
    generator = torch.Generator().manual_seed(n)
    values = torch.rand(n, generator=generator, dtype=torch.float64) * 10
    values[: n // 2] = 0.0  # ties, as exactly-zero gradients make them
    assert median(values) == statistics.median(values.tolist())


def test_a_nan_leaves_no_median():
    assert torch.isnan(torch.tensor(median(torch.tensor([1.0, float("nan"), 2.0, 3.0]))))


def test_norms_and_zero_gradient_stats_use_the_middle_of_an_even_count():
    rows = torch.tensor([[1.0, 0.0], [3.0, 0.0]])  # per-sample norms 1 and 3
    assert median_norms([rows]) == [2.0]
    grads = torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [3.0, 0.0], [5.0, 0.0],
                          [7.0, 0.0]])
    assert zero_gradient_stats(grads) == (1 / 3, 4.0)


class _HalfSaturated(nn.Module):
    """Two samples through a ×200 head: sample 0 confidently right (its gradient exactly 0
    in fp32), sample 1 wrong."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.block = nn.Linear(2, 2), nn.Linear(2, 2)
        self.head = nn.Linear(2, 2, bias=False)
        with torch.no_grad():
            self.embed.weight.copy_(torch.eye(2))
            self.embed.bias.zero_()
            self.block.weight.zero_()
            self.block.bias.zero_()
            self.head.weight.copy_(torch.eye(2) * 200)

    def states(self, x):
        h0 = self.embed(x)
        h1 = h0 + self.block(h0)
        return [h0, h1], self.head(h1)

    def forward(self, x):
        return self.states(x)[1]


def test_half_the_gradients_zero_is_not_a_zero_median():
    """(b) fires on a median ‖g_L‖ below the floor: with one of two samples' gradients
    exactly zero the median is half the other's norm, and (b) passes."""
    model = _HalfSaturated()
    x, y = torch.tensor([[1.0, 0.0], [0.0, 3.0]]), torch.tensor([0, 0])
    report = diagnose(model, x, y, states_fn=model.states).to_dict()
    assert report["hidden_norms"] == [2.0, 2.0]
    b = report["diagnostics"]["b"]
    assert b["status"] == "passed" and b["value"] > 1.0
    assert "50% of samples have an exactly-zero gradient" in b["reason"]
