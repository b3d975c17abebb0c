"""Shared fixtures for the test suite."""

from __future__ import annotations

import pytest
import torch


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
