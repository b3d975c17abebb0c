"""What reports and figures both read: a results folder as runs, and how rules are named.

- :mod:`.runs` — :class:`RunIndex` (every record below a folder, grouped by recipe, with
  each run's protocol report and the frozen baseline of its recipe), the facts of a record
  that are no record field (:func:`terminal_ln`, :func:`arch_label`, :func:`figure_recipe`)
  and :func:`as_float` (a value a record lacks as NaN, where a figure or table needs one);
- :mod:`.labels` — a rule's label and listing order.

It sits in the analysis layer, below both :mod:`creditaudit.report` and
:mod:`creditaudit.figures`, which are independent of each other.
"""

from __future__ import annotations

from creditaudit.results.labels import method_label, method_rank, sort_methods
from creditaudit.results.runs import (
    Predicate,
    RunIndex,
    arch_label,
    as_float,
    deep_mean,
    diverged_epoch_text,
    diverged_in_text,
    diverged_note,
    figure_recipe,
    full_length,
    mean_std,
    seed_std,
    seed_text,
    stopped_early_note,
    stopped_early_text,
    terminal_ln,
)

__all__ = ["RunIndex", "Predicate", "arch_label", "as_float", "deep_mean",
           "diverged_epoch_text", "diverged_in_text", "diverged_note", "figure_recipe",
           "full_length", "mean_std",
           "method_label", "method_rank", "seed_std", "seed_text", "sort_methods",
           "stopped_early_note", "stopped_early_text", "terminal_ln"]
