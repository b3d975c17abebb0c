"""What a shipped experiment is, and the registry of them.

An :class:`Experiment` names a question, builds its run configs at a scale (always
``scales.base_config(scale, …)`` plus a few overrides, so runs are shared between
experiments and with ``creditaudit sweep`` whenever settings coincide), summarises the run
records into a JSON-able dict, and renders that summary as Markdown. Summaries read run
records only — never a live model — so they can be recomputed from files at any time.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from creditaudit.config import RunConfig
from creditaudit.errors import ConfigError
from creditaudit.records import RunRecord
from creditaudit.registry import RULES
from creditaudit.results import stopped_early_note
from creditaudit.study.experiments.configs import arch_of
from creditaudit.study.experiments.marks import footnotes, judgements_of
from creditaudit.study.experiments.options import chosen
from creditaudit.study.experiments.scales import get_scale
from creditaudit.sweep import dedupe

# The order `all` runs and lists them in.
ORDER = ("audit_table", "random_init", "decision_utility", "threshold_sensitivity",
         "temporal", "penalty_sweep", "capacity_cost", "fresh_null", "depth_ladder",
         "rule_zoo")

ConfigsFn = Callable[..., list[RunConfig]]
SummariseFn = Callable[[list[RunRecord], "Choices"], dict[str, Any]]
MarkdownFn = Callable[[dict[str, Any]], str]
OPTIONS = ("rules", "arch")  # what a user may choose instead of an experiment's own lists


def as_names(value: str | Sequence[str]) -> tuple[str, ...]:
    """Names given as one str (one name) or a sequence of them, as a tuple."""
    return (value,) if isinstance(value, str) else tuple(value)


@dataclass(frozen=True)
class Choices:
    """What a user chose instead of an experiment's own lists: ``rules`` (registered credit
    rule names, plugins included) and ``archs`` (architecture variants: a registered
    architecture's name, or ``NAME-noLN`` for one without its terminal LayerNorm); None
    keeps the experiment's. Each is a sequence of names, or one name as a str (as
    ``adapt(states=...)`` takes one: ``rules="dfa"`` is ``("dfa",)``, never its letters);
    stored as a tuple."""

    rules: tuple[str, ...] | None = None
    archs: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for option in ("rules", "archs"):
            value = getattr(self, option)
            if value is not None:
                object.__setattr__(self, option, as_names(value))

    def given(self) -> list[str]:
        """The options chosen (``rules``, ``arch``)."""
        return [option for option, value in zip(OPTIONS, (self.rules, self.archs))
                if value is not None]

    def tag(self) -> str:
        """``rules=dfa,kp.arch=vit``: what tells this choice's summary apart ("" for the
        experiment's own lists)."""
        parts = [f"{option}={','.join(value)}"
                 for option, value in zip(OPTIONS, (self.rules, self.archs))
                 if value is not None]
        return ".".join(parts)

    def to_dict(self) -> dict[str, list[str] | None]:
        return {"rules": None if self.rules is None else list(self.rules),
                "archs": None if self.archs is None else list(self.archs)}


NO_CHOICES = Choices()


