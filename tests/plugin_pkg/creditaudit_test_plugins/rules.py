"""Sparse DFA: Direct Feedback Alignment whose feedback matrices are sparse.

Each unit of each state receives the output error of only ``k`` of the C classes
(``method.connections``; k = 1 is the single-connection DFA of Crafton et al., 2019):
a_l = (M_l ⊙ B_l)ᵀ e, with B_l DFA's dense (C, d) matrix and M_l a fixed random 0/1 mask with
k ones per column, rescaled by √(C/k) so each credit has the dense rule's expected size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from creditaudit.config import opt
from creditaudit.methods.dfa import DFA
from creditaudit.methods.feedback import LocalFeedbackOptions


@dataclass
class SparseDFAOptions(LocalFeedbackOptions):
    connections: int = opt(1, "classes whose error reaches each state unit (k non-zero "
                           "entries per column of B_l; k ≥ C is dense DFA)", min=1)


class SparseDFA(DFA):
    """DFA with k non-zero feedback entries per state unit (module docstring).

    It declares no ``color``, ``marker`` or ``rank``: figures and listings must give it a
    style of its own, not DFA's.
    """

    name = "sparse-dfa"
    label = "Sparse DFA"
    credit_formula = "a_l = (M_l ⊙ B_l)^T e"
    Options = SparseDFAOptions
    id_version = 0

    def draw_feedback(self, generator: torch.Generator) -> list[Tensor]:
        dense = super().draw_feedback(generator)
        out = []
        for b in dense:
            classes = b.shape[0]
            k = min(self.config.connections, classes)
            # k distinct classes per column: the k smallest of C uniform draws.
            ranks = torch.rand(b.shape, generator=generator).argsort(dim=0).argsort(dim=0)
            out.append(b * (ranks < k) * (classes / k) ** 0.5)
        return out
