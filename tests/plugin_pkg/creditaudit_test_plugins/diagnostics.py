"""Protocol diagnostic (e): the share of evaluation samples whose softmax is saturated.

A sample whose largest softmax probability is at least ``confidence`` has an output error
e = softmax − onehot of almost zero (or, when wrong, almost fixed): DFA-style credits and
the reference gradient g_L vanish on it. (e) fires when more than ``max_share`` of the
evaluation samples are saturated — cosines and ‖g_L‖ then describe the few samples still
learning, not the model. docs/extending.md shows this file from its imports down.
"""

from dataclasses import dataclass

import torch

from creditaudit.config import opt
from creditaudit.protocol import NOT_EVALUATED, ProtocolDiagnostic


@dataclass
class SaturationOptions:
    max_share: float = opt(0.5, "(e) fires when more than this share of evaluation samples "
                           "is saturated", min=0.0, max=1.0)
    confidence: float = opt(0.999, "(e) a sample is saturated when its top softmax "
                            "probability is at least this", min=0.0, max=1.0)


class SoftmaxSaturation(ProtocolDiagnostic[SaturationOptions]):
    name = "e"                    # its id: diagnostics.protocol lists it, [diagnostics.e]
    label = "softmax saturation"
    statistic = "share of evaluation samples with top softmax ≥ confidence"
    operator, threshold = ">", "max_share"   # fires when the statistic > options.max_share
    value_format = ".3f"
    hint = "most samples sit on a saturated softmax: their output error and g_L vanish"

    def evaluate(self, evidence):
        if evidence.logits is None:   # a record judged again from its stored numbers
            return self.result(None, NOT_EVALUATED, "needs the evaluation logits")
        top = torch.softmax(evidence.logits.double(), dim=1).amax(dim=1)
        if not bool(torch.isfinite(top).all()):
            return self.result(None, NOT_EVALUATED, "logits are NaN/Inf")
        confidence = self.options.confidence
        share = float((top >= confidence).double().mean())
        return self.judge(share, f"{share:.1%} of {top.numel()} samples have a top softmax "
                          f"probability ≥ {confidence:g}")