@dataclass(frozen=True)
class Experiment:
    """A shipped experiment.

    ``question``: what it answers (one sentence). ``needs``: the runs it trains, in words.
    ``build_configs(scale, *, dataset, data_dir, out_dir, choices)`` → run configs;
    ``summarise_fn(records, choices)`` → JSON-able summary (finished records, any order);
    ``markdown_fn(summary)`` → Markdown body. ``takes``: option (``rules``, ``arch``) →
    what choosing it replaces, in words; any other option is refused with the reason in
    ``refuses`` (default: the experiment has no such axis). ``one_arch``: ``--arch`` names
    exactly one architecture (the experiment runs on one). ``in_all``: whether ``all`` runs
    it (False for one run by name only, such as the literature reproduction, which trains
    datasets and networks of its own for hours). ``means``: whether its summary averages
    end-of-run values over seeds; a run that stopped early is left out of those means, and
    the summary's ``stopped_early`` (printed under its tables) names it in the report's
    words.
    """

    name: str
    question: str
    needs: str
    build_configs: ConfigsFn
    summarise_fn: SummariseFn
    markdown_fn: MarkdownFn
    takes: Mapping[str, str] = field(default_factory=dict)
    refuses: Mapping[str, str] = field(default_factory=dict)
    one_arch: bool = True
    in_all: bool = True
    means: bool = True

    def check(self, choices: Choices) -> Choices:
        """``choices`` validated for this experiment: every rule and architecture installed,
        each option one it takes; ConfigError (one line) otherwise."""
        for option in choices.given():
            if option not in self.takes:
                why = self.refuses.get(option, "it has no such axis")
                raise ConfigError(f"experiment {self.name} takes no {chosen(option)}: {why}")
        if choices.rules is not None:
            # a one-line error naming the installed rules
            baselines = [RULES.get(name).baseline for name in choices.rules]
            if all(baselines):  # the frozen-blocks baseline only: nothing to compare
                raise ConfigError(
                    f"experiment {self.name} needs a rule that trains the blocks: "
                    f"{chosen('rules', choices.rules)} names no rule but the "
                    "frozen-blocks baseline, which leaves it nothing to compare; name at "
                    f"least one other ({chosen('rules')} replaces {self.takes['rules']})")
        if choices.archs is not None:
            if self.one_arch and len(choices.archs) != 1:
                raise ConfigError(f"experiment {self.name} runs on one architecture: give "
                                  f"{chosen('arch')} one name, got "
                                  f"{', '.join(choices.archs)}")
            for variant in choices.archs:
                arch_of(variant)
        return choices

    def configs(self, scale: str, dataset: str | None = None, data_dir: str | None = None,
                out_dir: str | Path = "results", choices: Choices | None = None
                ) -> list[RunConfig]:
        """The experiment's runs at ``scale`` (duplicates removed, order kept)."""
        get_scale(scale)
        configs = self.build_configs(scale, dataset=dataset, data_dir=data_dir,
                                     out_dir=str(out_dir),
                                     choices=self.check(choices or Choices()))
        return dedupe(configs)

    def summarise(self, records: Sequence[RunRecord], choices: Choices | None = None
                  ) -> dict[str, Any]:
        """The summary of the finished ``records`` (others are ignored), with the
        ``footnotes`` of the marks its numbers may carry (:mod:`.marks`) and, where it
        averages over seeds (``means``), the runs that stopped early and so stay out of its
        means (``stopped_early``: :func:`~creditaudit.results.stopped_early_note`)."""
        finished = [r for r in records if r.is_finished]
        summary = self.summarise_fn(finished, choices or Choices())
        summary["footnotes"] = footnotes(finished, judgements_of(finished))
        stopped = stopped_early_note(finished, curves=False) if self.means else None
        if stopped:
            summary["stopped_early"] = stopped
        return summary

    def to_markdown(self, summary: dict[str, Any]) -> str:
        """Title, question, run bookkeeping (when ``summary["meta"]`` exists) and body."""
        lines = [f"# Experiment `{self.name}`", "", f"*{self.question}*", ""]
        meta = summary.get("meta")
        if meta:
            chosen = meta.get("choices") or {}
            lists = "".join(f", {what} `{', '.join(chosen[key])}`"
                            for key, what in (("rules", "rules"), ("archs", "architectures"))
                            if chosen.get(key) is not None)
            precision = meta.get("precision")
            if precision not in (None, RunConfig().run.precision):  # other runs than fp32's
                lists += f", precision `{precision}`"
            if meta.get("dtype"):  # runs made in a Python caller's float64
                lists += f", parameters in `{meta['dtype']}`"
            lines.append(f"Scale `{meta['scale']}`, dataset `{meta['dataset']}`{lists}; "
                         f"{meta['runs_found']} of {meta['runs_needed']} runs have finished "
                         f"records in `{meta['out_dir']}`.")
            if meta.get("missing"):
                lines.append("")
                lines.append("Missing runs (not summarised): " + ", ".join(
                    f"`{m['run_id']}` ({m['status']}"
                    + (f": {m['error']})" if m.get("error") else ")")
                    for m in meta["missing"]))
            lines.append("")
        lines.append(self.markdown_fn(summary).rstrip())
        if summary.get("stopped_early"):
            lines += ["", summary["stopped_early"]]
        return "\n".join(lines) + "\n"


_REGISTRY: dict[str, Experiment] = {}


def register(experiment: Experiment) -> Experiment:
    """Add ``experiment`` to the registry (idempotent per name)."""
    _REGISTRY[experiment.name] = experiment
    return experiment


def _load_all() -> None:
    importlib.import_module("creditaudit.study.experiments")


def experiment_names() -> list[str]:
    """Registered experiments, in the order ``all`` runs them."""
    _load_all()
    known = [name for name in ORDER if name in _REGISTRY]
    return known + sorted(set(_REGISTRY) - set(known))


def all_names() -> list[str]:
    """The experiments ``all`` runs, in order: every registered one that declares
    ``in_all``."""
    return [name for name in experiment_names() if _REGISTRY[name].in_all]


def get_experiment(name: str) -> Experiment:
    _load_all()
    if name not in _REGISTRY:
        raise ConfigError(f"unknown experiment {name!r}; choose one of "
                          f"{', '.join(experiment_names())} or all")
    return _REGISTRY[name]
