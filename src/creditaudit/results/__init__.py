"""What reports and figures both read: a results folder as runs, and how rules are named.

- :mod:`.runs` — :class:`RunIndex` (every record below a folder, grouped by recipe, with
  each run's protocol report and the frozen baseline of its recipe) and :class:`Run` (one
  record's numbers, missing ones as NaN);
- :mod:`.labels` — a rule's label and listing order.

It sits in the analysis layer, below both :mod:`creditaudit.report` and
:mod:`creditaudit.figures`, which are independent of each other.
"""

from __future__ import annotations

from creditaudit.results.labels import method_label, method_rank, sort_methods
from creditaudit.results.runs import (
    Predicate,
    Run,
    RunIndex,
    arch_label,
    as_float,
    deep_mean,
    mean_std,
)

__all__ = ["Run", "RunIndex", "Predicate", "arch_label", "as_float", "deep_mean", "mean_std",
           "method_label", "method_rank", "sort_methods"]
