"""creditaudit: train local credit-assignment rules and audit their headline numbers.

Public API::

    from creditaudit import RunConfig, train, diagnose, Thresholds, load_record

    result = train(RunConfig().replace(**{"method.name": "dfa"}))  # RunResult
    result.record, result.model, result.rule                          # the run
    report = diagnose(model, x, y, states_fn=..., forward_from=..., credit=..., metrics=True)

    adapted = adapt(my_net, states=["layer1", "layer2"], input_shape=(3, 32, 32))  # any nn.Module
    dfa = rule("dfa", adapted)           # dfa.train_step(x, y, optimizer) in your own loop
    report = diagnose(adapted, x, y, credit=dfa, metrics=True)
    rec = Recorder(dfa, x, y, out="runs/mine", name="mine-dfa")  # the CLI's run record
    rec.epoch(1, test_acc=0.81); rec.finish()                      # from your loop

The package is typed (``py.typed``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from creditaudit import moved
from creditaudit.version import __version__, warn_untested_torch

# Old import paths (creditaudit.training, creditaudit.zoo, …) keep working for one release.
moved.install()
# Once, on import, where torch is not a release the test suite ran on.
warn_untested_torch()

if TYPE_CHECKING:  # the names below are loaded on first use (__getattr__)
    from creditaudit.audit.diagnose import diagnose
    from creditaudit.config import RunConfig, load_config
    from creditaudit.errors import CreditAuditError
    from creditaudit.methods import rule
    from creditaudit.models.adapted import AdaptedModel, adapt
    from creditaudit.protocol import DiagnosticReport, Thresholds
    from creditaudit.records import RunRecord, load_record
    from creditaudit.run.folder import RunResult
    from creditaudit.run.recorder import Recorder
    from creditaudit.run.trainer import train

# public name → the module that defines it. ``import creditaudit`` imports neither torch
# nor these modules, so that the ``creditaudit`` command's entry (:mod:`creditaudit.cli`),
# which imports them, takes Ctrl-C from its first moment. The first use of a name imports
# the lot, as an import of the package did before.
_PUBLIC: dict[str, str] = {
    "diagnose": "creditaudit.audit.diagnose", "RunConfig": "creditaudit.config",
    "load_config": "creditaudit.config", "CreditAuditError": "creditaudit.errors",
    "rule": "creditaudit.methods", "AdaptedModel": "creditaudit.models.adapted",
    "adapt": "creditaudit.models.adapted", "DiagnosticReport": "creditaudit.protocol",
    "Thresholds": "creditaudit.protocol", "RunRecord": "creditaudit.records",
    "load_record": "creditaudit.records", "RunResult": "creditaudit.run.folder",
    "Recorder": "creditaudit.run.recorder", "train": "creditaudit.run.trainer",
}


# Hidden from type checkers, which read the names above instead: to them a module
# __getattr__ makes any attribute exist (typed Any), so `creditaudit.trian` would pass.
if not TYPE_CHECKING:
    def __getattr__(name: str) -> Any:
        """A public name (:data:`_PUBLIC`: the first imports them all), else a submodule
        (``creditaudit.run`` after a bare ``import creditaudit``)."""
        if name in _PUBLIC:
            for public, module in _PUBLIC.items():
                globals()[public] = getattr(importlib.import_module(module), public)
            return globals()[name]
        if name.startswith("__"):
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


__all__ = [
    "__version__", "RunConfig", "load_config", "train", "RunResult", "diagnose", "Thresholds",
    "DiagnosticReport", "load_record", "RunRecord", "CreditAuditError", "adapt", "rule",
    "AdaptedModel", "Recorder",
]
