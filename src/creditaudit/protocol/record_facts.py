"""What a run record is, asked of the things that know: whether it is a frozen baseline of
(d) (its rule), the model it trained (the model's own description, rebuilt on the meta
device for records before schema 3), its architecture variant, whether its rule draws its
feedback from the run seed, and the report metadata of the run. The verdicts over records
are in :mod:`creditaudit.protocol.records`, which re-exports these."""

from __future__ import annotations

import json
from typing import Any

from creditaudit.descriptions import ModelDescription
from creditaudit.errors import CreditAuditError
from creditaudit.models import build_model
from creditaudit.models.meta import on_meta_device
from creditaudit.records import RunRecord
from creditaudit.records.recipes import NOT_RECORDED
from creditaudit.registry import ARCHITECTURES, DATASETS, RULES


def is_frozen_baseline(record: RunRecord) -> bool:
    """A run of a baseline rule (the frozen blocks) without penalty on real labels: the
    baseline of (d). Asked of the rule (``CreditRule.baseline``), not its name."""
    rule = RULES.find(record.method)
    return (rule is not None and rule.baseline and record.penalty == 0
            and not record.config.data.random_targets)


def model_description(record: RunRecord) -> ModelDescription | None:
    """The model ``record`` trained, as the model describes itself. Records before schema 3
    lack it: the model is built again from the record's config on PyTorch's meta device (no
    memory, no random draws) — the code path that trained it — and asked; None when its
    architecture or dataset is not installed here."""
    if record.model is not None:
        return record.model
    raw = record.config.to_dict()
    key = json.dumps({"model": raw["model"], "data": raw["data"]}, sort_keys=True, default=str)
    if key not in _DESCRIBED:
        _DESCRIBED[key] = _describe(record)
    return _DESCRIBED[key]


_DESCRIBED: dict[str, ModelDescription | None] = {}


def _describe(record: RunRecord) -> ModelDescription | None:
    spec = DATASETS.find(record.config.data.name)
    if spec is None:
        return None
    try:
        shape = (tuple(record.data.input_shape) if record.data and record.data.input_shape
                 else tuple(spec(record.config.data).input_shape()))
        with on_meta_device():
            model = build_model(record.config.model, input_shape=shape,
                                n_classes=record.n_classes)
    except (CreditAuditError, AttributeError, TypeError, ValueError):
        return None
    return model.describe()


def arch_variant(record: RunRecord, *, ln_suffix: str = "-noLN",
                 residual_suffix: str | None = "-no-residual") -> str:
    """The architecture's name, marked when the model lacks the terminal LayerNorm its
    architecture can have (``resmlp-noLN``; StudentNet has none by definition, so stays
    ``student``) or its skips (``-no-residual``) — facts of the built model. A network
    adapted from any nn.Module (``module``, ``own-loop``) is named by its class."""
    name = record.config.model.arch
    model = model_description(record)
    arch = ARCHITECTURES.find(name)
    if model is None:
        return name
    if arch is not None and arch.adapted and model.short_label:
        return model.short_label
    if model.terminal_ln is False and arch is not None and "out_ln" in arch.option_names():
        name += ln_suffix
    if model.residual is False and residual_suffix is not None:
        name += residual_suffix
    return name


def draws_default_feedback(record: RunRecord) -> bool:
    """Whether the run's rule draws its feedback from the run seed (no ``feedback_seed`` of
    its own) — true of every rule that draws nothing."""
    rule = RULES.find(record.method)
    if rule is None or not rule.draws_feedback():
        return True
    return getattr(record.config.method, "feedback_seed", None) is None


def record_metadata(record: RunRecord) -> dict[str, Any]:
    """Report metadata of a run: method, architecture (the model's own label), terminal LN,
    dataset, seeds, feedback seed (of rules that draw from it), penalty, run id."""
    config = record.config
    model = model_description(record)
    rule = RULES.find(config.method.name)
    feedback_seed: int | str | None = (
        None if rule is None else rule.generator_seed(config.method, config.run.seed))
    seed = str(config.run.seed)
    # a user's loop that did not say: the config holds a default
    if "run.seed" in record.not_recorded:
        seed = NOT_RECORDED
        if feedback_seed is not None and draws_default_feedback(record):
            feedback_seed = NOT_RECORDED  # records before rule() kept its feedback seed
    return {
        "method": config.method.name,
        "arch": model.label if model is not None else config.model.arch,
        "terminal_ln": model.terminal_ln if model is not None else None,
        "dataset": config.data.name, "seeds": seed,
        "feedback_seed": feedback_seed, "penalty": config.method.penalty,
        "run_id": record.run_id,
    }


__all__ = ["is_frozen_baseline", "model_description", "arch_variant", "draws_default_feedback",
           "record_metadata"]
