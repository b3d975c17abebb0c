"""p57 guests (tests/test_guest_base_exceptions.py, tests/test_diagnostic_evidence.py).

- ``p57-step-aborts``: backprop whose training step raises ``Abort``, a ``BaseException``
  subclass that is neither an interrupt nor a ``sys.exit``, on batches larger than the
  suite's;
- ``p57_evidence_eater``: a diagnostic that conforms on the suite's evidence (5 states),
  but on a run's own evidence of another depth zeroes, in place, the norms and
  gradient summaries it is handed (what the record stores and the cosines are computed
  from) before it passes.
"""

import math
from dataclasses import dataclass

from creditaudit.config import opt
from creditaudit.methods.bp import BP
from creditaudit.protocol import NOT_EVALUATED, ProtocolDiagnostic


class Abort(BaseException):
    """Not an Exception: ``except Exception`` lets it through."""


class StepAborts(BP):
    name = "p57-step-aborts"
    label = "Step aborts"

    def train_step(self, x, y, optimizer):
        if x.shape[0] > 16:
            raise Abort("the step gave up")
        return super().train_step(x, y, optimizer)


@dataclass
class LimitOptions:
    limit: float = opt(1.0, "fires above this", min=0.0)


class EvidenceEater(ProtocolDiagnostic[LimitOptions]):
    name, label = "p57_evidence_eater", "Evidence eater"
    statistic = "the largest state norm"
    operator, threshold = ">", "limit"
    hint = "never"

    def evaluate(self, evidence):
        norms = evidence.hidden_norms
        if not norms or not all(math.isfinite(n) for n in norms):
            return self.result(None, NOT_EVALUATED, "no finite state norms")
        value = max(norms)
        if len(norms) != 5:  # a run's evidence, not the suite's
            norms[:] = [0.0] * len(norms)
            evidence.grad_norms[:] = [0.0] * len(evidence.grad_norms)
            for grads in evidence.grads or []:
                grads.zero_()
        return self.judge(value, f"largest norm {value:.3g}")
