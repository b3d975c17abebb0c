"""A component is an instance holding its options; its hooks read ``self.options``.
Components written for the older interface (hooks as classmethods taking the options first)
keep working, called either way."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from creditaudit.config import opt
from creditaudit.registry import Component, defines, hook, older_hook


@dataclass
class WidthOptions:
    width: int = opt(3, "a width", min=1)


class Axis(Component):
    """An axis base like Architecture: two hooks, one calling the other."""

    hooks: ClassVar[tuple[str, ...]] = ("size", "doubled")
    Options = WidthOptions

    def size(self) -> int:
        return 0

    def doubled(self) -> int:
        return 2 * self.size()


class NewStyle(Axis):
    name, label = "new", "New"

    def size(self) -> int:
        return self.options.width


class OldStyle(Axis):
    name, label = "old", "Old"

    @classmethod
    def size(cls, options: Any) -> int:  # the older interface
        return options.width + 100

    @classmethod
    def doubled(cls, options: Any) -> int:
        return 2 * cls.size(options)  # calls another hook the older way


class OldCallsBase(Axis):
    """An older hook beside one inherited from the (new-style) base."""

    name, label = "old-base", "Old base"

    @classmethod
    def size(cls, options: Any) -> int:
        return options.width


def test_hooks_become_instance_methods_reading_the_options() -> None:
    assert isinstance(Axis.__dict__["size"], hook)
    assert isinstance(NewStyle.__dict__["size"], hook)
    component = NewStyle(WidthOptions(width=7))
    assert component.size() == 7 and component.doubled() == 14
    assert NewStyle().size() == 3  # the defaults
    assert repr(component) == "NewStyle(width=7)"


def test_older_classmethod_hooks_work_called_either_way() -> None:
    assert isinstance(OldStyle.__dict__["size"], older_hook)
    component = OldStyle(WidthOptions(width=1))
    assert component.size() == 101 and component.doubled() == 202
    assert OldStyle.size(WidthOptions(width=2)) == 102  # the older call itself


def test_an_older_call_of_a_new_hook_builds_the_component_and_warns() -> None:
    with pytest.warns(DeprecationWarning, match=r"NewStyle\(options\)\.doubled"):
        assert NewStyle.doubled(WidthOptions(width=5)) == 10
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the base's hook on an instance calls the older one
        assert OldCallsBase(WidthOptions(width=4)).doubled() == 8
    with pytest.warns(DeprecationWarning):
        assert OldCallsBase.doubled(WidthOptions(width=4)) == 8


def test_defines_tells_an_implemented_hook_from_an_inherited_one() -> None:
    assert defines(NewStyle, "size", Axis) and defines(OldStyle, "doubled", Axis)
    assert not defines(NewStyle, "doubled", Axis)
