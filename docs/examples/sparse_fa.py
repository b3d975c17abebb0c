"""A per-layer feedback rule written outside creditaudit: feedback alignment with sparse B.

``sparse-fa`` trains end to end like ``fa-linear`` — each Linear's and Conv2d's input
gradient uses a fixed random B of W's shape instead of W — but a fraction p of each B's
entries (``method.sparsity``) is zero; the others are scaled by 1/√(1 − p), so B keeps
fa-linear's RMS. docs/extending.md walks through it; install it as a plugin with one entry
point:

    [project.entry-points."creditaudit.rules"]
    sparse-fa = "sparse_fa:SparseFA"
"""

from dataclasses import dataclass

import torch

from creditaudit.config import opt
from creditaudit.methods.base import FeedbackOptions
from creditaudit.methods.feedback import FixedFeedbackRule
from creditaudit.methods.linear_feedback import (
    LinearFeedbackRule,
    draw_layer_feedback,
    weight_shapes,
)


@dataclass
class SparseFAOptions(FeedbackOptions):        # + method.feedback_scale, feedback_seed
    sparsity: float = opt(0.5, "fraction of each B's entries set to zero", min=0.0, max=0.99)


class SparseFA(FixedFeedbackRule[SparseFAOptions], LinearFeedbackRule[SparseFAOptions]):
    name = "sparse-fa"
    label = "Sparse FA"
    credit_formula = "backprop with each layer's W^T replaced by a fixed sparse random B"

    def feedback_shapes(self):                 # B per layer, W's shape
        return weight_shapes(self.layers)

    def draw_feedback(self, generator):        # at binding, and for the fresh-feedback null
        p = self.options.sparsity
        out = []
        for b in draw_layer_feedback(self.layers, scale=self.options.feedback_scale,
                                     generator=generator):
            zeroed = torch.randperm(b.numel(), generator=generator)[:round(p * b.numel())]
            b.view(-1)[zeroed] = 0.0           # a fixed fraction p of the entries
            out.append(b / (1.0 - p) ** 0.5)   # the RMS of fa-linear's B
        return out

    def feedback_matrices(self):               # what the backward pass and the angles use
        return self.feedback
