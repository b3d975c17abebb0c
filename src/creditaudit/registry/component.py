"""What every pluggable class is: a :class:`Component` — a self-describing class whose
instances hold their options — and the :class:`hook` methods an axis calls on it.

:mod:`creditaudit.registry` finds components by name; this module says what one is.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import (
    Any,
    ClassVar,
    Concatenate,
    Generic,
    ParamSpec,
    TypeVar,
    cast,
    get_args,
    get_origin,
    overload,
)

from creditaudit.errors import ConfigError


@dataclass(frozen=True)
class NoOptions:
    """The options of a component that has none of its own."""


class Component:
    """What every pluggable class declares (see the module docstring).

    ``Options`` is a dataclass whose fields are declared with
    :func:`creditaudit.config.opt` (a default and help text at least); a config file,
    ``--set`` and sweep grids set them as keys of the component's config section
    (``method.ep_beta``, ``model.d``, ``data.n_train``). ``rank``: listings order (lower
    first, ties by name).

    ``Options`` is declared once, as the parameter of the axis base
    (``class MyArch(Architecture[MyOptions])``), which also types ``self.options``;
    ``Options = MyOptions`` in the class body works too.

    A component is used as an instance holding its options, as a scikit-learn estimator
    holds its parameters: ``ResMLPArchitecture(config.model).build(input_shape=(40,),
    n_classes=10)``; the methods an axis calls on it (its ``hooks``) read ``self.options``.
    Components written for the older interface — those methods as classmethods taking the
    options (first, unless the axis's ``older_options`` says where) — keep working
    (:class:`older_hook`).
    """

    name: ClassVar[str] = ""
    label: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions
    id_version: ClassVar[int] = 0
    rank: ClassVar[int] = 100
    # For keys a user may expect the component to read but it does not: what to do instead.
    # A hint may be an Option (creditaudit.caller): spelled for the caller when formatted.
    hints: ClassVar[dict[str, object]] = {}
    # The methods the axis calls on an instance (each reads ``self.options``).
    hooks: ClassVar[tuple[str, ...]] = ()
    # Where the older, classmethod spelling of a hook took its options: the index of that
    # parameter after ``cls``, by hook name (a hook not named took them first).
    older_options: ClassVar[dict[str, int]] = {}

    options: Any

    def __init__(self, options: Any = None) -> None:
        """``options``: the component's config section (``config.model``, ``config.data``,
        ``config.diagnostics.a``), an ``Options`` instance, or None for the defaults."""
        self.options = self.Options() if options is None else options

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Take ``Options`` from the base's parameter (``CreditRule[MyOptions]``) when the
        class body does not set it; make every hook the class defines an instance method
        (:class:`hook`), one written as a classmethod taking the options an
        :class:`older_hook`."""
        super().__init_subclass__(**kwargs)
        named = options_parameters(cls)
        if len(named) == 1 and "Options" not in cls.__dict__:
            cls.Options = named[0]
        for name in cls.hooks:
            value = cls.__dict__.get(name)
            at = cls.older_options.get(name, 0)
            if isinstance(value, classmethod):
                setattr(cls, name, older_hook(value.__func__, at))
            elif isinstance(value, types.FunctionType):
                setattr(cls, name, hook(value, at))

    def __repr__(self) -> str:
        names = [n for n in self.option_names() if hasattr(self.options, n)]
        values = ", ".join(f"{n}={getattr(self.options, n)!r}" for n in names)
        return f"{type(self).__name__}({values})"

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """The names of the component's own options, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls.Options))

    @classmethod
    def options_from(cls, values: Any) -> Any:
        """An ``Options`` instance from any object carrying those attributes (a config
        section) or a mapping; options it lacks take their defaults."""
        names = cls.option_names()
        if isinstance(values, dict):
            given = {k: values[k] for k in names if k in values}
        else:
            given = {k: getattr(values, k) for k in names if hasattr(values, k)}
        return cls.Options(**given)


def options_parameters(cls: type) -> tuple[type, ...]:
    """The ``Options`` types ``cls`` names as the parameter of a component class among its
    own bases (``class EP(CreditRule[EPOptions])`` → ``(EPOptions,)``); empty when it names
    none (it inherits its parent's, or sets ``Options`` in its body). More than one is a
    mistake the registries refuse."""
    found: list[type] = []
    for parent in cls.__dict__.get("__orig_bases__", ()):
        origin = get_origin(parent)
        if isinstance(origin, type) and issubclass(origin, Component):
            found += [a for a in get_args(parent)[:1] if isinstance(a, type) and a not in found]
    return tuple(found)


S = TypeVar("S", bound=Component)
P = ParamSpec("P")
R = TypeVar("R")


class hook(Generic[S, P, R]):
    """A method of a component that reads its options (an axis's ``hooks``).

    On an instance it is the method. Reached through the class — how code written for the
    older interface calls it, ``Spec.n_classes(options)``, ``Diag.judge(value, options,
    reason)`` — it takes the options where the older spelling had them (``at``: their index
    among the arguments, or the keyword ``options``), builds the component from them and
    calls the method there, with a DeprecationWarning that names the newer spelling. The
    older interface knew no instances: a component the method returns is given back as its
    options (``Diag.with_threshold(options, t)``).
    """

    def __init__(self, method: Callable[Concatenate[S, P], R], at: int = 0) -> None:
        self.method = method
        self.name = method.__name__
        self.at = at
        self.__doc__ = method.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type[S]) -> Callable[..., R]: ...
    @overload
    def __get__(self, obj: S, owner: type[S] | None = None) -> Callable[P, R]: ...
    def __get__(self, obj: S | None, owner: type[S] | None = None) -> Callable[..., R]:
        if obj is not None:
            return types.MethodType(self.method, obj)
        component = cast("type[S]", owner if owner is not None else Component)
        older = "options, …" if self.at == 0 else "…, options, …"

        def older_call(*args: Any, **kwargs: Any) -> R:
            warnings.warn(f"{component.__qualname__}.{self.name}({older}) is the older "
                          f"spelling of {component.__qualname__}(options).{self.name}(…)",
                          DeprecationWarning, stacklevel=2)
            if "options" in kwargs:
                options = kwargs.pop("options")
            elif len(args) > self.at:
                options, args = args[self.at], args[:self.at] + args[self.at + 1:]
            else:
                raise TypeError(f"{component.__qualname__}.{self.name}() called the older "
                                "way needs its options")
            result = self.method(component(options), *args, **kwargs)
            return cast("R", result.options) if isinstance(result, Component) else result
        return older_call


class older_hook(Generic[R]):
    """A hook written for the older interface: a classmethod taking the options (``def
    build(cls, options, *, input_shape, n_classes)``; ``def evaluate(cls, evidence,
    options)``: ``at`` = 1). Called on an instance, it receives the instance's options at
    that place (by keyword when fewer arguments come before it); through the class, it is
    the classmethod it was."""

    def __init__(self, function: Callable[..., R], at: int = 0) -> None:
        self.function = function
        self.at = at
        parameters = list(inspect.signature(function).parameters)[1:]  # after cls
        self.keyword = parameters[at] if at < len(parameters) else "options"
        functools.update_wrapper(self, function)

    def __get__(self, obj: Component | None, owner: type | None = None) -> Callable[..., R]:
        if obj is None:
            return types.MethodType(self.function, owner)
        cls, options, at = type(obj), obj.options, self.at
        if at == 0:
            return functools.partial(self.function, cls, options)

        def call(*args: Any, **kwargs: Any) -> R:
            if len(args) < at:
                return self.function(cls, *args, **{self.keyword: options}, **kwargs)
            return self.function(cls, *args[:at], options, *args[at:], **kwargs)
        return call


def defines(cls: type, name: str, base: type) -> bool:
    """Whether ``cls`` (or a class between it and ``base``) defines ``name`` itself rather
    than inheriting ``base``'s: what a validator asks of a hook a component must
    implement."""
    for klass in cls.__mro__:
        if klass is base:
            return False
        if name in klass.__dict__:
            return True
    return False


def check_options(cls: type, source: str) -> None:
    """``Options`` must be a dataclass whose every field has a default and help text,
    declared once: the parameter of its base (``CreditRule[MyOptions]``) or the class
    body's ``Options``, not two that disagree."""
    options = getattr(cls, "Options", None)
    if not (isinstance(options, type) and dataclasses.is_dataclass(options)):
        raise ConfigError(f"{source} ({cls.name}): `Options` must be a dataclass")
    named = options_parameters(cls)
    if len(named) > 1:
        raise ConfigError(f"{source} ({cls.name}) names {len(named)} Options types as "
                          f"parameters of its bases ({', '.join(t.__qualname__ for t in named)})"
                          "; name one")
    if named and not issubclass(options, named[0]):
        raise ConfigError(f"{source} ({cls.name}) sets Options = {options.__qualname__} but "
                          f"its base is parameterised by {named[0].__qualname__}; declare "
                          "the options once, as that parameter")
    for f in dataclasses.fields(options):
        missing = (f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING)
        if missing or not f.metadata.get("help"):
            raise ConfigError(f"{source} ({cls.name}): option {f.name!r} needs a default and "
                              "help text: declare it with creditaudit.config.opt(default, "
                              "help, …)")

__all__ = ["Component", "NoOptions", "hook", "older_hook", "defines", "options_parameters",
           "check_options"]
