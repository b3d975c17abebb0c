"""The typed descriptions a run record stores, made by the core and stored by the records.

Each is asked of the thing that knows it and stored once: the model as built
(:class:`ModelDescription`) and the data it trained on (:class:`DataIdentity`) once per
run, and what the diagnostics measured at an epoch (:class:`EpochMeasures`) once per
evaluated epoch. They sit at the base because the core that makes them and the records
that store them may not import each other. :mod:`creditaudit.descriptions.fields` is how
their fields, and every record part's, are declared: documentation and the domain of their
numbers (``docs/records.md`` is generated from them).
"""

from __future__ import annotations

from creditaudit.descriptions.epoch import (
    BELOW_FLOOR,
    COSINE_INVALID,
    CREDIT_NOT_FINITE,
    GRADIENT_NOT_FINITE,
    MEASURES_DERIVED,
    NOT_FINITE,
    EpochMeasures,
    deep_invalid,
    max_block_growth,
)
from creditaudit.descriptions.model_data import (
    AUGMENTATION,
    CONTENT_DIGEST,
    DataIdentity,
    ModelDescription,
)

__all__ = ["AUGMENTATION", "BELOW_FLOOR", "CONTENT_DIGEST", "COSINE_INVALID",
           "CREDIT_NOT_FINITE", "DataIdentity", "EpochMeasures", "GRADIENT_NOT_FINITE",
           "MEASURES_DERIVED", "ModelDescription", "NOT_FINITE", "deep_invalid",
           "max_block_growth"]
