"""The user cache folder: derived data that is safe to lose (fingerprints, generated data).

``$CREDITAUDIT_CACHE``, else ``$XDG_CACHE_HOME/creditaudit``, else ``~/.cache/creditaudit``.
Nothing here is ever required: an unreadable or unwritable cache only means recomputing.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from creditaudit.errors import OutputError
from creditaudit.safe_files import atomic_write_bytes

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """The cache folder (not created here)."""
    explicit = os.environ.get("CREDITAUDIT_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    # The XDG spec says to ignore a relative path.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "creditaudit"


def load_json_cache(name: str) -> dict[str, Any]:
    """The JSON object cached as ``name`` ({} when absent or unreadable)."""
    path = cache_dir() / name
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def store_json_cache(name: str, data: dict[str, Any]) -> None:
    """Replace the cached ``name`` atomically; a cache that cannot be written is skipped."""
    try:
        atomic_write_bytes(cache_dir() / name, json.dumps(data, sort_keys=True).encode())
    except OutputError as err:
        log.debug("cache not written: %s", err)
