"""Guests: code creditaudit runs but did not write — a plugin's distribution, a ``module``
architecture's factory — identified by what its source files hold.

A :class:`Guest` names itself for messages (``credit rule plugin 'sparse-dfa'
(my-rules==1.0)``, ``model factory 'my_nets:Net'``) and lists its source files; its
:attr:`~Guest.digest` (sha256 over their names and contents) is part of the run id, so
editing a guest's code is a new run even when its version number stays. Which files:

- a plugin: the code that was imported — every ``.py`` file of the package (or module) its
  entry point lives in, as loaded: the outermost regular package of the entry point's
  module (``sys.modules``: its ``__path__`` or ``__file__``) — together with the other
  ``.py`` files its distribution installed (``RECORD``: a distribution may ship more
  than one top-level package), and the modules beside it that its code imports (found as a
  factory's are, below: a helper module next to a one-module plugin, which ``RECORD`` does
  not list in an editable install). So an editable install (whose ``RECORD`` lists only a
  finder or a ``.pth``) is identified by its source folder, and a copy of the package
  that shadows the installed one on ``sys.path`` by the copy's files; an ordinary install
  is the files its ``RECORD`` lists, named relative to its site folder as before;
- a factory (and the network class of a user's own loop, recorded by ``Recorder``): its
  module (a script's ``__main__``: the script) and, transitively, every module of its own
  code that it imports
  (found by reading the import statements, not by what happens to be loaded): the modules of
  its top-level package, and, when its folder is not the standard library's or an
  installed-packages folder (``site-packages``), the other modules of that folder. The
  standard library and other installed distributions are left out: their versions are
  what the record's environment lists.

Every guest made here is remembered, so :mod:`creditaudit.guests.blame` can tell which guest's code
an exception came out of.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import site
import sys
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from creditaudit.version import OWN_PACKAGE

# sha256 of one file's bytes, by (path, size, mtime, ctime): a source read once per process.
_FILE_DIGESTS: dict[tuple[str, int, int, int], str] = {}
_KNOWN: dict[tuple[str, str, tuple[Path, ...]], Guest] = {}
_PATHS: list[frozenset[str] | None] = [None]  # known_paths(), until the next guest is made


@dataclass(frozen=True)
class Guest:
    """Code of someone else's that creditaudit runs (see the module docstring).

    ``what``: how messages name it; ``root``: the folder its files' names are taken
    relative to (so the same code installed elsewhere has the same digest); ``files``: its
    source files (resolved paths); ``scope``: the qualified name of the plugin class in
    ``files`` that is this guest's own (frames of that class are blamed on it; other frames
    of the same files on ``family``); ``family``: how messages name the code of a
    distribution that holds several plugins.
    """

    what: str
    root: Path
    files: tuple[Path, ...]
    scope: str = ""
    family: str = ""
    _paths: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    @property
    def digest(self) -> str:
        """sha256 (hex) over each file's name relative to ``root`` and its content."""
        return source_digest(self.root, self.files)

    def owns(self, filename: str) -> bool:
        """Whether ``filename`` (a code object's ``co_filename``) is one of its files."""
        return resolved(filename) in self._paths


def make_guest(what: str, root: Path, files: list[Path], *, scope: str = "",
               family: str = "") -> Guest:
    """A :class:`Guest`, remembered for :func:`guests_owning`."""
    unique = tuple(sorted(set(files)))
    guest = Guest(what, root, unique, scope, family or what,
                  frozenset(str(p) for p in unique))
    key = (what, scope, unique)
    _KNOWN.pop(key, None)  # re-inserted: the latest is asked first
    _KNOWN[key] = guest
    _PATHS[0] = None
    return guest


def guests_owning(filename: str) -> list[Guest]:
    """Every known guest one of whose files is ``filename`` (latest first)."""
    return [g for g in reversed(_KNOWN.values()) if g.owns(filename)]


def known_paths() -> frozenset[str]:
    """The files of every known guest, resolved (what stdout routing looks for on the
    stack)."""
    if _PATHS[0] is None:
        out: frozenset[str] = frozenset()
        for guest in _KNOWN.values():
            out |= guest._paths
        _PATHS[0] = out
    return _PATHS[0]


@functools.lru_cache(maxsize=4096)
def resolved(filename: str) -> str:
    """``filename`` resolved (links, ``..``): code objects name files as they were imported."""
    return os.path.realpath(filename)


