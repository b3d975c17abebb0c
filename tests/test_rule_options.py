"""A rule reads ``self.options``, typed by its own ``Options`` (the parameter of its base).

Every built-in rule names its options class once, in its own class line
(``class DFA(DirectFeedbackRule[LocalFeedbackOptions])``); ``Options`` is taken from there, and
``self.options`` is the ``[method]`` section it was built with: those fields plus the keys
every rule reads (``penalty``, declared by ``RuleOptions``). ``self.config`` is the older name
of the same object, and ``Options = …`` in a class body (plugins written against earlier
docs) keeps working.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest

from creditaudit.config import bind, opt
from creditaudit.errors import ConfigError
from creditaudit.methods import DFA, CreditRule, build_rule
from creditaudit.methods.base import FeedbackOptions, LocalOptions, RuleOptions, ScaleOptions
from creditaudit.methods.feedback import FixedFeedbackRule, LocalFeedbackOptions
from creditaudit.methods.linear_feedback import LinearFeedbackRule
from creditaudit.methods.registry import validate_rule_class
from creditaudit.registry import RULES
from creditaudit.testing.common import CLASSES, tiny_model

METHODS = Path(__file__).resolve().parents[1] / "src" / "creditaudit" / "methods"


def builtin_rules() -> list[type]:
    return RULES.builtin_classes()


def non_defaults(options: type) -> dict[str, object]:
    """A value other than the default for every option that has an obvious one (numbers and
    flags), so a rule that reads an option from elsewhere would see the wrong value."""
    values: dict[str, object] = {}
    for f in dataclasses.fields(options):
        if isinstance(f.default, bool):
            values[f.name] = not f.default
        elif isinstance(f.default, int) and f.metadata.get("max") is None:
            values[f.name] = f.default + 1
        elif isinstance(f.default, float):
            high = f.metadata.get("max")
            values[f.name] = f.default / 2 if high is not None else f.default * 2 + 0.5
    return values


@pytest.mark.parametrize("cls", builtin_rules(), ids=lambda cls: cls.name)
def test_builtin_rule_names_its_options_in_its_class_line(cls):
    """Statically: the parameter of the rule's own base is its Options, a RuleOptions (so
    ``self.options.penalty`` is typed too)."""
    named = [typing.get_args(base)[0] for base in cls.__dict__.get("__orig_bases__", ())
             if typing.get_args(base)]
    assert named, f"{cls.__qualname__} names no Options type as its base's parameter"
    assert all(t is cls.Options for t in named), (cls.Options, named)
    assert not re.search(r"^\s+Options\b.*=", inspect.getsource(cls), re.M), \
        "declared twice: the parameter and `Options = …`"
    assert issubclass(cls.Options, RuleOptions)


@pytest.mark.parametrize("cls", builtin_rules(), ids=lambda cls: cls.name)
def test_rule_options_carry_its_fields_and_the_common_keys(cls):
    # a baseline trains no block, so it refuses the penalty (check_options)
    values = {**non_defaults(cls.Options), **({} if cls.baseline else {"penalty": 1e-3})}
    section = bind(cls, "method", **values)
    rule = build_rule(tiny_model(), section, n_classes=CLASSES, seed=0, cls=cls)
    assert rule.options is section
    assert rule.config is rule.options  # the older name: the same object
    for f in dataclasses.fields(cls.Options):
        assert getattr(rule.options, f.name) == getattr(section, f.name)
    for name, value in values.items():
        assert getattr(rule.options, name) == value, name
    assert cls.options_from(rule.options) == cls.Options(**{
        k: v for k, v in values.items() if k in cls.option_names()})


def test_builtin_rules_read_options_one_way():
    """Inside the built-in rules an option is read as ``options.<key>``, never through the
    older ``config`` name (nor the raw ``config`` argument of ``__init__``)."""
    found = []
    for path in sorted(METHODS.glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\b(self|rule)\.config\.|(?<![.\w])config\.(?!name\b|trainable_b)",
                         line) and not re.search(r"def config|@config\.setter", line):
                found.append(f"{path.name}:{number}: {line.strip()}")
    # build_rule (methods/__init__.py) reads the section before any rule exists.
    found = [f for f in found if not f.startswith("__init__.py")]
    assert not found, found


# --- the declaration ----------------------------------------------------------------------
@dataclass
class WidthOptions(LocalOptions):
    width: int = opt(3, "a width", min=1)


@dataclass
class WiderOptions(WidthOptions):
    extra: float = opt(0.5, "another option", min=0.0)


class _Rule(CreditRule[WidthOptions]):
    name = "typed-rule"
    label = "Typed rule"
    credit_formula = "a_l = g_l"


@dataclass
class MaybeGainOptions(LocalOptions):
    gain: float | None = opt(1.0, "a gain; None: no gain")


class _MaybeGainRule(CreditRule[MaybeGainOptions]):
    name = "maybe-gain"
    label = "Maybe gain"
    credit_formula = "a_l = g_l"


def test_an_option_that_may_be_none_but_defaults_to_a_value_is_refused():
    # Set to None, it was left out of the run's config.toml (TOML has no null), which then
    # reran with the default 1.0: another run.
    with pytest.raises(ConfigError, match=r"_MaybeGainRule \(maybe-gain\): option "
                       r"method.gain may be None but defaults to 1.0"):
        bind(_MaybeGainRule, "method", gain=None)


def test_options_come_from_the_parameter_and_types_self_options():
    assert _Rule.Options is WidthOptions
    assert _Rule.option_names() == ("normalise_credit", "width")
    validate_rule_class(_Rule, "test rule")
    rule = _Rule(tiny_model(), bind(_Rule, "method", width=7), n_classes=CLASSES,
                 generator=None)
    assert rule.options.width == 7 and rule.config.width == 7
    assert rule.options.penalty == 0.0


def test_class_body_options_still_work_and_subclasses_inherit():
    class OldStyle(CreditRule):
        name, label, credit_formula = "old-style", "Old", "a_l = g_l"
        Options = WidthOptions

    class Sub(_Rule):  # names nothing: its parent's options
        name = "sub-rule"

    class Narrowed(_Rule):  # a subclass of the parameter: still typed as the parent says
        name = "narrowed"
        Options = WiderOptions

    for cls, options in ((OldStyle, WidthOptions), (Sub, WidthOptions),
                         (Narrowed, WiderOptions)):
        assert validate_rule_class(cls, "test rule") is cls
        assert cls.Options is options
    assert DFA.Options is LocalFeedbackOptions


def test_config_setter_keeps_one_object():
    rule = _Rule(tiny_model(), bind(_Rule, "method"), n_classes=CLASSES, generator=None)
    other = bind(_Rule, "method", width=9)
    rule.config = other  # a plugin written against the older name may assign it
    assert rule.options is other and rule.config is other


def test_contradicting_options_are_refused_in_one_line():
    class Contradicts(CreditRule[WidthOptions]):
        name, label, credit_formula = "contradicts", "C", "a_l = g_l"
        Options = ScaleOptions

    with pytest.raises(ConfigError) as err:
        validate_rule_class(Contradicts, "credit rule plugin 'x'")
    message = str(err.value)
    assert "\n" not in message
    assert "Options = ScaleOptions" in message and "WidthOptions" in message

    class Two(FixedFeedbackRule[LocalFeedbackOptions], LinearFeedbackRule[FeedbackOptions]):
        name, label, credit_formula = "two", "Two", "a_l = g_l"

    with pytest.raises(ConfigError, match="names 2 Options types"):
        validate_rule_class(Two, "credit rule plugin 'two'")


def test_the_rule_says_which_seed_its_generator_is_drawn_from() -> None:
    """The seed of a rule's generator is the rule's to say (its own ``feedback_seed``, else
    the run seed), not read from the section by whoever builds it; a rule that draws nothing
    has none — and building the rule uses exactly that seed."""
    from creditaudit.config import config_from_dict

    def section(name: str, **options: object) -> object:
        return config_from_dict({"method": {"name": name, **options}}).method

    assert RULES.get("fa").generator_seed(section("fa"), 7) == 7
    assert RULES.get("fa").generator_seed(section("fa", feedback_seed=3), 7) == 3
    assert RULES.get("bp").generator_seed(section("bp"), 7) is None

    def feedback(run_seed: int, **options: object) -> list[object]:
        rule = build_rule(tiny_model(), section("dfa", **options), n_classes=CLASSES,
                          seed=run_seed)
        return list(rule.feedback)  # B_0 … B_L

    own_7, own_9 = feedback(7, feedback_seed=3), feedback(9, feedback_seed=3)
    assert own_7 and all(a.equal(b) for a, b in zip(own_7, own_9, strict=True))
    assert not all(a.equal(b) for a, b in zip(feedback(7), feedback(9), strict=True))
