"""How the rule conformance suite binds a rule to a tiny model (:func:`make_rule`, which
every check of :mod:`creditaudit.testing.rules` calls), and the options it binds it with:
the rule's defaults, or those ``check_rule`` is given (:func:`checked_with`; at the door,
the run's own), below the values a check sets itself (``trainable_blocks=1``, a penalty,
the other ``normalise_credit``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

import torch

from creditaudit.config import bind
from creditaudit.methods.adapted import set_trainable
from creditaudit.methods.base import CreditRule
from creditaudit.testing.common import CLASSES, F64, tiny_model

# The rule's own options the checks run under (check_rule's ``options``), by name.
_CHECKED_OPTIONS: ContextVar[Mapping[str, Any] | None] = ContextVar("checked_rule_options",
                                                                    default=None)


@contextlib.contextmanager
def checked_with(options: Mapping[str, Any]) -> Iterator[None]:
    """Inside the block every rule a check makes (:func:`make_rule`) is bound with
    ``options`` (the rule's own, by name) where the check sets no value of its own."""
    token = _CHECKED_OPTIONS.set(dict(options))
    try:
        yield
    finally:
        _CHECKED_OPTIONS.reset(token)


def checked_section(cls: type[CreditRule], **options: Any) -> Any:
    """``cls``'s ``[method]`` section as the checks bind it: the options under check
    (:func:`checked_with`; the defaults outside it) with ``options`` over them."""
    return bind(cls, "method", **{**(_CHECKED_OPTIONS.get() or {}), **options})


def make_rule(cls: type[CreditRule], *, seed: int = 0, dtype: torch.dtype = F64,
              arch: str = "resmlp", draw: int = 7, generator: torch.Generator | None = None,
              **options: Any) -> CreditRule:
    """``cls`` bound to a fresh tiny model of ``arch`` (``options``: MethodConfig fields,
    over the options under check: :func:`checked_section`), its weights drawn under
    ``seed``, the rule's generator (feedback, auxiliary nets) seeded with ``draw`` (or
    ``generator`` itself, for a check that watches it)."""
    model = tiny_model(seed, dtype, arch)
    config = checked_section(cls, **options)
    set_trainable(model, config.trainable_blocks)
    return cls(model, config, n_classes=CLASSES,
               generator=torch.Generator().manual_seed(draw) if generator is None
               else generator)


__all__ = ["make_rule", "checked_with", "checked_section"]
