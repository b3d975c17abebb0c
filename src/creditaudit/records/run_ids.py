"""Run ids: the same computation finds the same folder, a different one never does.

A run id is ``METHOD-ARCH-DATASET-sSEED-HASH``, where HASH covers every config value that
changes what the run computes (non-default values only, so a new option whose default keeps
the old behaviour leaves existing ids alone), the fingerprint of the data actually loaded
(:mod:`creditaudit.data.identity`) — not the data's folder — and the code that computes it:
each component's ``id_version`` and, for a guest (a plugin; a ``module`` architecture's
factory outside creditaudit), its distribution and version and the digest of its source
files (:mod:`creditaudit.guests`). So the same config on other data is another run, the same
data copied elsewhere is the same run, and a plugin upgraded — or a factory edited — never
has its old records returned as finished. Built-in components carry no digest (their code
is creditaudit's version), so their run ids do not move when a guest's rules change. Options
that change no weight and no recorded number (output folder, progress bars, loggers) are left
out, and so are the torch thread count and the device: they change no option of the
computation, but they can change the last bits of its sums (the order torch adds their
pieces in). A run's record says what it ran on (``environment.torch_threads``, ``device``);
a completed run found for the same config is served whatever thread count it ran on (the
same computation up to rounding), and a resumed run goes on with the count its epochs used
(:func:`creditaudit.run.resume.resume_threads`), so it equals the uninterrupted run.

This module only hashes; :func:`creditaudit.run.plan.plan_run` resolves what goes in
(``creditaudit.run.plan.run_id(config)`` is the one-call form).

``ID_VERSION`` is bumped whenever a default changes what runs compute, so records computed
the old way are never served for the new default. A change that only one component's runs
see bumps that component's own ``id_version`` instead, which leaves the others' ids alone.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from creditaudit.config import RunConfig, semantic_dict
from creditaudit.moved import pre_move_path

ID_VERSION = 3
# The model keys that name a module's callable as ``package.module:name``.
SPELLED_KEYS = ("factory", "module")
# The payload key of each axis's own id_version (the rules' key predates the others').
VERSION_KEYS = {"method": "method_version", "model": "model_version", "data": "data_version"}


@dataclass(frozen=True)
class CodeVersion:
    """What identifies the code of one component in a run id: its ``id_version``; for a
    plugin, ``dist==version`` of the package that installed it (None for built-ins); for
    a guest's code (a plugin, a factory), ``digest``, the sha256 of its source files.

    ``checks``: the conformance checks the guest passed at the door (recorded, not part of
    the run id); None for built-ins, which the test suite checks. ``declared_failures``:
    ``(check, reason)`` of the checks it failed there that it declares it fails by design
    (``expected_failures``; recorded, so a reader sees what its numbers do not claim).
    ``structure``: for a model guest, the digest of the module tree its code built
    (:func:`~creditaudit.models.structure.structure_digest`; recorded as
    ``structure_digest``, not part of the run id): what a factory reads besides its code (a
    JSON of settings) can build another network from the same code, which a finished run
    is then not served for, nor resumed or audited with
    (:func:`creditaudit.run.run_code.check_same_network`). ``untied``: for a network that
    shares a module, parameter or buffer between names (weight tying), the digest of its
    module tree without the sharing, as records written before the sharing was counted
    keep it (not recorded)."""

    name: str
    id_version: int = 0
    plugin: str | None = None
    digest: str | None = None
    checks: tuple[str, ...] | None = None
    declared_failures: tuple[tuple[str, str], ...] = ()
    structure: str | None = None
    untied: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "id_version": self.id_version,
                               "origin": self.plugin or "creditaudit"}
        if self.digest is not None:
            out["code_digest"] = self.digest
        if self.structure is not None:
            out["structure_digest"] = self.structure
        if self.checks is not None:
            out["checks"] = list(self.checks)
        if self.declared_failures:
            out["declared_failures"] = dict(self.declared_failures)
        return out


@dataclass(frozen=True)
class RunCode:
    """The code versions of a run's rule (``method``), architecture (``model``), dataset
    (``data``) and enabled plugin diagnostics."""

    method: CodeVersion
    model: CodeVersion
    data: CodeVersion
    diagnostics: tuple[CodeVersion, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {axis: getattr(self, axis).to_dict() for axis in VERSION_KEYS}
        if self.diagnostics:
            out["diagnostics"] = [d.to_dict() for d in self.diagnostics]
        return out


def pre_move_spelling(spec: str) -> str:
    """``package.module:name`` with a module that moved in 0.2 spelled by its old path
    (:mod:`creditaudit.moved`): ``creditaudit.testing.zoo:resnet20`` →
    ``creditaudit.zoo:resnet20``. Either spelling names the same code, so run ids hash this
    one: a config finds the runs it found before the move, whichever spelling it uses."""
    module, colon, name = spec.partition(":")
    return pre_move_path(module) + colon + name


def compute_run_id(config: RunConfig, fingerprint: str, code: RunCode, *,
                   dtype: str = "float32") -> str:
    """The run's folder name from its config, its data's fingerprint, its code and the
    dtype its features and parameters are made in (torch's default dtype where it was
    planned; a float32 run's id leaves it out, as ids did before)."""
    semantic = semantic_dict(config)
    model = semantic.get("model", {})
    for key in SPELLED_KEYS:
        if isinstance(model.get(key), str):
            model[key] = pre_move_spelling(model[key])
    payload: dict[str, Any] = {"config": semantic, "data": fingerprint, "version": ID_VERSION}
    if dtype != "float32":  # another computation: torch.set_default_dtype in the caller's code
        payload["dtype"] = dtype
    plugins, digests = {}, {}
    for axis, key in VERSION_KEYS.items():
        version: CodeVersion = getattr(code, axis)
        if version.id_version:
            payload[key] = version.id_version
        if version.plugin:
            plugins[axis] = version.plugin
        if version.digest:
            digests[axis] = version.digest
    for diagnostic in code.diagnostics:
        if diagnostic.id_version or diagnostic.plugin:
            plugins[f"diagnostic:{diagnostic.name}"] = (
                f"{diagnostic.plugin or 'creditaudit'}#{diagnostic.id_version}")
        if diagnostic.digest:
            digests[f"diagnostic:{diagnostic.name}"] = diagnostic.digest
    if plugins:
        payload["plugins"] = plugins
    if digests:  # guests only: a built-in run's payload, and so its id, stays as it was
        payload["code"] = digests
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:10]
    label = f"{config.method.name}-{config.model.arch}-{config.data.name}-s{config.run.seed}"
    return f"{label}-{digest}"


__all__ = ["ID_VERSION", "CodeVersion", "RunCode", "compute_run_id", "pre_move_spelling"]
