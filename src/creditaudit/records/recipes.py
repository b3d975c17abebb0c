"""The recipe of a run: how its network was trained apart from the credit rule and the seed.

Runs with equal recipes are compared with each other (a frozen-blocks run of the same
recipe is the baseline of diagnostic (d)); :attr:`RunRecord.recipe_key
<creditaudit.records.schema.RunRecord.recipe_key>` reads it of a record, and
:mod:`creditaudit.records.compare` says how two recipes differ.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from creditaudit.config import RunConfig, non_semantic
from creditaudit.descriptions import ModelDescription

# What a config key a run did not record holds in recipes and reports.
NOT_RECORDED = "not recorded"


def recipe(config: RunConfig, source: str | None = None, not_recorded: Sequence[str] = (),
           code: str | None = None, model: ModelDescription | None = None
           ) -> dict[str, dict[str, Any]]:
    """The recipe of a run: data (minus its folder), model, optimiser and precision;
    ``source`` identifies the data's content (seed aside) when known; keys the run did not
    record (``not_recorded``, dotted) are :data:`NOT_RECORDED`, equal to no value; ``code``,
    the digest of the network's code when it is not creditaudit's (a ``module`` factory, a
    plugin architecture, the network of a ``Recorder`` run), is the model's ``code_digest``:
    a config names a class, not what its code does. Without it (built-ins, records that
    predate it) the recipe is what it always was. ``model``, the record's description of
    the network, adds its :meth:`~ModelDescription.recipe_facts` (a parameters' dtype
    other than float32, parameters frozen outside the rule)."""
    raw = config.to_dict()
    for key in not_recorded:
        section, _, name = key.partition(".")
        if name in raw.get(section, {}):
            raw[section][name] = NOT_RECORDED
    skip = non_semantic(config)
    data = {k: v for k, v in raw["data"].items() if ("data", k) not in skip}
    if source:
        data["source"] = source
    model_section = raw["model"]
    if code:
        model_section["code_digest"] = code
    if model is not None:
        model_section.update(model.recipe_facts())
    return {"data": data, "model": model_section, "optim": raw["optim"],
            "run": {"precision": raw["run"]["precision"]}}


def recipe_key(config: RunConfig, source: str | None = None,
               not_recorded: Sequence[str] = (), code: str | None = None,
               model: ModelDescription | None = None) -> str:
    """Equal for runs that share how the network was trained apart from the credit rule and
    the seed: the data (its identity, not its folder), the model (and its code, when not
    creditaudit's; its dtype and the parameters frozen outside the rule, when the
    description ``model`` says so), the optimiser and the precision (see :func:`recipe`)."""
    return json.dumps(recipe(config, source, not_recorded, code, model), sort_keys=True)
