"""Protocol diagnostics whose statistic is no finite number but whose result says "passed":
NaN, +Inf, None, and a string. Each must be recorded "not evaluated" with the reason, never
passed (and never turn a verdict trustworthy)."""

from dataclasses import dataclass

from creditaudit.config import opt
from creditaudit.protocol import PASSED, ProtocolDiagnostic


@dataclass
class LimitOptions:
    limit: float = opt(1.0, "fires when the statistic exceeds this")


class _ClaimsAPass(ProtocolDiagnostic):
    label = "a statistic that is no number"
    statistic = "whatever it returns"
    operator, threshold = ">", "limit"
    hint = "never fires"
    Options = LimitOptions
    value = None

    @classmethod
    def evaluate(cls, evidence, options):
        return cls.result(cls.value, options, PASSED, "all good")


class NaNStatistic(_ClaimsAPass):
    name = "data_nan"
    value = float("nan")


class InfStatistic(_ClaimsAPass):
    name = "data_inf"
    value = float("inf")


class NoneStatistic(_ClaimsAPass):
    name = "data_none"
    value = None


class TextStatistic(_ClaimsAPass):
    name = "data_text"
    value = "0.1"
