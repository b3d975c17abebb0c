"""Direct Random Target Projection (Frenkel et al. 2021): a_l = B_lᵀ onehot(y)."""

from __future__ import annotations

from torch import Tensor

from creditaudit.methods.base import loss_precision, one_hot
from creditaudit.methods.dfa import DirectFeedbackRule
from creditaudit.methods.feedback import LocalFeedbackOptions
from creditaudit.methods.registry import register


@register
class DRTP(DirectFeedbackRule[LocalFeedbackOptions]):
    """DFA's projection with the output error replaced by the target: every state gets the
    one-hot label projected by its own fixed random C×d matrix.

    The credit needs no output and no error, so it is known before the forward pass ends
    (the point of DRTP: no update locking). ``feedback[l]`` is drawn exactly as DFA's for the
    same seed. Since B_l is symmetric in distribution, the sign is a convention; this one is
    Frenkel et al.'s δ_l = B_lᵀ y*. The blocks train on the local surrogate like DFA's; the
    readout on its exact cross-entropy.
    """

    name = "drtp"
    label = "DRTP"
    credit_formula = "a_l = B_l^T onehot(y)"
    color, marker = "#E8601C", "v"
    rank = 22
    stacked_step = "projected"

    def projected_signal(self, logits: Tensor, y: Tensor) -> Tensor:
        dtype = loss_precision(logits).dtype
        return one_hot(y.to(logits.device), self.n_classes, dtype)
