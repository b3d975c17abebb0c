"""Shared fixtures for the test suite."""

from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _private_data_cache(tmp_path_factory):
    """Generated datasets (MNIST-1D) cache into a session folder, never the user's ~/.cache.

    Set in os.environ (not monkeypatch, which is per test) so that worker processes of
    sweeps inherit it.
    """
    previous = os.environ.get("CREDITAUDIT_CACHE")
    os.environ["CREDITAUDIT_CACHE"] = str(tmp_path_factory.mktemp("creditaudit-cache"))
    yield
    if previous is None:
        os.environ.pop("CREDITAUDIT_CACHE", None)
    else:
        os.environ["CREDITAUDIT_CACHE"] = previous


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
def kill_run_at(monkeypatch):
    """``kill_run_at(config, epoch=2)``: train ``config`` and interrupt it as a kill would
    (KeyboardInterrupt when ``epoch`` starts), leaving an interrupted run to resume."""
    from creditaudit.training import Trainer, train

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
