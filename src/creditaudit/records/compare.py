"""How two run records compare: equal computations (:func:`comparable`, the record without
its wall-clock fields) and the first recipe field where two runs differ
(:func:`recipe_difference`; a recipe is :func:`~creditaudit.records.recipes.recipe`)."""

from __future__ import annotations

from typing import Any

from creditaudit.config import config_from_dict, non_semantic
from creditaudit.records.recipes import recipe
from creditaudit.records.schema import RunRecord

# Recipe keys that hold a digest of content, or are absent from one side when at their
# default (a float32 network, nothing frozen): named, not printed.
CONTENT_KEYS = {"source": "the data", "code_digest": "the network's code",
                "frozen_parameters": "the parameters frozen outside the rule",
                "dtype": "the parameters' dtype"}
# Per-epoch fields that depend on wall-clock time, not on what was computed.
TIMING_KEYS = ("seconds",)


def recipe_difference(a: RunRecord, b: RunRecord) -> str | None:
    """The first recipe field where ``a`` and ``b`` differ (``"model.n_blocks: 3 vs 2"``),
    or None when they share a recipe."""
    ra = recipe(a.config, a.data.source if a.data else None, a.not_recorded,
                a.model_code_digest, a.model)
    rb = recipe(b.config, b.data.source if b.data else None, b.not_recorded,
                b.model_code_digest, b.model)
    for section, values in ra.items():
        only_b = {key: None for key in rb[section] if key not in values}
        for key, value in {**values, **only_b}.items():
            other = rb[section].get(key)
            if value != other:
                if key in CONTENT_KEYS:
                    return CONTENT_KEYS[key]
                return f"{section}.{key}: {value!r} vs {other!r}"
    return None


def comparable(record: RunRecord | dict[str, Any]) -> dict[str, Any]:
    """The record without wall-clock fields and without what it ran on (``environment``,
    the parts of a resumed run), as a dict: equal for equal computations (tests, resume).
    NaN values are replaced by the string "NaN" so equal records compare equal."""
    if isinstance(record, RunRecord):
        raw, skip = record.to_dict(), non_semantic(record.config)
    else:
        raw = dict(record)
        skip = non_semantic(config_from_dict(raw["config"], strict=False))
    out = {k: v for k, v in raw.items()
           if k not in ("environment", "resumed", "created", "updated", "timing")}
    out["config"] = {section: {k: v for k, v in values.items() if (section, k) not in skip}
                     for section, values in raw["config"].items()}
    out["log"] = [{k: v for k, v in e.items() if k not in TIMING_KEYS} for e in raw["log"]]
    return _nan_safe(out)


def _nan_safe(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, dict):
        return {k: _nan_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_safe(v) for v in value]
    return value
