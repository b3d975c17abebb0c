"""What a shipped experiment is, and the registry of them.

An :class:`Experiment` names a question, builds its run configs at a scale (always
``scales.base_config(scale, …)`` plus a few overrides, so runs are shared between
experiments and with ``creditaudit sweep`` whenever settings coincide), summarises the run
records into a JSON-able dict, and renders that summary as Markdown. Summaries read run
records only — never a live model — so they can be recomputed from files at any time.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from creditaudit.config import RunConfig
from creditaudit.errors import ConfigError
from creditaudit.experiments.scales import get_scale
from creditaudit.records import RunRecord
from creditaudit.sweep import dedupe

# The order `all` runs and lists them in.
ORDER = ("audit_table", "random_init", "decision_utility", "threshold_sensitivity",
         "temporal", "penalty_sweep", "capacity_cost", "fresh_null", "depth_ladder",
         "rule_zoo")

ConfigsFn = Callable[..., list[RunConfig]]
SummariseFn = Callable[[list[RunRecord]], dict[str, Any]]
MarkdownFn = Callable[[dict[str, Any]], str]


@dataclass(frozen=True)
class Experiment:
    """A shipped experiment.

    ``question``: what it answers (one sentence). ``needs``: the runs it trains, in words.
    ``build_configs(scale, *, dataset, data_dir, out_dir)`` → run configs;
    ``summarise_fn(records)`` → JSON-able summary (finished records, any order);
    ``markdown_fn(summary)`` → Markdown body.
    """

    name: str
    question: str
    needs: str
    build_configs: ConfigsFn
    summarise_fn: SummariseFn
    markdown_fn: MarkdownFn

    def configs(self, scale: str, dataset: str | None = None, data_dir: str | None = None,
                out_dir: str | Path = "results") -> list[RunConfig]:
        """The experiment's runs at ``scale`` (duplicates removed, order kept)."""
        get_scale(scale)
        configs = self.build_configs(scale, dataset=dataset, data_dir=data_dir,
                                     out_dir=str(out_dir))
        return dedupe(configs)

    def summarise(self, records: Sequence[RunRecord]) -> dict[str, Any]:
        """The summary of the finished ``records`` (others are ignored)."""
        return self.summarise_fn([r for r in records if r.is_finished])

    def to_markdown(self, summary: dict[str, Any]) -> str:
        """Title, question, run bookkeeping (when ``summary["meta"]`` exists) and body."""
        lines = [f"# Experiment `{self.name}`", "", f"*{self.question}*", ""]
        meta = summary.get("meta")
        if meta:
            lines.append(f"Scale `{meta['scale']}`, dataset `{meta['dataset']}`; "
                         f"{meta['runs_found']} of {meta['runs_needed']} runs have finished "
                         f"records in `{meta['out_dir']}`.")
            if meta.get("missing"):
                lines.append("")
                lines.append("Missing runs (not summarised): " + ", ".join(
                    f"`{m['run_id']}` ({m['status']})" for m in meta["missing"]))
            lines.append("")
        lines.append(self.markdown_fn(summary).rstrip())
        return "\n".join(lines) + "\n"


_REGISTRY: dict[str, Experiment] = {}


def register(experiment: Experiment) -> Experiment:
    """Add ``experiment`` to the registry (idempotent per name)."""
    _REGISTRY[experiment.name] = experiment
    return experiment


def _load_all() -> None:
    importlib.import_module("creditaudit.experiments")


def experiment_names() -> list[str]:
    """Registered experiments, in the order ``all`` runs them."""
    _load_all()
    known = [name for name in ORDER if name in _REGISTRY]
    return known + sorted(set(_REGISTRY) - set(known))


def get_experiment(name: str) -> Experiment:
    _load_all()
    if name not in _REGISTRY:
        raise ConfigError(f"unknown experiment {name!r}; choose one of "
                          f"{', '.join(experiment_names())} or all")
    return _REGISTRY[name]