# --- digests ----------------------------------------------------------------------------------
def file_sha256(path: Path) -> str:
    """sha256 of ``path``'s bytes (memoised while its size and timestamps stay)."""
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    digest = _FILE_DIGESTS.get(key)
    if digest is None:
        digest = _FILE_DIGESTS[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digest


def source_digest(root: Path, files: tuple[Path, ...] | list[Path]) -> str:
    """sha256 (hex) over ``name\\0sha256(content)`` lines, one per file in name order (names
    relative to ``root`` where they lie below it)."""
    lines = []
    for path in files:
        try:
            name = path.relative_to(root).as_posix()
        except ValueError:
            name = path.as_posix()
        lines.append(f"{name}\0{file_sha256(path)}")
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()


# --- a plugin's files -------------------------------------------------------------------------
def plugin_sources(entry: metadata.EntryPoint) -> tuple[Path, list[Path]]:
    """(root, ``.py`` files) of the code ``entry`` runs (module docstring); call it after the
    entry point was loaded. The root is the distribution's folder when the imported package
    lies in it (an ordinary install), else the folder the imported package was found in."""
    unit, root, loaded = loaded_sources(entry.module)
    # The modules beside it that its code imports (a helper module next to a single-module
    # plugin, or a second top-level package of an editable install, which RECORD does not
    # list): :func:`module_sources` adds them only outside an installed-packages folder.
    _, imported = module_sources(entry.module)
    loaded = sorted(set(loaded) | set(imported))
    dist = getattr(entry, "dist", None)
    if dist is None:
        return root, loaded
    base = Path(str(dist.locate_file(""))).resolve()
    prefix = unit.replace(".", "/")
    listed = []
    for name in dist.files or []:
        posix = name.as_posix()
        # The imported package's own files stand for those RECORD lists for it: they are
        # what runs (an editable source folder, a shadowing copy), and the same files when
        # the installed package is the one imported.
        ours = posix == f"{prefix}.py" or posix.startswith(f"{prefix}/")
        if name.suffix == ".py" and not (ours and loaded):
            path = Path(str(dist.locate_file(name))).resolve()
            if path.is_file():
                listed.append(path)
    if all(base in path.parents for path in loaded):
        root = base
    return root, sorted(set(listed) | set(loaded))


def loaded_sources(module: str) -> tuple[str, Path, list[Path]]:
    """(unit, root, files) of the imported module ``module``'s outermost regular package
    (or module) ``unit`` — namespace packages are passed through, their portions may be
    other distributions' — : every ``.py`` file below its folders, or the module's own
    file; ``root`` is the ``sys.path`` folder it was found in."""
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        loaded = sys.modules.get(name)
        file = getattr(loaded, "__file__", None)
        if loaded is None or not isinstance(file, str):
            continue  # a namespace package (or not imported): look one level deeper
        folders = [Path(p).resolve() for p in getattr(loaded, "__path__", [])]
        if folders:
            files = [p.resolve() for folder in folders for p in folder.rglob("*.py")
                     if "__pycache__" not in p.parts]
            return name, folders[0].parents[depth - 1], files
        path = Path(file).resolve()
        return name, path.parents[depth - 1], [path]
    return parts[0], Path.cwd(), []


# --- a factory's files ------------------------------------------------------------------------
def own_sources(modules: Iterable[str]) -> tuple[Path, list[Path]] | None:
    """(root, files) of the imported ``modules``, each with every module of its own code it
    imports (:func:`module_sources`; the root is that of the first one with files),
    creditaudit's own modules left out — its version names their code: None when no module
    is left. Both a factory (:func:`creditaudit.models.module_factory.factory_guest`) and
    the network of a user's own loop (:func:`creditaudit.run.recorder_config.network_code`)
    are identified so."""
    names = [m for m in dict.fromkeys(main_module_name(m) for m in modules)
             if m in sys.modules and m.split(".")[0] != OWN_PACKAGE]
    if not names:
        return None
    found = [module_sources(m) for m in names]
    root = next((root for root, files in found if files), found[0][0])
    return root, [f for _, part in found for f in part]


def main_module_name(name: str) -> str:
    """``name``, or for ``__main__`` run as ``python -m pkg.mod`` the module it is
    (``pkg.mod``): its source is found as that module's. A script's ``__main__`` stays."""
    spec = getattr(sys.modules.get(name), "__spec__", None) if name == "__main__" else None
    spec_name = getattr(spec, "name", None)
    return spec_name if isinstance(spec_name, str) and spec_name != "__main__" else name


def unread_source(name: str) -> str | None:
    """Why the code of the imported module ``name`` is not covered by a digest of its
    source file, as a clause (``'nets' was loaded from nets.zip, …``); None when it is: its
    ``.py`` file is there to read, or it lies in the standard library or an installed
    distribution (whose version names it). A module defined without a file (a notebook,
    the interpreter prompt, ``exec`` into a new module), loaded from a zip archive, a
    compiled extension or a ``.pyc`` alone, or whose file was deleted since, is not."""
    name = main_module_name(name)
    module = sys.modules.get(name)
    if module is None or name in sys.builtin_module_names:
        return None  # not a module imported (own_sources skips it), or the interpreter's
    file = getattr(module, "__file__", None)
    if not isinstance(file, str):
        if getattr(module, "__path__", None):
            return None  # a namespace package: no code of its own
        return (f"module {name!r} has no source file (it was defined in a notebook, at the "
                "interpreter prompt or by exec)")
    path = Path(file).resolve()
    if _is_installed_folder(path.parent):
        return None
    if path.suffix != ".py":
        return (f"module {name!r} was loaded from {file}, not from a .py source file "
                "creditaudit can read (a compiled extension, bytecode)")
    if not path.is_file():
        inside = next((f for f in path.parents if f.is_file()), None)
        if inside is not None:
            return (f"module {name!r} was loaded from inside {inside}, an archive, not from "
                    "a source file creditaudit can read")
        return f"module {name!r} was loaded from {file}, which no longer exists"
    return None


def module_sources(name: str) -> tuple[Path, list[Path]]:
    """(root, files) of the imported module ``name`` and every module of its own code it
    imports, transitively (module docstring); a script's ``__main__`` is its file, in its
    folder. No files when ``name`` has no source file (a notebook's or the interpreter's
    ``__main__``)."""
    name = main_module_name(name)
    top = name.split(".")[0]
    top_module = sys.modules.get(top)
    folders = [Path(p).resolve() for p in getattr(top_module, "__path__", [])]
    top_file = getattr(top_module, "__file__", None)
    if folders:
        root = folders[0].parent
    elif isinstance(top_file, str):
        root = Path(top_file).resolve().parent
    else:
        return Path.cwd(), []
    foreign = not _is_installed_folder(root)
    seen: dict[str, Path] = {}
    pending = [name]
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        path = _find_source(root, current)
        if path is None and current == "__main__":  # a script: its file, whatever its name
            path = _script_file(top_file)
        if path is None:
            continue
        seen[current] = path
        package = current if path.name == "__init__.py" else current.rpartition(".")[0]
        pending.extend(_parents(current))
        for imported in _imports(path, package):
            if imported.split(".")[0] == OWN_PACKAGE:  # its version names that code
                continue
            if imported.split(".")[0] == top or (foreign and _find_source(root, imported)):
                pending.append(imported)
    return root, sorted(set(seen.values()))


def _is_installed_folder(folder: Path) -> bool:
    """Whether ``folder`` is (or lies in) the standard library or a site-packages folder."""
    paths = sysconfig.get_paths()
    roots = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= set(site.getsitepackages()) | {site.getusersitepackages()}
    for candidate in roots:
        if candidate and (folder == Path(candidate).resolve()
                          or Path(candidate).resolve() in folder.parents):
            return True
    return False


def _find_source(root: Path, name: str) -> Path | None:
    """The source file of module ``name`` below ``root`` (a ``.py`` file or a package's
    ``__init__.py``), without importing anything; None when it is not there."""
    base = root.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            found = path.resolve()
            # Only files of that folder: no site-packages of a virtualenv kept inside it.
            return None if _is_installed_folder(found.parent) else found
    return None


def _script_file(file: object) -> Path | None:
    """A script's source file (``__main__.__file__``), or None when it has none."""
    if not isinstance(file, str) or not file.endswith(".py"):
        return None
    path = Path(file).resolve()
    return path if path.is_file() else None


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _imports(path: Path, package: str) -> list[str]:
    """The module names the import statements of ``path`` may load (any depth in the file:
    an import inside a function runs too), relative ones resolved against ``package``; for
    ``from m import n`` both ``m`` and ``m.n`` (n may be a submodule)."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, OSError):
        return []
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                if node.level - 1 > len(parts):
                    continue
                base = ".".join(parts[:len(parts) - (node.level - 1)])
                module = f"{base}.{node.module}" if node.module and base else (
                    node.module or base)
            else:
                module = node.module or ""
            if module:
                names.append(module)
                names.extend(f"{module}.{alias.name}" for alias in node.names
                             if alias.name != "*")
    return names


__all__ = ["Guest", "make_guest", "guests_owning", "known_paths", "source_digest",
           "file_sha256", "resolved", "plugin_sources", "loaded_sources", "module_sources",
           "own_sources", "main_module_name", "unread_source"]
