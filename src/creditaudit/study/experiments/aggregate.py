"""Multi-seed aggregation: mean, sample std and a seeded bootstrap CI.

Every number an experiment reports over seeds goes through :func:`aggregate`, so a table
cell always means the same thing: the mean over the finite values, the unbiased (ddof=1)
standard deviation, how many values there were, and a 95% percentile-bootstrap confidence
interval of the mean (2000 resamples drawn from ``numpy.random.default_rng(0)``, so the same
values always give the same interval).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from creditaudit.results import seed_std

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95


def _finite(values: Iterable[Any]) -> list[float]:
    """The values that are finite numbers (None, NaN and ±inf are left out)."""
    out = []
    for value in values:
        if value is None or isinstance(value, bool):
            continue
        value = float(value)
        if math.isfinite(value):
            out.append(value)
    return out


def bootstrap_ci(values: Sequence[float], *, resamples: int = BOOTSTRAP_RESAMPLES,
                 confidence: float = CONFIDENCE, seed: int = BOOTSTRAP_SEED
                 ) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of ``values`` (finite floats, n ≥ 1).

    Resamples with replacement from a ``numpy.random.default_rng(seed)`` generator; with
    n = 1 the interval is the value itself.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return math.nan, math.nan
    if x.size == 1:
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    tail = 100.0 * (1.0 - confidence) / 2.0
    low, high = np.percentile(means, [tail, 100.0 - tail])
    return float(low), float(high)


def aggregate(values: Iterable[Any]) -> dict[str, float | int]:
    """``{"mean", "std", "n", "ci_low", "ci_high"}`` of the finite values in ``values``.

    ``std`` is the sample standard deviation (ddof=1, :func:`creditaudit.results.seed_std`,
    as the report and figures show): NaN for n = 1. The CI is the 95%
    percentile bootstrap of the mean (:func:`bootstrap_ci`): the value itself for n = 1.
    None, NaN and ±inf (e.g. a diverged run's norm) are left out and not counted in ``n``;
    with no value left every statistic is NaN and n = 0.
    """
    x = _finite(values)
    n = len(x)
    if n == 0:
        return {"mean": math.nan, "std": math.nan, "n": 0, "ci_low": math.nan,
                "ci_high": math.nan}
    arr = np.asarray(x, dtype=np.float64)
    std = seed_std(arr) if n > 1 else math.nan
    low, high = bootstrap_ci(x)
    return {"mean": float(arr.mean()), "std": std, "n": n, "ci_low": low, "ci_high": high}


def format_aggregate(agg: dict[str, Any] | None, spec: str = ".3f") -> str:
    """``"0.615 ± 0.004 (n=3)"``; ``"—"`` when there is no value."""
    if not agg or not agg.get("n"):
        return "—"
    text = format(agg["mean"], spec)
    if agg["n"] > 1 and math.isfinite(agg["std"]):
        text += f" ± {format(agg['std'], spec.lstrip('+'))}"
    return text + f" (n={agg['n']})"


__all__ = ["aggregate", "bootstrap_ci", "format_aggregate"]
