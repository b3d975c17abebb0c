"""The code a run runs: its guests, what the door admits of them, and the record's code block.

A guest is code from outside creditaudit a run executes: a plugin (rule, architecture,
dataset, diagnostic), or a ``module`` factory a built-in architecture runs. This module
names a run's guests by the key of their component in the record's code block
(:func:`guests_of`: ``method``, ``model``, ``data``, ``diagnostic:NAME``), sends each
through the door (:func:`admit`, :mod:`creditaudit.run.door`), and writes each component's
code identity (:func:`code_version`: its ``id_version``, a plugin's distribution version,
a guest's code digest and the checks it passed) into the run's
:class:`~creditaudit.records.run_ids.RunCode` (:func:`run_code`). A dataset guest's
declarations or arrays creditaudit cannot use are named as its own fault
(:func:`dataset_at_fault`). :func:`creditaudit.run.plan.plan_run` puts these together.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch

from creditaudit.caller import FORCE
from creditaudit.config import RunConfig
from creditaudit.data import DatasetSpec
from creditaudit.errors import GuestError, LoadedDataError, RunRecordError
from creditaudit.guests import Guest
from creditaudit.guests.blame import blame
from creditaudit.methods import CreditRule
from creditaudit.models import Architecture
from creditaudit.protocol.verdicts import Protocol
from creditaudit.records import RunRecord
from creditaudit.records.run_ids import CodeVersion, RunCode
from creditaudit.registry import ARCHITECTURES, DATASETS, DIAGNOSTICS, RULES, Registry
from creditaudit.run import door


def code_version(registry: Registry[Any], cls: type, guest: Guest | None = None,
                 admission: door.Admission | None = None) -> CodeVersion:
    """The code identity of ``cls``: its ``id_version``, a plugin's ``dist==version``, and
    for a guest (the plugin itself, or ``guest``: code a built-in runs, e.g. a factory) the
    digest of its code and the checks it passed (or declares it fails) at the door."""
    origin = registry.origin(cls.name)
    plugin = None if origin is None or origin.builtin else origin.text
    guest = guest or registry.guest(cls.name)
    return CodeVersion(cls.name, cls.id_version, plugin,
                       digest=guest.digest if guest is not None else None,
                       checks=None if admission is None else admission.checks,
                       declared_failures=() if admission is None else admission.declared)


def run_code(rule: type[CreditRule], arch: Architecture[Any], spec: DatasetSpec[Any],
             protocol: Protocol, guests: dict[str, Guest],
             admitted: dict[str, door.Admission], structure: str | None = None,
             untied: str | None = None) -> RunCode:
    """The record's code block: the code identity (:func:`code_version`) of the rule, the
    architecture, the dataset and each diagnostic, with their guests (:func:`guests_of`)
    and what the door admitted of them (:func:`admit`); ``structure``: the module tree
    digest of the network built (kept for a model guest's code, see
    :func:`check_same_network`); ``untied``: that digest without the modules and
    parameters the network shares, where it shares any (a record written before the
    sharing was counted keeps it)."""
    diagnostics = tuple(
        code_version(DIAGNOSTICS, d, guests.get(f"diagnostic:{d.name}"),
                     admitted.get(f"diagnostic:{d.name}"))
        for d in protocol.diagnostics)
    return RunCode(method=code_version(RULES, rule, guests.get("method"),
                                       admitted.get("method")),
                   model=replace(code_version(ARCHITECTURES, arch, guests.get("model"),
                                              admitted.get("model")),
                                 structure=structure if "model" in guests else None,
                                 untied=untied if "model" in guests else None),
                   data=code_version(DATASETS, spec, guests.get("data"), admitted.get("data")),
                   diagnostics=diagnostics)


def check_same_network(record: RunRecord, code: RunCode, arch: Architecture[Any],
                       where: object) -> None:
    """One-line RunRecordError when the model guest's code (the same code: its digest was
    checked) builds another network now than the one ``record``'s run trained — another
    module tree digest (``structure_digest``, :class:`~creditaudit.records.run_ids.CodeVersion`)
    than the record keeps: a file or a variable its code reads (a JSON of widths, an
    environment variable) changed, which the run id does not cover, so the finished run is
    not served, resumed or audited as this network's. Records without the digest (before
    it was kept, built-in architectures) pass, and so do runs of another torch version,
    whose modules may keep other settings. A network that shares modules or parameters
    between names (weight tying) whose record keeps its tree without the sharing is
    refused too, saying so: the record was written before the sharing was counted (or of
    the tree untied), and cannot say what its run shared. ``arch``: the architecture (its
    guest is named); ``where``: the run's folder or record."""
    components = record.environment.get("components")
    model = components.get("model") if isinstance(components, dict) else None
    then = model.get("structure_digest") if isinstance(model, dict) else None
    now = code.model.structure
    if (not isinstance(then, str) or now is None or then == now
            or model.get("code_digest_of") is not None  # a Recorder's: in its run id
            or record.environment.get("torch") != torch.__version__):
        return  # another torch may keep other settings in the same modules: not a change
    guest = model_guest(arch)
    what = "its architecture" if guest is None else guest.what
    if then == code.model.untied:
        raise RunRecordError(
            f"{where}: {what} builds a network that shares modules or parameters between "
            "names (weight tying) which the run's record does not say it shared: the run "
            "trained this module tree untied, or its record was written before creditaudit "
            "counted such sharing in a network's identity and cannot say which it shared; "
            "it is not served, resumed or audited as this network's: train it again (pass "
            f"{FORCE} to train it over this one)")
    raise RunRecordError(
        f"{where}: {what} builds another "
        f"network than the run trained (module tree {then[:12]}… then, {now[:12]}… now) "
        "from the same code: something it reads besides its code changed (a file, an "
        "environment variable), which the run id does not cover; restore it to use this "
        f"run, or train the new network as a new run (give such values in model.args, or "
        f"pass {FORCE} to train it over this one)")


