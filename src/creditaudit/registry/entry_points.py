"""Reading the installed entry points of one group, one distribution at a time.

``importlib.metadata.entry_points(group=…)`` parses every installed distribution's
``entry_points.txt`` and raises on the first it cannot parse, so one broken package's
metadata would break plugin discovery for everyone. Here a distribution whose file cannot be
read loses only its own entry points, said in one line naming it, the file and the fix; an
entry point that is not ``name = module:attr`` is named the same way when it is asked for.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path


def group_entries(group: str) -> tuple[list[metadata.EntryPoint], list[str]]:
    """The entry points of ``group`` of every installed distribution (the first found of a
    name, as ``importlib.metadata`` takes it), and one line per distribution whose
    ``entry_points.txt`` cannot be read."""
    entries: list[metadata.EntryPoint] = []
    problems: list[str] = []
    seen: set[str] = set()
    for dist in metadata.distributions():
        key = getattr(dist, "_normalized_name", None) or str(dist.metadata["Name"])
        if key in seen:
            continue
        seen.add(key)
        try:
            entries.extend(dist.entry_points.select(group=group))
        except Exception as err:  # noqa: BLE001 - another package's metadata, not ours
            reason = str(err).splitlines()[0] if str(err) else ""
            problems.append(
                f"the entry points of {_dist_text(dist)} cannot be read ({entry_file(dist)}: "
                f"{type(err).__name__}{': ' + reason if reason else ''}), so its plugins are "
                "ignored: every line of that file must be a [group] or `name = module:attr`; "
                "fix the file, or reinstall or uninstall that package")
    return entries, problems


def malformed(entry: metadata.EntryPoint, noun: str) -> str | None:
    """Why ``entry`` cannot name a plugin class (one line naming its distribution, file and
    line, and the fix), or None when it is ``name = module:attr``."""
    if entry.name.strip() and entry.pattern.fullmatch(entry.value.strip()):
        return None
    dist = getattr(entry, "dist", None)
    where = (f"{_dist_text(dist)} ({entry_file(dist)})" if dist is not None
             else "an installed package")
    return (f"{noun} entry point `{entry.name} = {entry.value}` of {where}, group "
            f"{entry.group}, is not `name = module:attr`: fix that line of the package's "
            "pyproject.toml and reinstall it, or uninstall it")


def entry_file(dist: metadata.Distribution | None) -> str:
    """The path of ``dist``'s ``entry_points.txt`` when known."""
    folder = getattr(dist, "_path", None)
    return str(Path(folder) / "entry_points.txt") if folder is not None else "entry_points.txt"


def _dist_text(dist: metadata.Distribution | None) -> str:
    """``name==version`` of ``dist`` (``?`` where unknown)."""
    if dist is None:
        return "?"
    try:
        return f"{dist.metadata['Name'] or '?'}=={dist.version or '?'}"
    except Exception:  # noqa: BLE001 - unreadable metadata is named as unknown
        return "?"


def dist_text(entry: metadata.EntryPoint) -> str:
    """``dist==version`` of the distribution that registered ``entry`` (``?`` unknown)."""
    dist = getattr(entry, "dist", None)
    return f"{dist.name}=={dist.version}" if dist is not None else "?"


def described(entry: metadata.EntryPoint) -> str:
    """``dist==version: module:Class`` of ``entry``."""
    return f"{dist_text(entry)}: {entry.value}"


def import_failure(err: BaseException) -> str:
    """How a plugin that failed to import is said: its exception's type and first line, or
    the ``sys.exit`` it called."""
    if isinstance(err, SystemExit):
        return f"it called sys.exit({err.code!r}) while being imported"
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
