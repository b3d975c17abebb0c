"""The built-in rules are siblings: no registered rule is a strict subclass of another.

A rule that subclassed another (DRTP(DFA), Frozen(BP) once) inherited whatever the parent
learnt later — a capability, a shortcut keyed on the class — without saying so. What two
rules share lives in an abstract parent that is no rule of its own.
"""

from __future__ import annotations

import pytest

from creditaudit.methods import BP, DFA, BackpropRule, DirectFeedbackRule, Frozen
from creditaudit.methods.drtp import DRTP
from creditaudit.registry import RULES


def builtin_rules() -> list[type]:
    return RULES.builtin_classes()


@pytest.mark.parametrize("cls", builtin_rules(), ids=lambda cls: cls.name)
def test_no_builtin_rule_subclasses_another(cls):
    registered = set(builtin_rules())
    parents = [base for base in cls.__mro__[1:] if base in registered]
    assert not parents, (f"{cls.__qualname__} subclasses the registered rule(s) "
                         f"{[p.__qualname__ for p in parents]}; share code in an abstract "
                         "parent instead")


def test_shared_parents_are_not_rules():
    names = {cls.name for cls in builtin_rules()}
    for parent in (BackpropRule, DirectFeedbackRule):
        assert parent not in builtin_rules()
        assert getattr(parent, "name", "") not in names
    assert issubclass(BP, BackpropRule) and issubclass(Frozen, BackpropRule)
    assert issubclass(DFA, DirectFeedbackRule) and issubclass(DRTP, DirectFeedbackRule)
