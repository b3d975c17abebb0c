"""Blaming the guest: a plugin's or a factory's failure is named as its own, and what its code
prints never lands in creditaudit's output.

- :func:`blame` wraps a call into guest code (a plugin's ``build``/``load``/``evaluate``, a
  factory call): an exception out of it — or a ``sys.exit`` — becomes one
  :class:`~creditaudit.errors.GuestError` line naming the guest, its exception and where in
  its code it was raised; its stdout goes to stderr meanwhile. A change it leaves in torch's
  process-wide settings (default dtype, threads, …) is put back and refused the same way
  (:mod:`~creditaudit.guests.settings`). A
  :class:`~creditaudit.errors.CreditAuditError` a guest raises on purpose (a plugin refusing
  an option) is its message to the user and passes unchanged.
- :func:`guest_failure` tells, after the fact, whether an exception came out of a known
  guest's code (any frame of its traceback lies in a guest's files — the command line asks
  this of every unexpected error, e.g. one raised in a plugin model's forward during
  training) and says so in one line.
- :func:`mark_network_failure` marks an exception raised while a network that guest code
  built ran (the ``module`` architecture's factory's ``nn.Sequential`` of torch's own
  layers): no frame of the traceback lies in the guest's files, but none lies in
  creditaudit's either, so :func:`guest_failure` names the guest that built the network and
  the module of it that raised.
- :func:`guest_output_to_stderr`: while it is active, anything written to ``sys.stdout``
  by a call whose stack passes through a guest's files goes to stderr, so machine-readable
  output (``audit --format json``) stays parseable.

``os._exit`` ends the process without unwinding: no Python code can catch it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, TextIO

from creditaudit.errors import CreditAuditError, GuestError, ended_by_ray, pytest_outcome
from creditaudit.guests.code import Guest, guests_owning, known_paths, resolved
from creditaudit.guests.settings import settings_kept

ADVICE = ("an error in its code, not in creditaudit: fix it or report it to its authors "
          "(--verbose shows the traceback)")
# creditaudit's own source folder: a frame in it is creditaudit's code.
OWN_FOLDER = str(Path(__file__).resolve().parents[1]) + os.sep
# The attribute mark_network_failure sets on an exception: (guest, where in its network).
_RAISED_IN_NETWORK = "_creditaudit_raised_in_network"
# For a guest that returned a wrong value: no exception, so no traceback to show.
VALUE_ADVICE = "an error in its code, not in creditaudit: fix it or report it to its authors"


@contextlib.contextmanager
def blame(guest: Guest | str | None) -> Iterator[None]:
    """Run guest code (``guest``: a :class:`Guest` or how to name it; None = creditaudit's
    own code, nothing is wrapped): see the module docstring."""
    if guest is None:
        yield
        return
    what = guest if isinstance(guest, str) else guest.what
    try:
        with contextlib.redirect_stdout(sys.stderr), settings_kept(what):
            yield
    except (CreditAuditError, KeyboardInterrupt, GeneratorExit):
        raise
    except SystemExit as err:
        if ended_by_ray(err):  # Ray shut the worker down here: no guest's sys.exit
            raise
        raise GuestError(exit_message(what, err)) from None
    except BaseException as err:  # noqa: BLE001 - whatever the guest raised is named as its own
        # pytest.skip in a guest a user's test runs; running out of memory is no one's code
        # (guest_failure says so where it is caught)
        if pytest_outcome(err) or out_of_memory(err):
            raise
        raise GuestError(failure_message(what, err, _innermost(err.__traceback__, guest)
                                         )) from err


def out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is the host or a device running out of memory (Python's
    ``MemoryError``, torch's ``OutOfMemoryError``, its CPU allocator's ``RuntimeError``):
    the size of what ran, not a fault of the code it ran in."""
    import torch  # only on a failure path

    if isinstance(err, MemoryError | torch.OutOfMemoryError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and ("can't allocate memory" in text
                                              or "out of memory" in text.lower())


def memory_message(err: BaseException) -> str:
    """One line for running out of memory: what torch said, and what to shrink."""
    text = str(err).strip().splitlines()
    said = f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
    return (f"out of memory ({said}); make the model, the batch (optim.batch_size) or the "
            "evaluation set (diagnostics.eval_samples) smaller, or free memory, then run again")


def exit_message(what: str, err: SystemExit) -> str:
    return (f"{what} called sys.exit({err.code!r}){_where(_innermost(err.__traceback__))}: "
            "a plugin or factory must return or raise, never end the process; fix its code "
            "or report it to its authors")


def failure_message(what: str, err: BaseException, frame: traceback.FrameSummary | None,
                    within: str = "") -> str:
    """``WHAT raised TYPE: first line of the message (at FILE:LINE in FUNCTION); ADVICE``;
    ``within`` (``its module 'NAME' (CLASS)``) joins the parenthesis: ``(in WITHIN, at …)``."""
    text = str(err).strip().splitlines()
    detail = f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
    where = _where(frame)
    if within:
        where = f" (in {within}, {where[2:]}" if where else f" (in {within})"
    return f"{what} raised {detail}{where}; {ADVICE}"


def guest_error(what: str, err: BaseException) -> GuestError:
    """The one-line :class:`GuestError` naming ``what`` for ``err`` (or a ``sys.exit``) raised
    out of a call into its code — what :func:`blame` raises — for a caller that catches it
    itself (a user's logger: :class:`~creditaudit.loggers.LoggerGroup`)."""
    if isinstance(err, SystemExit):
        return GuestError(exit_message(what, err))
    return GuestError(failure_message(what, err, _innermost(err.__traceback__)))


def value_message(what: str, detail: str) -> str:
    """``WHAT DETAIL; ADVICE``: a guest whose call returned but whose value is wrong (NaN
    credits), named as its own in the one line of :func:`failure_message`."""
    return f"{what} {detail}; {VALUE_ADVICE}"


def guest_failure(err: BaseException) -> str | None:
    """One line naming the guest ``err`` came out of (the innermost frame of its traceback
    that lies in a known guest's files), or None when no guest's code is on it. A
    :class:`GuestError` already is that line. Running out of memory, wherever it happened, is
    no one's code: :func:`memory_message` says what to shrink."""
    if isinstance(err, GuestError):
        return str(err)
    if out_of_memory(err):
        return memory_message(err)
    found = None
    for frame, line in traceback.walk_tb(err.__traceback__):
        owners = guests_owning(frame.f_code.co_filename)
        if owners:
            found = (_owner(owners, frame), frame, line)
    if found is None:
        return _network_failure(err)
    what, frame, line = found
    summary = traceback.FrameSummary(frame.f_code.co_filename, line, frame.f_code.co_name)
    if isinstance(err, SystemExit):
        return exit_message(what, err)
    return failure_message(what, err, summary)


def mark_network_failure(err: BaseException, what: str, net: Any) -> None:
    """Mark ``err``, raised out of a call of ``net`` (an ``nn.Module`` built by the guest
    ``what``) and caught in the frame that called it, as the network's own failure when no
    frame below that call is creditaudit's code (a hook of creditaudit's that failed is
    creditaudit's error); :func:`guest_failure` then names ``what`` and the innermost module
    of ``net`` whose ``forward`` was running. Running out of memory (host or device) is
    no one's code: not marked."""
    if isinstance(err, CreditAuditError | KeyboardInterrupt) or out_of_memory(err):
        return
    frames = list(traceback.walk_tb(err.__traceback__))[1:]  # the caller's frame left out
    if not frames or any(resolved(frame.f_code.co_filename).startswith(OWN_FOLDER)
                         for frame, _ in frames):
        return
    names = {id(module): name for name, module in net.named_modules()}
    module = ""
    for frame, _ in frames:
        owner = frame.f_locals.get("self") if frame.f_code.co_name == "forward" else None
        if id(owner) in names:
            name = names[id(owner)]
            module = f"its module {name!r} ({type(owner).__name__})" if name else (
                f"its {type(owner).__name__}")
    with contextlib.suppress(AttributeError, TypeError):  # an exception without a __dict__
        setattr(err, _RAISED_IN_NETWORK, (what, module))


def _network_failure(err: BaseException) -> str | None:
    """:func:`guest_failure` of an exception :func:`mark_network_failure` marked: ``WHAT
    raised TYPE: message (in its module 'NAME' (CLASS), at FILE:LINE in FUNCTION); ADVICE``;
    None when unmarked."""
    marked = getattr(err, _RAISED_IN_NETWORK, None)
    if marked is None:
        return None
    what, module = marked
    return failure_message(what, err, _innermost(err.__traceback__, what), module)


def _owner(owners: list[Guest], frame: FrameType) -> str:
    """How to name the guest a frame belongs to: the plugin whose class the frame's function
    belongs to, the only guest owning the file, else the distribution's code."""
    qualname = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
    for guest in owners:
        if guest.scope and (qualname == guest.scope or qualname.startswith(guest.scope + ".")):
            return guest.what
    families = {g.family for g in owners}
    return owners[0].what if len(owners) == 1 or len(families) > 1 else owners[0].family


def _innermost(tb: TracebackType | None, guest: Guest | str | None = None
               ) -> traceback.FrameSummary | None:
    """The innermost frame of ``tb`` in ``guest``'s files (any guest's when not given);
    else the innermost frame."""
    frames = list(traceback.walk_tb(tb))
    paths = guest._paths if isinstance(guest, Guest) else known_paths()
    chosen = None
    for frame, line in frames:
        if resolved(frame.f_code.co_filename) in paths:
            chosen = (frame, line)
    if chosen is None and frames:
        chosen = frames[-1]
    if chosen is None:
        return None
    frame, line = chosen
    return traceback.FrameSummary(frame.f_code.co_filename, line, frame.f_code.co_name)


def _where(frame: traceback.FrameSummary | None) -> str:
    if frame is None:
        return ""
    return f" (at {Path(frame.filename).name}:{frame.lineno} in {frame.name})"


# --- stdout -----------------------------------------------------------------------------------
class GuestAwareStdout:
    """``sys.stdout`` that sends writes made from guest code to ``sys.stderr``."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        target = sys.stderr if _guest_on_stack(sys._getframe(1)) else self._stream
        return target.write(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _guest_on_stack(frame: FrameType | None) -> bool:
    paths = known_paths()
    if not paths:
        return False
    while frame is not None:
        if resolved(frame.f_code.co_filename) in paths:
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def guest_output_to_stderr() -> Iterator[None]:
    """Route guest writes to stdout to stderr while active (module docstring)."""
    previous = sys.stdout
    if previous is None:  # stdout closed (``>&-``): print() writes nothing, guests' included
        yield
        return
    sys.stdout = GuestAwareStdout(previous)
    try:
        yield
    finally:
        sys.stdout = previous


__all__ = ["blame", "guest_failure", "mark_network_failure", "failure_message", "exit_message",
           "value_message", "guest_output_to_stderr", "GuestAwareStdout", "ADVICE", "VALUE_ADVICE"]
