"""Explicit values equal to their effective default: the default's run, not a new one.

A run id covers the values that differ from their defaults (:func:`creditaudit.config.
semantic_dict`), so a value given explicitly that computes exactly what its default
computes — ``data.data_seed`` equal to the run seed, ``data.train_subset`` equal to every
training sample, ``diagnostics.protocol`` naming the default diagnostics in their order, an
empty ``model.none_args`` — would name the same computation twice. :func:`with_defaults`
puts the default back before the id is computed, so such a run has the default's id, its
record and its recipe (a frozen baseline of (d) is found either way).

Which values those are is asked of the component that reads them (its
``same_as_default``), and of the dataset for its size; what a guest answers is checked: it
may only name its own options, each with its declared default.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from creditaudit.config import RunConfig
from creditaudit.config.composed import protocol_names
from creditaudit.data import DatasetSpec
from creditaudit.errors import GuestError
from creditaudit.guests.blame import VALUE_ADVICE, blame
from creditaudit.methods import CreditRule
from creditaudit.methods.adapted import set_trainable
from creditaudit.models import Architecture
from creditaudit.registry import ARCHITECTURES, DATASETS, RULES, Registry


def with_defaults(config: RunConfig, rule: type[CreditRule], spec: DatasetSpec[Any],
                  arch: Architecture[Any]) -> RunConfig:
    """``config`` with every explicit value that computes what its default computes
    replaced by that default (``config`` itself when there is none). ``rule``, ``spec`` and
    ``arch``: the components ``config`` selects, ``spec`` and ``arch`` holding its
    ``[data]`` and ``[model]`` sections."""
    seed = config.run.seed
    with blame(DATASETS.guest(spec.name)):
        data = _checked(DATASETS, spec.name, spec.same_as_default(seed))
        sizes = spec.sizes()
    if sizes is not None and config.data.train_subset == sizes[0]:
        data["train_subset"] = None  # the first N of N samples: all of them
    with blame(ARCHITECTURES.guest(arch.name)):
        model = _checked(ARCHITECTURES, arch.name, arch.same_as_default())
    with blame(RULES.guest(rule.name)):
        method = _checked(RULES, rule.name, rule.same_as_default(config.method, seed))
    diagnostics = {}
    protocol = config.diagnostics.protocol
    if protocol is not None and list(protocol) == list(protocol_names(None)):
        diagnostics["protocol"] = None
    changes = {section: dataclasses.replace(getattr(config, section), **values)
               for section, values in (("data", data), ("model", model), ("method", method),
                                       ("diagnostics", diagnostics)) if values}
    return dataclasses.replace(config, **changes) if changes else config


def with_all_blocks_default(config: RunConfig, model: nn.Module, n_blocks: int | None
                            ) -> RunConfig:
    """``config`` with ``method.trainable_blocks`` equal to the model's ``n_blocks`` put
    back to None (all blocks, the default) when it trains what the default trains: the
    ordinary run, one id, standard in figures. ``model``: the run's model as built (on the
    meta device; its flags may change). Training the last L of L blocks only ever turns
    ``requires_grad`` on, so it is the default's run when under the default (None) every
    parameter trains; where the builder froze one (an adapted model's default leaves it
    frozen, L would unfreeze it if it lies between named states) the value is kept."""
    if n_blocks is None or config.method.trainable_blocks != n_blocks:
        return config
    set_trainable(model, None)
    if not all(p.requires_grad for p in model.parameters()):
        return config
    return dataclasses.replace(config, method=dataclasses.replace(config.method,
                                                                  trainable_blocks=None))


def explicit_defaults(given: RunConfig, planned: RunConfig) -> dict[str, Any]:
    """Each explicit value of ``given`` that its plan (``planned``, after
    :func:`with_defaults` and :func:`with_all_blocks_default`) put back to its default, by
    dotted key (``{"method.trainable_blocks": 2}``): what the user asked, to label the run
    with, where the plan's config holds the default."""
    asked, kept = given.to_dict(), planned.to_dict()
    return {f"{section}.{key}": value for section, values in asked.items()
            for key, value in values.items() if kept.get(section, {}).get(key) != value}


def why_default(key: str, value: Any) -> str:
    """Why the explicit ``value`` of dotted ``key`` is the default's run, in one clause
    (``trainable_blocks=2 trains every block: the default run``)."""
    name = key.rpartition(".")[2]
    if key == "method.trainable_blocks":
        return f"{name}={value} trains every block: the default run"
    return f"{name}={value!r} computes what its default computes: the default run"


def _checked(registry: Registry[Any], name: str, answer: Any) -> dict[str, Any]:
    """``answer`` of component ``name``'s ``same_as_default``, checked: a dict of its own
    options, each with its declared default (a guest that names another value would give
    two computations one run id)."""
    cls = registry.get(name)
    defaults = {f.name: f.default for f in dataclasses.fields(cls.Options)}
    if not isinstance(answer, dict) or any(
            key not in defaults or defaults[key] is dataclasses.MISSING
            or value != defaults[key] for key, value in answer.items()):
        raise GuestError(f"{registry.noun} {name!r}: same_as_default() returned {answer!r}, "
                         f"not its own options with their defaults; {VALUE_ADVICE}")
    return dict(answer)


__all__ = ["with_defaults", "with_all_blocks_default", "explicit_defaults", "why_default"]
