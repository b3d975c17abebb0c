"""An advisory lock on a folder, for a read-merge-write of a file in it that several
processes may make at once (two sweeps or experiments writing one results folder)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None  # type: ignore[assignment]


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``folder`` (no file is created) while the block runs;
    other processes wait for it. Yields whether the lock is held: False where the system
    has none (Windows, a file system that refuses ``flock`` on a folder) — the block runs
    unlocked then, as it did before any lock."""
    if fcntl is None:
        yield False
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


__all__ = ["folder_lock"]
