"""What a guest's method returned that a record cannot hold, in words.

A rule's ``run_metrics()`` returns fields for record.json; a value JSON cannot write (a
tensor, a numpy float32), or two keys JSON spells alike (``1`` and ``"1"``), would fail the
record's write at the end of a run, or lose a value. The run
(:func:`creditaudit.run.results.rule_metrics`) and the conformance suite that checks a
plugin rule before it trains both ask :func:`metrics_problem`.
"""

from __future__ import annotations

import json
from typing import Any

from torch import Tensor

from creditaudit.files import strict_json


def shown(value: Any) -> str:
    """How a refused value is named: its type, and its shape for a tensor."""
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def metrics_problem(values: Any) -> str | None:
    """Why ``values`` (what ``run_metrics()`` returned) cannot be a record's fields, or
    None: not a dict, a value JSON cannot write (non-finite floats are fine: the record
    marks them), or one object naming two keys JSON spells alike (one value would be
    lost, and reading the record back refuses it). Starts with ``run_metrics() returned``."""
    if not isinstance(values, dict):
        return (f"run_metrics() returned {shown(values)}, not a dict of its metrics (return "
                "{} for none)")
    try:
        json.dumps(strict_json.encode(values)[0], allow_nan=False)
    except (TypeError, ValueError) as err:
        return (f"run_metrics() returned a value a record cannot hold ({err}): return plain "
                "JSON values (str, int, float, bool, None, lists and dicts of them; e.g. "
                "float(x) of a tensor or numpy number)")
    clash = strict_json.keys_spelled_alike(values)
    if clash is not None:
        (first, second), spelled = clash
        return (f"run_metrics() returned the keys {first!r} and {second!r} in one object, "
                f"which JSON spells alike ({spelled!r}), so one value would be lost: name "
                "each value with a string of its own")
    return None
