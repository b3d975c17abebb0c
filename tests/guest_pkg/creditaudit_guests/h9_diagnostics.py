"""A protocol diagnostic written for the older interface (tests/test_diagnostic_instances.py):
(e) of tests/plugin_pkg, softmax saturation, as plugins spelled it before diagnostics were
instances holding their options — ``evaluate`` a classmethod taking the options second and
calling the base's helpers through the class (``cls.judge(value, options, reason)``). It
must judge exactly as its new-style twin, through the protocol, the door and a run.
"""

from dataclasses import dataclass

import torch

from creditaudit.config import opt
from creditaudit.protocol import NOT_EVALUATED, ProtocolDiagnostic


@dataclass
class SaturationOptions:
    max_share: float = opt(0.5, "fires when more than this share of evaluation samples is "
                           "saturated", min=0.0, max=1.0)
    confidence: float = opt(0.999, "a sample is saturated when its top softmax probability "
                            "is at least this", min=0.0, max=1.0)


class OlderSoftmaxSaturation(ProtocolDiagnostic):
    name = "h9_older_e"
    label = "softmax saturation"
    statistic = "share of evaluation samples with top softmax ≥ confidence"
    operator, threshold = ">", "max_share"
    value_format = ".3f"
    hint = "most samples sit on a saturated softmax: their output error and g_L vanish"
    Options = SaturationOptions

    @classmethod
    def evaluate(cls, evidence, options):
        if evidence.logits is None:
            return cls.result(None, options, NOT_EVALUATED, "needs the evaluation logits")
        top = torch.softmax(evidence.logits.double(), dim=1).amax(dim=1)
        if not bool(torch.isfinite(top).all()):
            return cls.result(None, options, NOT_EVALUATED, "logits are NaN/Inf")
        share = float((top >= options.confidence).double().mean())
        return cls.judge(share, options, f"{share:.1%} of {top.numel()} samples have a top "
                         f"softmax probability ≥ {options.confidence:g}")
