"""The user cache folder: derived data that is safe to lose (fingerprints, generated data).

``$CREDITAUDIT_CACHE``, else ``$XDG_CACHE_HOME/creditaudit``, else ``~/.cache/creditaudit``.
Nothing here is ever required: an unreadable or unwritable cache only means recomputing.

What the cache says decides which data a run id names, so its entries are signed: an
HMAC-SHA256 under a random per-machine key (:data:`KEY_FILE`, 32 bytes, created on first use
with permissions 0600). Editing a cached value without the key makes its signature wrong,
and an entry whose signature does not verify is recomputed (:func:`sign`, :func:`verify`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
import tempfile
from pathlib import Path
from typing import Any

from creditaudit.errors import OutputError
from creditaudit.files.safe_files import atomic_write_bytes, read_text

log = logging.getLogger(__name__)

KEY_FILE = "cache.key"
KEY_BYTES = 32
# Keys by cache folder: the folder can change within a process (CREDITAUDIT_CACHE).
_KEYS: dict[Path, bytes] = {}


def cache_dir() -> Path:
    """The cache folder (not created here)."""
    explicit = os.environ.get("CREDITAUDIT_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    # The XDG spec says to ignore a relative path.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "creditaudit"


def read_cache_json(path: Path) -> Any:
    """The JSON value in cache file ``path``, or None when it is absent or unreadable: read
    as :func:`~creditaudit.files.safe_files.read_text` reads a user's file (a regular file
    only, boundedly), so a named pipe, a symlink to /dev/zero or a huge file in the cache
    neither blocks, nor fills memory — it only means recomputing."""
    try:
        return json.loads(read_text(path, "cache file", OutputError))
    except (OutputError, ValueError, RecursionError):
        return None


def load_json_cache(name: str) -> dict[str, Any]:
    """The JSON object cached as ``name`` ({} when absent or unreadable)."""
    data = read_cache_json(cache_dir() / name)
    return data if isinstance(data, dict) else {}


def store_json_cache(name: str, data: dict[str, Any]) -> None:
    """Replace the cached ``name`` atomically; a cache that cannot be written is skipped."""
    try:
        atomic_write_bytes(cache_dir() / name, json.dumps(data, sort_keys=True).encode())
    except OutputError as err:
        log.debug("cache not written: %s", err)


def _read_key(path: Path) -> bytes | None:
    """The key in ``path`` when it is one this user alone can read: a regular file of
    :data:`KEY_BYTES` bytes, owned by this user, mode 0600 (else None)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if (not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid()
                or info.st_mode & 0o077 or info.st_size != KEY_BYTES):
            return None
        key = handle.read(KEY_BYTES + 1)
    return key if len(key) == KEY_BYTES else None


def _new_key(folder: Path) -> bytes | None:
    """Create the folder's key; None when the folder cannot hold one.

    The key is written to a temporary file (mkstemp: mode 0600) and linked into place, so
    two processes starting at once agree on one key and none reads a half-written file.
    A key file that is not this user's private 32 bytes is replaced (which voids every
    signature made with it: those entries are recomputed)."""
    path = folder / KEY_FILE
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{KEY_FILE}.", suffix=".tmp")
    except OSError as err:
        log.debug("no cache key in %s: %s", folder, err)
        return None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(secrets.token_bytes(KEY_BYTES))
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            if _read_key(path) is None:  # not a private key of ours: replace it
                log.debug("replacing the cache key %s (not this user's private key)", path)
                os.replace(tmp, path)
    except OSError as err:
        log.debug("no cache key in %s: %s", folder, err)
        return None
    finally:
        Path(tmp).unlink(missing_ok=True)
    return _read_key(path)


def cache_key() -> bytes | None:
    """This machine's secret that signs cache entries (created on first use); None when the
    cache folder cannot hold one — then nothing cached is trusted."""
    folder = cache_dir()
    key = _KEYS.get(folder)
    if key is None:
        key = _read_key(folder / KEY_FILE) or _new_key(folder)
        if key is not None:
            _KEYS[folder] = key
    return key


def _mac(key: bytes, parts: tuple[str, ...]) -> str:
    # Length-prefixed parts: ("ab", "c") and ("a", "bc") must not sign the same message.
    message = b"".join(len(p.encode()).to_bytes(8, "big") + p.encode() for p in parts)
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def sign(*parts: str) -> str | None:
    """HMAC-SHA256 (hex) of ``parts`` under the cache key: what makes a cached value
    trustworthy (store it beside the value); None when there is no key."""
    key = cache_key()
    return None if key is None else _mac(key, parts)


def verify(signature: Any, *parts: str) -> bool:
    """Whether ``signature`` (as read from the cache: any JSON value) is :func:`sign`'s of
    ``parts`` under this machine's key (constant-time comparison)."""
    key = cache_key()
    return (key is not None and isinstance(signature, str)
            and hmac.compare_digest(signature, _mac(key, parts)))


__all__ = ["cache_dir", "read_cache_json", "load_json_cache", "store_json_cache", "cache_key",
           "sign", "verify", "KEY_FILE"]