def model_guest(arch: Architecture[Any]) -> Guest | None:
    """The code from outside creditaudit that builds the network of ``arch``: a ``module``
    architecture's factory, or a plugin architecture itself; None for creditaudit's own."""
    return arch.guest_code() or ARCHITECTURES.guest(arch.name)


@contextlib.contextmanager
def dataset_at_fault(spec: DatasetSpec[Any] | type[DatasetSpec[Any]], what: str
                     ) -> Iterator[None]:
    """Run a dataset's code (:func:`blame` for a plugin); a LoadedDataError it leads to —
    arrays or declarations creditaudit cannot use — is a GuestError naming the plugin
    (``WHAT`` creditaudit cannot use: …)."""
    guest = DATASETS.guest(spec.name)
    try:
        with blame(guest):
            yield
    except LoadedDataError as err:
        if guest is None:
            raise
        raise GuestError(f"{guest.what} {what} creditaudit cannot use: {err}") from None


def guests_of(rule: type[CreditRule], arch: Architecture[Any], spec: DatasetSpec[Any],
              protocol: Protocol, factory: Guest | None) -> dict[str, Guest]:
    """Every guest of the run, by the key of its component in the record's code block
    (``diagnostic:NAME`` for a diagnostic): the plugins, and the code a built-in
    architecture runs (a ``module`` factory), whose digest is the model's."""
    found = {"method": RULES.guest(rule.name),
             "model": factory or ARCHITECTURES.guest(arch.name),
             "data": DATASETS.guest(spec.name),
             **{f"diagnostic:{d.name}": DIAGNOSTICS.guest(d.name)
                for d in protocol.diagnostics}}
    return {key: guest for key, guest in found.items() if guest is not None}


def admit(config: RunConfig, rule: type[CreditRule], arch: Architecture[Any],
          spec: DatasetSpec[Any], protocol: Protocol, input_shape: tuple[int, ...],
          n_classes: int, factory: Guest | None, layouts: tuple[str, ...] = ()
          ) -> dict[str, door.Admission]:
    """Every guest of the run through the door (:mod:`creditaudit.run.door`), by the key of
    its component in the record's code block; built-ins pass without checks. ``layouts``:
    the built model's state layouts (a plugin rule is checked on states shaped so)."""
    admitted: dict[str, door.Admission] = {}
    if (guest := RULES.guest(rule.name)) is not None:
        admitted["method"] = door.rule_door(rule, guest, arch.name, config.method,
                                            layouts=layouts)
    if (guest := ARCHITECTURES.guest(arch.name)) is not None:
        admitted["model"] = door.architecture_door(arch, guest, input_shape)
    elif factory is not None:
        admitted["model"] = door.factory_door(factory, config.model, input_shape, n_classes)
    if (guest := DATASETS.guest(spec.name)) is not None:
        admitted["data"] = door.dataset_door(spec, guest)
    for diagnostic in protocol.diagnostics:
        if (guest := DIAGNOSTICS.guest(diagnostic.name)) is not None:
            admitted[f"diagnostic:{diagnostic.name}"] = door.diagnostic_door(diagnostic,
                                                                             guest)
    return admitted


__all__ = ["code_version", "run_code", "check_same_network", "model_guest", "dataset_at_fault",
           "guests_of", "admit"]
