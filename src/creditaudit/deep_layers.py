"""The deep layers' mean: one convention for the measures, the records and the figures.

A per-layer list holds one value per state h_0 … h_L. Layer 0 (the embedding, which every
rule trains with the true gradient or not at all) is left out of the headline, so the
*deep mean* is the mean over layers l ≥ 1. A layer whose value is undefined (NaN: a
cosine with a zero vector, a ρ with no valid sample), unbounded (±inf) or absent (None)
is left out; with none left the deep mean is NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def deep_mean(values: Sequence[float | int | None] | None) -> float:
    """Mean over layers l ≥ 1 of the finite values (NaN when there is none).

    ``values``: one number per state h_0 … h_L (None for a layer not measured). Sums in
    Python order, so the result is the same to the last bit wherever it is computed.
    """
    if not values or len(values) < 2:
        return math.nan
    kept = [float(v) for v in values[1:]
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)]
    return sum(kept) / len(kept) if kept else math.nan


__all__ = ["deep_mean"]
