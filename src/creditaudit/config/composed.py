"""Config sections that carry the options of the component they select.

``[method]`` selects a credit rule by ``name``, ``[model]`` an architecture by ``arch`` and
``[data]`` a dataset by ``name``; each such component declares its own ``Options``
dataclass (:class:`creditaudit.registry.Component`). The section a config holds is a
dataclass composed of the section's common keys plus those options — e.g. for EP,
``MethodConfig`` + ``ep_beta``, ``ep_steps``, … — so ``config.method.ep_beta`` reads like any
other key, a TOML file and ``--set`` set it as ``method.ep_beta``, and validation uses the
same :func:`~creditaudit.config.sections.opt` metadata.

Constructing a section names its component: ``MethodConfig(name="ep", ep_beta=0.05)``
builds the composed section of EP (an instance of a subclass of :class:`MethodConfig`).
Sections of components that are not installed here (a record written with a plugin) keep
their keys as they were written, unvalidated (:func:`unresolved_section`).
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any, ClassVar

from creditaudit.config.sections import (
    DataConfig,
    DiagnosticsConfig,
    MethodConfig,
    ModelConfig,
)
from creditaudit.errors import ConfigError
from creditaudit.registry import ARCHITECTURES, DATASETS, DIAGNOSTICS, RULES, Registry

# section → (the key that selects the component, the registry it comes from)
SELECTORS: dict[str, tuple[str, Registry[Any]]] = {
    "data": ("name", DATASETS), "model": ("arch", ARCHITECTURES), "method": ("name", RULES)}
BASES: dict[str, type] = {"data": DataConfig, "model": ModelConfig, "method": MethodConfig}


def section_of(base: type) -> str:
    return next(name for name, cls in BASES.items() if cls is base)


@functools.cache
def composed_class(section: str, component: type) -> type:
    """The section's dataclass with ``component``'s options added (cached per class)."""
    base = BASES[section]
    hints = typing.get_type_hints(component.Options)
    common = {f.name for f in dataclasses.fields(base)}
    fields = []
    for f in dataclasses.fields(component.Options):
        if f.name in common:
            raise ConfigError(f"{component.__qualname__} ({component.name}): option {f.name!r} "
                              f"is a common key of [{section}]; rename it")
        _refuse_unwritable_none(component, section, f, hints[f.name])
        copied = dataclasses.field(default=f.default, default_factory=f.default_factory,
                                   metadata=f.metadata)
        fields.append((f.name, hints[f.name], copied))
    cls = dataclasses.make_dataclass(
        f"{component.__name__}{base.__name__}", fields, bases=(base,),
        namespace={"component": component, "__reduce__": _reduce,
                   "__module__": base.__module__})
    cls.__qualname__ = cls.__name__
    return cls


def _refuse_unwritable_none(component: type, section: str, f: dataclasses.Field,
                            tp: Any) -> None:
    """ConfigError for an option that may be None but defaults to something else: a run
    setting it to None could not be written to its ``config.toml`` (TOML has no null; a
    None is left out) and would rerun with the default, another run."""
    default = f.default
    if default is None or default is dataclasses.MISSING \
            or type(None) not in typing.get_args(tp):
        return
    raise ConfigError(f"{component.__qualname__} ({component.name}): option "
                      f"{section}.{f.name} may be None but defaults to {default!r}, so a run "
                      "setting it to None could not be written to its config.toml (TOML has "
                      "no null); make None its default (and read None as "
                      f"{default!r}), or drop None from its type")


@functools.cache
def unresolved_class(section: str, name: str, keys: tuple[str, ...]) -> type:
    """A section for a component that is not installed: its keys kept as written (no
    type, no validation)."""
    base = BASES[section]
    common = {f.name for f in dataclasses.fields(base)}
    fields = [(k, Any, dataclasses.field(default=None, metadata={"help": "", "role": "compute"}))
              for k in keys if k not in common]
    cls = dataclasses.make_dataclass(
        f"Unresolved{base.__name__}", fields, bases=(base,),
        namespace={"component": None, "__reduce__": _reduce, "__module__": base.__module__})
    return cls


def _reduce(self: Any) -> tuple[Any, tuple[Any, ...]]:
    """Pickle a composed section by what rebuilds it (its class is made at run time)."""
    section = section_of(_base_of(type(self)))
    return rebuild_section, (section, dataclasses.asdict(self))


def _base_of(cls: type) -> type:
    return next(base for base in cls.__mro__ if base in BASES.values())


def rebuild_section(section: str, values: dict[str, Any]) -> Any:
    """The section of ``values`` (the inverse of ``dataclasses.asdict``)."""
    key, registry = SELECTORS[section]
    base = BASES[section]
    name = values.get(key, _default(base, key))
    component = registry.find(name)
    if component is None:
        cls = unresolved_class(section, name, tuple(values))
    else:
        cls = composed_class(section, component)
    return cls(**values)


def _default(base: type, key: str) -> Any:
    return next(f.default for f in dataclasses.fields(base) if f.name == key)


# --- the diagnostics section: one table of options per diagnostic of the protocol -----------
def check_distinct(names: Any) -> None:
    """ConfigError (one line) when ``names`` (a protocol's diagnostics) lists one twice."""
    seen: set[Any] = set()
    for name in names:
        if name in seen:
            raise ConfigError(f"diagnostics.protocol lists {name!r} twice: list each "
                              "diagnostic once")
        seen.add(name)


def protocol_names(given: Any) -> tuple[str, ...]:
    """The protocol a diagnostics section selects: ``protocol`` when given, else every
    built-in diagnostic of the default protocol (a plugin joins by being listed)."""
    if given:
        check_distinct(given)
        return tuple(given)
    return tuple(cls.name for cls in DIAGNOSTICS.builtin_classes()
                 if getattr(cls, "default", False))


def diagnostics_class(names: tuple[str, ...], strict: bool = True) -> type:
    """DiagnosticsConfig plus one field per diagnostic of ``names`` that has options (its
    ``Options`` dataclass, default its defaults). Diagnostics not installed here are left
    out (records only; ``strict`` raises the registry's one-line error)."""
    if strict:
        for name in names:
            DIAGNOSTICS.get(name)
    found = (DIAGNOSTICS.find(n) for n in names)
    return _diagnostics_class(tuple(cls for cls in found if cls is not None))


@functools.cache
def _diagnostics_class(classes: tuple[type, ...]) -> type:
    """Cached by the classes, not their names: a name may be served by another class after
    plugins are reloaded."""
    fields = []
    names = tuple(cls.name for cls in classes)
    for name, cls in zip(names, classes):
        if not dataclasses.fields(cls.Options):
            continue
        fields.append((name, cls.Options, dataclasses.field(
            default_factory=cls.Options,
            metadata={"help": f"options of diagnostic ({name}), {cls.label}",
                      "role": "compute", "options_of": cls})))
    cls = dataclasses.make_dataclass(
        f"DiagnosticsConfig_{'_'.join(names)}", fields, bases=(DiagnosticsConfig,),
        namespace={"__reduce__": _reduce_diagnostics, "__module__": DiagnosticsConfig.__module__})
    return cls


def _reduce_diagnostics(self: Any) -> tuple[Any, tuple[Any, ...]]:
    return rebuild_diagnostics, (dataclasses.asdict(self),)


def rebuild_diagnostics(values: dict[str, Any]) -> Any:
    """The diagnostics section of ``values`` (the inverse of ``dataclasses.asdict``)."""
    names = protocol_names(values.get("protocol"))
    cls = diagnostics_class(names, strict=False)
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in known:
            continue
        options = known[key].metadata.get("options_of")
        kwargs[key] = options.Options(**value) if options is not None and isinstance(
            value, dict) else value
    return cls(**kwargs)


def component_of(section: Any) -> type | None:
    """The component class a composed section belongs to (None: not installed here)."""
    return getattr(type(section), "component", None)


def _new_section(cls: type, *args: Any, **kwargs: Any) -> Any:
    """``MethodConfig(name="ep", ep_beta=…)`` → an instance of EP's composed section;
    ``DiagnosticsConfig(…)`` → the section with its protocol's option tables."""
    if cls is DiagnosticsConfig and not args:
        return object.__new__(diagnostics_class(protocol_names(kwargs.get("protocol"))))
    if cls in BASES.values() and not args:
        section = section_of(cls)
        key, registry = SELECTORS[section]
        name = kwargs.get(key, _default(cls, key))
        component = registry.find(name) if isinstance(name, str) else None
        if component is not None:
            cls = composed_class(section, component)
    return object.__new__(cls)


for _base in (*BASES.values(), DiagnosticsConfig):
    _base.__new__ = _new_section  # type: ignore[assignment,method-assign]
    _base.component = None  # type: ignore[attr-defined]


def bind(component: type, section: str, **values: Any) -> Any:
    """The composed section of ``component`` (which need not be registered: e.g. a plugin
    class under test) with ``values``."""
    key, _ = SELECTORS[section]
    return composed_class(section, component)(**{key: component.name, **values})


ComponentAttr = ClassVar[type | None]

__all__ = ["SELECTORS", "BASES", "composed_class", "unresolved_class", "component_of",
           "rebuild_section", "bind"]
