"""Project exceptions: every error a user can cause is one of these.

The CLI prints ``str(error)`` on one line and exits non-zero; library users can catch
:class:`CreditAuditError` to handle all of them at once.
"""

from __future__ import annotations


class CreditAuditError(Exception):
    """Base class for errors caused by user input (configs, data, models, run records)."""


class ConfigError(CreditAuditError):
    """A configuration key, type or value is not allowed."""


class DataError(CreditAuditError):
    """A dataset folder or file is missing, corrupt or has the wrong layout."""


class LoadedDataError(DataError):
    """The arrays a dataset loaded are not what it declares (sample shape, classes, labels
    outside its classes), or what it declares cannot be used (a numpy class count, two
    files under one name): the dataset's code is at fault, not the files' location."""


class ModelContractError(CreditAuditError):
    """A model does not expose what the credit rules or the protocol need."""


class RunRecordError(CreditAuditError):
    """A run record or checkpoint is missing, malformed, truncated or of another schema.
    ``fact``: what is wrong, without the ``advice`` the message ends with (when it was
    given apart), for a caller that acts on it itself (a sweep resumes or starts the run
    over; ``train`` offers what its checkpoint allows)."""

    def __init__(self, fact: str, advice: str = "") -> None:
        super().__init__(f"{fact}: {advice}" if advice else fact)
        self.fact = fact


class ChangedRecordError(RunRecordError):
    """A run record changed after creditaudit wrote it (its content digest no longer
    matches)."""


class NewerRecordError(RunRecordError):
    """A run record written by a newer version of creditaudit (a later record schema): this
    version cannot read it, and must not replace it either — the run is not lost, it needs
    the newer version."""


class RunBusyError(RunRecordError):
    """Another live process holds the run's folder (its ``claim.json``): it trains the run
    now (``creditaudit train``, a sweep's worker, a :class:`~creditaudit.run.recorder.Recorder`).
    Nothing of the run was touched."""


class OutputError(CreditAuditError):
    """A file or folder could not be written (read-only, a file where a folder should be,
    full disk, …)."""


class DiskFullError(OutputError):
    """A write failed for lack of space (no space left, quota exceeded): nothing is wrong
    with the run, which can go on once space is freed."""


# A run that failed and whose record could then not be written raises its own error with
# this note (:func:`note_unrecorded`): the cause comes first, the lost record after it.
UNRECORDED = "and its record could not be marked failed"


def note_unrecorded(err: BaseException, write_error: OutputError) -> None:
    """Note on a run's error ``err`` that writing its failed record raised ``write_error``
    (once: the runs of a stack that one error fails note the first record lost)."""
    if not unrecorded_note(err):
        err.add_note(f"{UNRECORDED}: {write_error}")


def unrecorded_note(err: BaseException) -> str:
    """``'; and its record could not …: WHY'`` when :func:`note_unrecorded` noted ``err``,
    else ``''``: what a one-line message about ``err`` ends with."""
    notes = getattr(err, "__notes__", ())
    return "".join(f"; {note}" for note in notes if note.startswith(UNRECORDED))


def error_line(err: CreditAuditError) -> str:
    """What a user is told of ``err``: its own sentence (what went wrong and how to fix it,
    e.g. a full disk's "cannot write …: no space left on the device: free some space and
    retry"), with :func:`unrecorded_note`; not its class's name."""
    return str(err) + unrecorded_note(err)


def ended_by_ray(err: BaseException) -> bool:
    """Whether ``err`` is the ``SystemExit`` Ray raises in a worker it shuts down (a sweep
    interrupted past its unwind time, a cluster stopped), wherever the worker was — in
    creditaudit's code or a guest's: the run was stopped, it did not fail, and no guest
    called ``sys.exit``; its record is left for the sweep's worker to say ``interrupted``,
    and it resumes, as after a Ctrl-C."""
    return isinstance(err, SystemExit) and hasattr(err, "ray_terminate_msg")


def pytest_outcome(err: BaseException) -> bool:
    """Whether ``err`` is a test runner's control flow (``pytest.skip``, ``pytest.fail``,
    pytest-timeout's ``Failed``: BaseExceptions of ``_pytest.outcomes``) raised in guest code
    that a user's test suite runs: it is the test's outcome, not the guest's failure, and
    passes as raised."""
    return any(cls.__module__.startswith("_pytest.") for cls in type(err).__mro__)


class GuestError(CreditAuditError):
    """Code creditaudit runs but did not write — a plugin, a model factory — failed, or
    failed its conformance checks: the message names it (``credit rule plugin 'x'
    (dist==1.0)``, ``model factory 'pkg.mod:fn'``), what it did and what to do."""
