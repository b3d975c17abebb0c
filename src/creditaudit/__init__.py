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

from creditaudit import moved

# Old import paths (creditaudit.training, creditaudit.zoo, …) keep working for one release.
moved.install()

from creditaudit.audit.diagnose import diagnose  # noqa: E402
from creditaudit.config import RunConfig, load_config  # noqa: E402
from creditaudit.errors import CreditAuditError  # noqa: E402
from creditaudit.methods import rule  # noqa: E402
from creditaudit.models.adapted import AdaptedModel, adapt  # noqa: E402
from creditaudit.protocol import DiagnosticReport, Thresholds  # noqa: E402
from creditaudit.records import RunRecord, load_record  # noqa: E402
from creditaudit.run.folder import RunResult  # noqa: E402
from creditaudit.run.recorder import Recorder  # noqa: E402
from creditaudit.run.trainer import train  # noqa: E402
from creditaudit.version import __version__, warn_untested_torch  # noqa: E402

# Once, on import, where torch is not a release the test suite ran on.
warn_untested_torch()

__all__ = [
    "__version__", "RunConfig", "load_config", "train", "RunResult", "diagnose", "Thresholds",
    "DiagnosticReport", "load_record", "RunRecord", "CreditAuditError", "adapt", "rule",
    "AdaptedModel", "Recorder",
]
