"""Protocol diagnostics that fail at creditaudit's door, or break at run time
(tests/test_door*.py).

- ``door_nan``: its statistic is NaN on any evidence — neither a number nor an explicit
  "not evaluated";
- ``door_raises``: conforms on the suite's evidence (5 states) but ``evaluate()`` raises on
  a run's own evidence of another depth.
"""

import math
from dataclasses import dataclass

from creditaudit.config import opt
from creditaudit.protocol import NOT_EVALUATED, ProtocolDiagnostic


@dataclass
class LimitOptions:
    limit: float = opt(1.0, "fires above this", min=0.0)


class NaNStatistic(ProtocolDiagnostic):
    name, label = "door_nan", "NaN statistic"
    statistic = "nothing"
    operator, threshold = ">", "limit"
    hint = "never"
    Options = LimitOptions

    @classmethod
    def evaluate(cls, evidence, options):
        return cls.judge(float("nan"), options, "computed nothing")


class Raises(ProtocolDiagnostic):
    name, label = "door_raises", "Raises"
    statistic = "the largest state norm"
    operator, threshold = ">", "limit"
    hint = "never"
    Options = LimitOptions

    @classmethod
    def evaluate(cls, evidence, options):
        norms = evidence.hidden_norms
        if not norms or not all(math.isfinite(n) for n in norms):
            return cls.result(None, options, NOT_EVALUATED, "no finite state norms")
        if len(norms) != 5:  # the suite's evidence has 5 states; a tiny run has fewer
            raise ZeroDivisionError("the network is not as deep as it expected")
        return cls.judge(max(norms), options, f"largest norm {max(norms):.3g}")
