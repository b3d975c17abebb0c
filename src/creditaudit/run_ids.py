"""Run ids: the same computation finds the same folder, a different one never does.

``run_id(config)`` = ``METHOD-ARCH-DATASET-sSEED-HASH``, where HASH covers every config value
that changes what the run computes (non-default values only, so a new option whose default
keeps the old behaviour leaves existing ids alone) and the fingerprint of the data actually
loaded (:mod:`creditaudit.data.identity`) — not the data's folder. So the same config on other
data is another run, and the same data copied elsewhere is the same run. Options that change
no weight and no recorded number (output folder, threads, device, progress bars, TensorBoard,
``diagnostics.frozen_acc``) are left out.

``ID_VERSION`` is bumped whenever a default changes what runs compute, so records computed
the old way are never served for the new default. A default that only one method reads bumps
that method's entry in ``METHOD_ID_VERSIONS`` instead, which leaves the other methods' ids
alone.
"""

from __future__ import annotations

import hashlib
import json

from creditaudit.config import RunConfig, semantic_dict
from creditaudit.data.identity import DataIdentity, data_identity

ID_VERSION = 3
# method → its own id version; absent = 0, which adds nothing to the hash. ep 1: the default
# relaxation became residual-cg (it was cg). ep 2: residual-cg's bound on the nudged energy
# allows for the rounding of the logits (in float32 it had sent confident samples back to
# their free states with zero credit), so EP records trained before that are not reused.
METHOD_ID_VERSIONS = {"ep": 2}


def data_seed(config: RunConfig) -> int:
    """The seed of generated datasets: ``data.data_seed``, else the run seed."""
    return config.run.seed if config.data.data_seed is None else config.data.data_seed


def run_data_identity(config: RunConfig) -> DataIdentity:
    """The identity of the data ``config`` trains on (DataError if it cannot be read)."""
    return data_identity(config.data, data_seed(config))


def run_id(config: RunConfig, identity: DataIdentity | None = None) -> str:
    """The run's folder name (``identity``: its data identity, computed when not given)."""
    identity = identity or run_data_identity(config)
    payload = {"config": semantic_dict(config), "data": identity.fingerprint,
               "version": ID_VERSION}
    method_version = METHOD_ID_VERSIONS.get(config.method.name, 0)
    if method_version:
        payload["method_version"] = method_version
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:10]
    label = f"{config.method.name}-{config.model.arch}-{config.data.name}-s{config.run.seed}"
    return f"{label}-{digest}"
