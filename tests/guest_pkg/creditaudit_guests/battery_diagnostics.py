"""Protocol diagnostics for the outside battery (tests/test_outside_battery.py): evaluate()
returns no result, a result of another status, raises always, exits, or prints.
"""

import sys
from dataclasses import dataclass

from creditaudit.config import opt
from creditaudit.protocol import ProtocolDiagnostic


@dataclass
class LimitOptions:
    limit: float = opt(1.0, "fires above this", min=0.0)


class _Base(ProtocolDiagnostic):
    statistic = "the largest state norm"
    operator, threshold = ">", "limit"
    hint = "never"
    Options = LimitOptions


class ReturnsNone(_Base):
    name, label = "battery_returns_none", "Returns None"

    @classmethod
    def evaluate(cls, evidence, options):
        return None


class OddStatus(_Base):
    name, label = "battery_odd_status", "Odd status"

    @classmethod
    def evaluate(cls, evidence, options):
        return cls.result(0.5, options, "great", "all great")


class AlwaysRaises(_Base):
    name, label = "battery_always_raises", "Always raises"

    @classmethod
    def evaluate(cls, evidence, options):
        raise LookupError("no threshold table")


class Exits(_Base):
    name, label = "battery_exits", "Exits"

    @classmethod
    def evaluate(cls, evidence, options):
        sys.exit(5)


class Talkative(_Base):
    """Well behaved (the largest finite state norm against its limit), but prints."""

    name, label = "battery_talkative", "Talkative"

    @classmethod
    def evaluate(cls, evidence, options):
        print("evaluating talkatively")
        norms = [n for n in evidence.hidden_norms or [] if n == n and n != float("inf")]
        if not norms:
            return cls.result(None, options, "not evaluated", "no finite state norms")
        return cls.judge(max(norms), options, f"largest norm {max(norms):.3g}")


class ListValue(_Base):
    name, label = "battery_list_value", "List value"

    @classmethod
    def evaluate(cls, evidence, options):
        return cls.result([0.1, 0.2], options, "passed", "two numbers")
