"""The options of the four built-in diagnostics: each instance's thresholds, the
``[diagnostics.a]`` … ``[diagnostics.d]`` tables of a config, each field checked in its range
when built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from creditaudit.config import opt
from creditaudit.measures.gradients import REFERENCE_FLOOR
from creditaudit.protocol.checks import check_threshold


def _check_ranges(options: Any, diagnostic: str) -> None:
    """Every field of a built-in's ``options`` in its range
    (:func:`~creditaudit.protocol.checks.check_threshold`), named by its config key
    ``diagnostics.<diagnostic>.<field>``."""
    for name in options.__dataclass_fields__:
        check_threshold(f"diagnostics.{diagnostic}.{name}", name, getattr(options, name))


@dataclass
class GrowthOptions:
    growth: float = opt(50.0, "(a) fires when one block grows the median ‖h‖ by more than "
                        "this factor (>= 1)")

    def __post_init__(self) -> None:
        _check_ranges(self, "a")


@dataclass
class ReferenceOptions:
    grad_floor: float = opt(REFERENCE_FLOOR, "(b) fires when the median ‖g_L‖ (1/128 scale) "
                            "is below this floor (> 0)")

    def __post_init__(self) -> None:
        _check_ranges(self, "b")


@dataclass
class StabilityOptions:
    stability: float = opt(0.30, "(c) fires when the mean pairwise cosine of batch-mean "
                           "gradients exceeds this (in [-1, 1))")
    stability_batches: int = opt(8, "(c) the fewest disjoint evaluation batches it accepts "
                                 "(>= 2)")
    stability_batch_size: int = opt(128, "(c) the size of those batches (the calibration "
                                    "used 128; >= 1)")

    def __post_init__(self) -> None:
        _check_ranges(self, "c")


@dataclass
class DepthOptions:
    margin_pp: float = opt(2.0, "(d) fires when headline − frozen-blocks accuracy is below "
                           "this margin (percentage points, in (-100, 100])")

    def __post_init__(self) -> None:
        _check_ranges(self, "d")


__all__ = ["GrowthOptions", "ReferenceOptions", "StabilityOptions", "DepthOptions"]
