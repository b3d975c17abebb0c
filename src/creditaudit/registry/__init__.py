"""One extension mechanism for every axis: credit rules, architectures, datasets and
protocol diagnostics.

Each pluggable piece is a self-describing class (:class:`Component`): a ``name`` (what the
config selects it by), a ``label`` (how tables and figures show it), an ``Options``
dataclass (its own settings, declared with :func:`creditaudit.config.opt`: help text,
allowed values, range), an ``id_version`` (bumped when its code starts computing something
else for the same options, so old records are never served as finished) and a ``rank``
(its place in listings). A :class:`Registry` per axis holds the built-in classes and loads
those other packages install through an entry-point group::

    [project.entry-points."creditaudit.models"]
    plain-mlp = "my_package.models:PlainMLPArchitecture"

Plugins are guests (:mod:`creditaudit.guests`). A plugin is imported only when a command
asks for its name (or lists every component of an axis), so a plugin that breaks at import
— even one that ends the process — touches no command that does not use it. A plugin that
fails to import — an exception, a ``sys.exit()``, a class that does not describe itself —
is named in one line when it is asked for (and in a warning when an axis is listed), and
the built-ins keep working; what it prints while imported goes to stderr. The entry point's
name must be the class's ``name``. A plugin cannot replace a built-in: a plugin registered
under a built-in's name is ignored, said in one warning when that name is used. A name two
installed distributions register in one group is refused in one line naming both (which
would run depends on ``sys.path`` order); their other names keep working. Each loaded plugin
is known as a :class:`~creditaudit.guests.Guest` (:meth:`Registry.guest`): its code's files
and digest, and how messages name it.

The registries themselves are defined here, below every layer that uses them; each axis's
package configures its registry (base class, extra checks) and registers its built-ins when
it is imported, which the registry does on first use.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Generic, TypeVar

from creditaudit.errors import ConfigError
from creditaudit.guests import Guest, make_guest, plugin_sources
from creditaudit.registry.component import (
    Component,
    NoOptions,
    check_options,
    defines,
    hook,
    older_hook,
    options_parameters,
)
from creditaudit.registry.entry_points import (
    described,
    dist_text,
    group_entries,
    import_failure,
    malformed,
)

log = logging.getLogger(__name__)

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


@dataclass(frozen=True)
class Origin:
    """Where a registered class comes from: built in, or the distribution of a plugin."""

    builtin: bool
    distribution: str | None = None
    version: str | None = None
    entry_point: str | None = None

    @property
    def text(self) -> str:
        """``creditaudit`` for built-ins, ``dist==version`` for plugins."""
        if self.builtin:
            return "creditaudit"
        return f"{self.distribution or '?'}=={self.version or '?'}"


C = TypeVar("C", bound=Component)
# An axis's own checks of a class already known to derive from its base.
Validator = Callable[[type[C], str], None]


def _builds(cls: type) -> bool:
    """Whether a config may choose ``cls``: not one that only describes runs and builds
    nothing (an architecture's ``unbuildable``: ``own-loop``, a Recorder's run)."""
    return not getattr(cls, "unbuildable", "")


class Registry(Generic[C]):
    """The classes of one axis: built-ins plus the installed plugins of ``group``.

    ``axis``: the axis's name (``"rules"``); ``noun``: what one of its classes is called in
    messages (``"credit rule"``); ``key``: the config key that selects one
    (``"method.name"``); ``builtins``: the module whose import registers the built-ins.
    """

    def __init__(self, axis: str, group: str, *, noun: str, key: str, builtins: str) -> None:
        self.axis, self.group, self.noun, self.key = axis, group, noun, key
        self.builtins_module = builtins
        self.base: type | None = None
        self.validator: Validator[C] | None = None
        self._builtin: dict[str, type[C]] = {}
        self._plugins: dict[str, type[C]] = {}
        self._origins: dict[str, Origin] = {}
        self._broken: dict[str, str] = {}
        self._guests: dict[str, Guest] = {}
        self._entry_points: dict[str, list[metadata.EntryPoint]] | None = None
        # Installed metadata whose entry points of this group cannot be used, one line each.
        self._unreadable: list[str] = []
        self._loaded: set[str] = set()
        self._shadow_warned: set[str] = set()
        self._builtins_loaded = False

    # --- set-up ----------------------------------------------------------------------------
    def configure(self, base: type[C], validate: Validator[C] | None = None) -> None:
        """Set the base class every member must derive from and the axis's own checks
        (called by the axis's package when it is imported)."""
        self.base, self.validator = base, validate

    def register(self, cls: type[C]) -> type[C]:
        """Class decorator of the built-ins."""
        self.validate(cls, cls.__qualname__)
        self._builtin[cls.name] = cls
        self._origins[cls.name] = Origin(builtin=True)
        return cls

    def validate(self, cls: Any, source: str) -> type[C]:
        """The class itself when it describes itself fully; ConfigError otherwise."""
        if not isinstance(cls, type) or (self.base is not None
                                         and not issubclass(cls, self.base)):
            base = self.base.__qualname__ if self.base is not None else "Component"
            raise ConfigError(f"{source} is not a {base} subclass")
        name = getattr(cls, "name", "")
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise ConfigError(f"{source} needs a lower-case `name` (letters, digits, - and _), "
                              f"got {name!r}")
        if not isinstance(getattr(cls, "label", None), str) or not cls.label:
            raise ConfigError(f"{source} ({name}) needs a non-empty `label` string")
        if not isinstance(cls.id_version, int) or isinstance(cls.id_version, bool) \
                or cls.id_version < 0:
            raise ConfigError(f"{source} ({name}) needs an integer `id_version` >= 0, got "
                              f"{cls.id_version!r}")
        check_options(cls, source)
        if self.validator is not None:
            self.validator(cls, source)
        return cls

    # --- loading ---------------------------------------------------------------------------
    def _load_builtins(self) -> None:
        if not self._builtins_loaded:
            self._builtins_loaded = True
            importlib.import_module(self.builtins_module)

    def _entries(self) -> dict[str, list[metadata.EntryPoint]]:
        """The group's entry points by name, read from the installed metadata (nothing is
        imported)."""
        if self._entry_points is None:
            found: dict[str, list[metadata.EntryPoint]] = {}
            bad: dict[str, str] = {}
            entries, self._unreadable = group_entries(self.group)
            for entry in entries:
                if (problem := malformed(entry, self.noun)) is None:
                    found.setdefault(entry.name, []).append(entry)
                elif entry.name.strip():  # asking for that name says what is wrong
                    bad.setdefault(entry.name, problem)
                else:
                    self._unreadable.append(problem)
            for name, problem in bad.items():
                if name not in found:
                    self._broken[name] = problem
                    self._loaded.add(name)
            self._entry_points = found
        return self._entry_points

    def _load_plugin(self, name: str) -> None:
        """Import the plugin(s) registered as ``name``, once; failures are kept to report.

        Only what a command asks for is imported: a plugin that breaks — or ends the
        process — while it is imported touches no command that does not use it."""
        self._load_builtins()
        if name in self._loaded:
            return
        self._loaded.add(name)
        entries = self._entries().get(name, [])
        if len(entries) > 1:  # neither is imported: the one found last would win
            self._broken[name] = (
                f"{self.noun} {name!r} is registered by {len(entries)} installed "
                f"distributions ({'; '.join(described(e) for e in entries)}; entry-point "
                f"group {self.group}), so which one runs would depend on the order of "
                "sys.path; uninstall all but one of them")
            return
        for entry in entries:
            self._load_entry(entry)

    def _warn_shadowed(self, name: str) -> None:
        """Say once that plugins registered under the built-in ``name`` are ignored."""
        if name in self._shadow_warned:
            return
        self._shadow_warned.add(name)
        entries = self._entries().get(name, [])
        if entries:
            log.warning("warning: %s's %s %r (%s; entry-point group %s) is shadowed by the "
                        "built-in %s and ignored; rename the plugin's entry point and "
                        "`name` to use it", " and ".join(dist_text(e) for e in entries),
                        self.noun, name, "; ".join(e.value for e in entries), self.group,
                        self.noun)

    def _load_entry(self, entry: metadata.EntryPoint) -> None:
        dist = getattr(entry, "dist", None)
        where = f" of {dist.name} {dist.version}" if dist is not None else ""
        source = (f"{self.noun} plugin {entry.value!r} (entry point {entry.name!r} of "
                  f"group {self.group}{where})")
        try:
            with contextlib.redirect_stdout(sys.stderr):  # what it prints is not our output
                cls = self.validate(entry.load(), source)
        except KeyboardInterrupt:
            raise
        except ConfigError as err:  # the checks' own one line already names the plugin
            text = str(err)
            self._broken[entry.name] = (text if text.startswith(source)
                                        else f"{source} cannot be used: {text}")
            return
        except BaseException as err:  # noqa: BLE001 - a broken plugin must not break the tool
            self._broken[entry.name] = f"{source} cannot be used: {import_failure(err)}"
            return
        if cls.name != entry.name:
            self._broken[entry.name] = (f"{source} names its class {cls.name!r}; the entry "
                                        f"point and the {self.noun}'s `name` must be equal")
        elif cls.name in self._builtin:
            self._broken[entry.name] = (f"{source} would replace the built-in {self.noun} "
                                        f"{cls.name!r}")
        else:
            origin = Origin(builtin=False, distribution=dist.name if dist is not None else None,
                            version=dist.version if dist is not None else None,
                            entry_point=f"{entry.name} = {entry.value}")
            self._plugins[cls.name] = cls
            self._origins[cls.name] = origin
            root, files = plugin_sources(entry)
            self._guests[cls.name] = make_guest(
                f"{self.noun} plugin {cls.name!r} ({origin.text})", root, files,
                scope=cls.__qualname__, family=f"the plugin code of {origin.text}")

    def _load_plugins(self) -> None:
        """Import every installed plugin of the group (for listings)."""
        for name in self._entries():
            self._load_plugin(name)

    def reload(self) -> None:
        """Forget the installed plugins; they are found again when asked for (after
        installing one in this process)."""
        self._plugins.clear()
        self._broken.clear()
        self._guests.clear()
        self._loaded.clear()
        self._shadow_warned.clear()
        self._entry_points = None
        self._unreadable = []
        for name in [n for n, o in self._origins.items() if not o.builtin]:
            del self._origins[name]

    # --- lookups ---------------------------------------------------------------------------
    def _all(self) -> dict[str, type[C]]:
        self._load_builtins()
        self._load_plugins()
        return {**self._builtin, **self._plugins}

    def names(self, *, warn: bool = True) -> list[str]:
        """Every usable name, in listing order (``rank``, then name); broken plugins are
        named in one warning each. Imports every plugin of the axis."""
        members = self._all()
        if warn:
            for message in [*self._unreadable, *self._broken.values()]:
                log.warning("warning: %s", message)
        return sorted(members, key=lambda name: (own_rank(members[name]), name))

    def listed_names(self) -> list[str]:
        """The built-ins in listing order, then the names installed plugins register, without
        importing any plugin (for help texts and the choices of an unknown name). A built-in
        that builds nothing (an architecture's ``unbuildable``: ``own-loop`` only describes
        a Recorder's run) is no choice, so it is not listed."""
        self._load_builtins()
        builtins = sorted((n for n, cls in self._builtin.items() if _builds(cls)),
                          key=lambda n: (own_rank(self._builtin[n]), n))
        return builtins + sorted(n for n in self._entries() if n not in self._builtin)

    def classes(self) -> list[type[C]]:
        """Every usable class, in listing order (imports every plugin of the axis)."""
        members = self._all()
        return [members[name] for name in self.names(warn=False)]

    def offered_classes(self) -> list[type[C]]:
        """:meth:`classes` less those that build nothing (left out of :meth:`listed_names`
        too): the components an error may offer as a choice, e.g. as the readers of an
        option."""
        return [cls for cls in self.classes() if _builds(cls)]

    def builtin_classes(self) -> list[type[C]]:
        """The built-in classes, in listing order (no plugin is imported)."""
        self._load_builtins()
        return sorted(self._builtin.values(), key=lambda cls: (own_rank(cls), cls.name))

    def get(self, name: str) -> type[C]:
        """The class called ``name``; a one-line ConfigError naming the choices (or what is
        wrong with the plugin of that name) otherwise. Imports only the plugin asked for. A
        command asks here for what it uses: plugins ignored because a built-in has their
        name are said here, once (not by :meth:`find`'s look-ups for records and
        defaults)."""
        cls = self._resolve(name)
        if name in self._builtin:
            self._warn_shadowed(name)
        return cls

    def find(self, name: str) -> type[C] | None:
        """The class called ``name``, or None (e.g. a record of a plugin not installed)."""
        try:
            return self._resolve(name)
        except ConfigError:
            return None

    def _resolve(self, name: str) -> type[C]:
        self._load_builtins()
        if name in self._builtin:
            return self._builtin[name]
        self._load_plugin(name)
        if name in self._plugins:
            return self._plugins[name]
        if name in self._broken:
            raise ConfigError(self._broken[name])
        unread = "".join(f"; {text}" for text in self._unreadable)  # one may register it
        raise ConfigError(f"{self.key}={name!r} is not a known {self.noun}; choose one of "
                          f"{', '.join(self.listed_names())} ({self.noun}s of other "
                          f"packages register through the entry-point group {self.group})"
                          f"{unread}")

    def origin(self, name: str) -> Origin | None:
        """Where ``name`` comes from (None when it is not installed)."""
        return self._origins.get(name) if self.find(name) is not None else None

    def guest(self, name: str) -> Guest | None:
        """The plugin ``name`` as a guest (its code's files and digest, how to name it in
        messages); None for a built-in or a name not installed."""
        return self._guests.get(name) if self.find(name) is not None else None

    def broken(self) -> dict[str, str]:
        """Entry-point name → why that plugin cannot be used (imports every plugin)."""
        self._load_plugins()
        return dict(self._broken)


def own_rank(cls: type) -> int:
    """A class's own ``rank`` (a subclass that sets none is listed as a new component, not
    beside its parent)."""
    rank = cls.__dict__.get("rank", Component.rank)
    return rank if isinstance(rank, int) else Component.rank


RULES: Registry[Any] = Registry("rules", "creditaudit.rules", noun="credit rule",
                                key="method.name", builtins="creditaudit.methods")
ARCHITECTURES: Registry[Any] = Registry("models", "creditaudit.models", noun="architecture",
                                        key="model.arch", builtins="creditaudit.models")
DATASETS: Registry[Any] = Registry("datasets", "creditaudit.datasets", noun="dataset",
                                   key="data.name", builtins="creditaudit.data")
DIAGNOSTICS: Registry[Any] = Registry("diagnostics", "creditaudit.diagnostics",
                                      noun="protocol diagnostic", key="diagnostics.protocol",
                                      builtins="creditaudit.protocol")
REGISTRIES: tuple[Registry[Any], ...] = (RULES, ARCHITECTURES, DATASETS, DIAGNOSTICS)


def reload_plugins() -> None:
    """Reload the plugins of every axis (after installing one in this process)."""
    for registry in REGISTRIES:
        registry.reload()


__all__ = ["Component", "hook", "older_hook", "defines", "options_parameters", "NoOptions",
           "Origin", "Registry", "RULES", "ARCHITECTURES", "DATASETS", "DIAGNOSTICS",
           "REGISTRIES", "NAME_PATTERN", "reload_plugins", "own_rank"]
