"""Guests that pass the door and misbehave at a run's sizes
(tests/test_guest_base_exceptions.py, tests/test_diagnostic_evidence.py,
tests/test_guest_writes_data.py).

- ``late-step-aborts``: backprop whose training step raises ``Abort``, a ``BaseException``
  subclass that is neither an interrupt nor a ``sys.exit``, on batches larger than the
  suite's;
- ``late_evidence_eater``: a diagnostic that conforms on the suite's evidence (5 states),
  but on a run's own evidence of another depth zeroes, in place, the norms and
  gradient summaries it is handed (what the record stores and the cosines are computed
  from) before it passes.
"""

import math
from dataclasses import dataclass

from creditaudit.config import opt
from creditaudit.methods.bp import BP
from creditaudit.models import ResidualMLP
from creditaudit.models.registry import ResMLPArchitecture
from creditaudit.protocol import NOT_EVALUATED, ProtocolDiagnostic


class Abort(BaseException):
    """Not an Exception: ``except Exception`` lets it through."""


class StepAborts(BP):
    name = "late-step-aborts"
    label = "Step aborts"

    def train_step(self, x, y, optimizer):
        if x.shape[0] > 16:
            raise Abort("the step gave up")
        return super().train_step(x, y, optimizer)


@dataclass
class LimitOptions:
    limit: float = opt(1.0, "fires above this", min=0.0)


class LargestNorm(ProtocolDiagnostic[LimitOptions]):
    """Fires when the largest state norm passes ``limit``; what each guest below does
    besides is in ``besides(evidence, value)``."""

    statistic = "the largest state norm"
    operator, threshold = ">", "limit"
    hint = "never"

    def evaluate(self, evidence):
        norms = evidence.hidden_norms
        if not norms or not all(math.isfinite(n) for n in norms):
            return self.result(None, NOT_EVALUATED, "no finite state norms")
        return self.besides(evidence, max(norms))


class EvidenceEater(LargestNorm):
    name, label = "late_evidence_eater", "Evidence eater"

    def besides(self, evidence, value):
        norms = evidence.hidden_norms
        if len(norms) != 5:  # a run's evidence, not the suite's
            norms[:] = [0.0] * len(norms)
            evidence.grad_norms[:] = [0.0] * len(evidence.grad_norms)
            for grads in evidence.grads or []:
                grads.zero_()
        return self.judge(value, f"largest norm {value:.3g}")


class NumpyDetails(LargestNorm):
    """``late_numpy_details``: plain JSON details on the suite's evidence (5 states), numpy
    ones (a ``numpy.bool_``, an array) on a run's own."""

    name, label = "late_numpy_details", "Numpy details"

    def besides(self, evidence, value):
        import numpy as np

        norms = evidence.hidden_norms
        if len(norms) == 5:
            return self.judge(value, f"largest norm {value:.3g}")
        return self.judge(value, f"largest norm {value:.3g}", grew=np.bool_(value > 1.0),
                          norms=np.asarray(norms))


class HalvingMLP(ResidualMLP):
    """Halves its input in place, in eval mode, on batches larger than the suite's."""

    def forward_states(self, x):
        if not self.training and x.shape[0] > 16:
            x.mul_(0.5)
        return super().forward_states(x)


class HalvesItsInput(ResMLPArchitecture):
    """``late-halves-its-input``: a ResidualMLP whose forward halves its input in place, on
    evaluation batches larger than the suite's: each evaluation of an unshuffled split
    changes the split itself."""

    name, label, rank = "late-halves-its-input", "Halves its input", 100

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        return HalvingMLP(ResMLPArchitecture.flat_dim(input_shape), options.d, n_classes,
                          options.n_blocks, out_ln=options.out_ln, residual=options.residual,
                          w2_std=options.w2_std)
