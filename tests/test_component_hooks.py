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


class Judge(Component):
    """An axis base like ProtocolDiagnostic, whose older hooks took the options second."""

    hooks: ClassVar[tuple[str, ...]] = ("judge", "limit", "wider")
    older_options: ClassVar[dict[str, int]] = {"judge": 1}
    Options = WidthOptions

    def limit(self) -> int:
        return self.options.width

    def judge(self, value: int, reason: str = "") -> tuple[bool, str]:
        return value > self.limit(), reason

    def wider(self, by: int) -> Judge:
        return type(self)(WidthOptions(width=self.options.width + by))


class OlderJudge(Judge):
    name, label = "older-judge", "Older judge"

    @classmethod
    def judge(cls, value: int, options: Any, reason: str = "") -> tuple[bool, str]:
        return value > options.width + 10, f"older {reason}"


def test_an_older_hook_gets_the_options_where_the_axis_says_it_took_them() -> None:
    assert isinstance(OlderJudge.__dict__["judge"], older_hook)
    component = OlderJudge(WidthOptions(width=1))
    assert component.judge(12, "x") == (True, "older x")  # (cls, 12, options, "x")
    assert component.judge(11) == (False, "older ")
    assert component.judge(value=12, reason="k") == (True, "older k")  # options by keyword
    assert OlderJudge.judge(12, WidthOptions(width=5), "y") == (False, "older y")


def test_a_new_hook_called_the_older_way_takes_the_options_from_their_place() -> None:
    with pytest.warns(DeprecationWarning, match=r"Judge\.judge\(…, options, …\)"):
        assert Judge.judge(4, WidthOptions(width=3), "r") == (True, "r")
    with pytest.warns(DeprecationWarning):
        assert Judge.judge(2, "s", options=WidthOptions(width=3)) == (False, "s")
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match="needs its options"):
        Judge.judge(2)
    # The older interface dealt in options: a component returned comes back as its options.
    with pytest.warns(DeprecationWarning):
        assert Judge.wider(WidthOptions(width=3), 2) == WidthOptions(width=5)
    assert Judge(WidthOptions(width=3)).wider(2).limit() == 5
