"""Protocol diagnostics named after a common key of ``[diagnostics]``
(tests/test_plugin_names.py): a diagnostic's options are the table ``[diagnostics.NAME]``,
so ``every`` and ``frozen_acc`` would be ``diagnostics.every`` (the recording interval) and
``diagnostics.frozen_acc``. Each is otherwise a well-behaved softmax-saturation (e).
"""

from dataclasses import dataclass

import torch

from creditaudit.config import opt
from creditaudit.protocol import NOT_EVALUATED, ProtocolDiagnostic


@dataclass
class SaturationOptions:
    max_share: float = opt(0.5, "fires when more than this share of evaluation samples is "
                           "saturated", min=0.0, max=1.0)


class _Saturation(ProtocolDiagnostic[SaturationOptions]):
    label = "softmax saturation"
    statistic = "share of evaluation samples with top softmax ≥ 0.999"
    operator, threshold = ">", "max_share"
    value_format = ".3f"
    hint = "most samples sit on a saturated softmax"

    def evaluate(self, evidence):
        if evidence.logits is None:
            return self.result(None, NOT_EVALUATED, "needs the evaluation logits")
        top = torch.softmax(evidence.logits.double(), dim=1).amax(dim=1)
        return self.judge(float((top >= 0.999).double().mean()), "share saturated")


class Every(_Saturation):
    name = "every"


class FrozenAcc(_Saturation):
    name = "frozen_acc"
