"""The start of a run trained in a user's own loop, as creating a
:class:`~creditaudit.run.recorder.Recorder` opens its record (:func:`open_record`): what
was trained — the data's identity (:func:`~creditaudit.run.recorder_config.data_identity`),
the model's own description (its ``model.arch`` ``own-loop``, with the parameters frozen
outside the rule), the code of the rule, the network, the dataset and the protocol's
diagnostics (``environment.components``; the network identified by its code's digest, as a
``module`` factory's) —, the run id these give when the caller names none, and the record,
``running``, that the Recorder writes before any epoch. What ends the run is
:mod:`creditaudit.run.recorder_finish`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from torch import Tensor

from creditaudit.config import RunConfig
from creditaudit.data import DatasetSpec
from creditaudit.data.registry import digest_text
from creditaudit.methods import CreditRule
from creditaudit.models.packages import network_packages
from creditaudit.models.registry import OwnLoopArchitecture
from creditaudit.protocol.verdicts import Protocol
from creditaudit.records import ReferenceState, RunRecord, new_record
from creditaudit.records.run_ids import CodeVersion, RunCode, compute_run_id
from creditaudit.registry import DATASETS
from creditaudit.run.plan import code_version
from creditaudit.run.recorder_config import (
    data_identity,
    dataset_admission,
    distribution,
    guest_code,
    network_identity,
    not_recorded,
    user_network,
)
from creditaudit.run.recorder_inputs import folder_name


def open_record(rule: CreditRule, config: RunConfig, spec: type[DatasetSpec[Any]] | None,
                given: set[tuple[str, str]], eval_x: Tensor, eval_y: Tensor, *,
                out: str | Path, name: str | None, reference: ReferenceState
                ) -> tuple[Path, RunRecord, Protocol]:
    """(the run's folder ``out/NAME``, its new record, the protocol it is judged by) for
    ``rule`` trained in a loop with ``config`` (:func:`~creditaudit.run.recorder_config.
    recorder_config`, which also gives ``spec``, the dataset creditaudit knows or None, and
    ``given``, the (section, key) the caller gave) and evaluated on ``eval_x`` ``(N, …)``
    and ``eval_y`` ``(N,)``. ``name``: the folder's name, None for the run id; ``reference``:
    how the reference gradient was checked (the record's ``reference``). One-line
    ConfigError (or a guest's error) for what cannot be identified; writes nothing."""
    model = rule.model
    identity = data_identity(spec, config, eval_x, eval_y, rule.n_classes)
    description = dataclasses.replace(model.describe(), arch=OwnLoopArchitecture.name,
                                      frozen_parameters=rule.frozen_outside())
    # The network is identified by its code, as a `module` factory is: two classes of
    # one name, or one edited between runs, are two runs and two recipes; a network of
    # installed classes only, by its module tree.
    network = user_network(model)
    digest, identified = network_identity(network)
    protocol = Protocol.from_config(config.diagnostics)
    method, diagnostics = guest_code(rule, protocol)
    data_code = CodeVersion(identity.name) if spec is None else code_version(
        DATASETS, spec, admission=dataset_admission(spec(config.data)))
    code = RunCode(method=method,
                   model=CodeVersion(OwnLoopArchitecture.name, digest=digest),
                   data=data_code, diagnostics=diagnostics)
    if name is None:  # the config names the class, not its sizes: add the description
        name = compute_run_id(config, digest_text(
            {"data": identity.fingerprint, "model": description.identity()}), code)
    run_dir = Path(out) / folder_name(name)
    components = code.to_dict()
    components["model"]["module"] = config.model.module  # type: ignore[attr-defined]
    components["model"].update(identified)
    components["model"]["module_origin"] = distribution(type(network).__module__)
    components["model"]["module_packages"] = network_packages(network, versions=True)
    if spec is None:
        components["data"]["origin"] = "the user's own loop"
    record = new_record(config, device=str(eval_x.device), data=identity,
                        run_id=run_dir.name, model=description, code=components)
    record.not_recorded = not_recorded(config, given)
    record.reference = reference
    return run_dir, record, protocol


__all__ = ["open_record"]
