"""Audit your own architecture with the four-diagnostic protocol, and measure a credit.

The model below is a plain ``nn.Module`` — it does not subclass creditaudit's ResidualNet.
The protocol needs a *states function*: ``states_fn(x) -> ([h_0, …, h_L], logits)``
returning the hidden states you want audited, still in the autograd graph. The
credit-quality metrics (ρ, nudging) also need ``forward_from(layer, h) -> logits``, the
network run on from a state, and a credit to measure: here Direct Feedback Alignment's,
a_l = B_l e with fixed random B_l and the output error e.

Run: python docs/examples/audit_own_model.py   (under a minute on two CPU cores)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit import diagnose
from creditaudit.data import make_teacher_student
from creditaudit.report import render


class MyResNet(nn.Module):
    """A pre-LN residual MLP written the usual way: forward() returns logits only."""

    def __init__(self, in_dim: int, d: int, n_classes: int, depth: int) -> None:
        super().__init__()
        self.stem = nn.Linear(in_dim, d)
        self.branches = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.GELU(), nn.Linear(d, d))
            for _ in range(depth))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, n_classes)

    def states(self, x: Tensor) -> tuple[list[Tensor], Tensor]:
        """([h_0 … h_L], logits): the residual stream before and after every block."""
        h = self.stem(x)
        states = [h]
        for branch in self.branches:
            h = h + branch(h)
            states.append(h)
        return states, self.head(self.norm(h))

    def run_from(self, layer: int, h: Tensor) -> Tensor:
        """Logits from state h_layer: the remaining blocks, then the head."""
        for branch in self.branches[layer:]:
            h = h + branch(h)
        return self.head(self.norm(h))

    def forward(self, x: Tensor) -> Tensor:
        return self.states(x)[1]


def dfa_credit(model: MyResNet, n_classes: int, seed: int = 0):
    """A credit function (x, y) -> [a_0, …, a_L]: DFA's a_l = B_l^T e, with e = softmax −
    one-hot and a fixed random B_l (C × d) per state."""
    generator = torch.Generator().manual_seed(seed)
    d = model.head.in_features
    feedback = [torch.randn(n_classes, d, generator=generator) / n_classes ** 0.5
                for _ in range(len(model.branches) + 1)]

    def credit(x: Tensor, y: Tensor) -> list[Tensor]:
        with torch.no_grad():
            error = F.softmax(model(x), dim=1) - F.one_hot(y, n_classes).float()
        return [error @ b for b in feedback]

    return credit


def trained_model() -> tuple[MyResNet, Tensor, Tensor, float]:
    """(model, eval_x, eval_y, accuracy): MyResNet d=128 L=4 after 200 backprop steps on the
    synthetic teacher–student task, a held-out evaluation set of 1280 samples (10 batches of
    128: diagnostic (c) needs >= 8) and the test accuracy (fraction)."""
    torch.manual_seed(0)
    train_x, train_y, test_x, test_y = make_teacher_student(
        n_train=8192, n_test=2048, in_dim=64, alpha=1.0, seed=0)
    model = MyResNet(64, 128, 10, depth=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(200):  # a few hundred steps of ordinary backprop
        batch = torch.randint(0, train_x.shape[0], (128,))
        optimizer.zero_grad()
        F.cross_entropy(model(train_x[batch]), train_y[batch]).backward()
        optimizer.step()

    with torch.no_grad():
        accuracy = (model(test_x).argmax(dim=1) == test_y).sum().item() / len(test_y)
    return model, test_x[:1280], test_y[:1280], accuracy


def main() -> None:
    model, eval_x, eval_y, accuracy = trained_model()
    report = diagnose(model, eval_x, eval_y, states_fn=model.states, headline_acc=accuracy,
                      frozen_acc=None,  # pass your frozen-blocks baseline to evaluate (d)
                      metadata={"method": "bp", "arch": "MyResNet d=128 L=4",
                                "dataset": "synthetic", "seeds": "0"})
    print(render(report, "text"))
    print()
    print(render(report, "md"))
    assert report.verdict in ("trustworthy", "incomplete", "needs walk-back")

    # The credit-quality metrics of a DFA credit on this network: bound methods of the
    # model let them run on a float64 copy of it.
    report = diagnose(model, eval_x, eval_y, states_fn=model.states,
                      forward_from=model.run_from, credit=dfa_credit(model, 10),
                      headline_acc=accuracy, metrics=True,
                      metadata={"method": "dfa (random B)"})
    print()
    print(render(report, "text"))


if __name__ == "__main__":
    main()
