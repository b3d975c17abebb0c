"""Which run fills each key of the original study's files (:mod:`creditaudit.study.export`).

A group of files is filled from one **family**: the runs of one recipe (same config but for
method and seed). A family may hold copies of one run — the same recipe, method, seed and λ
trained again with other diagnostics settings (``diagnostics.end_of_run``,
``diagnostics.every``), which are not part of the recipe. Of those the one that fills the
most of the file is taken (:func:`log_fill` for the snapshot and penalty files, which hold
the per-epoch log; :func:`results_fill` for the results files, which also hold the
end-of-run block), ties going to the smallest run id, so the choice never depends on the
order the folder lists its runs in; the others are kept as left out, with why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from creditaudit.config import RunConfig
from creditaudit.protocol.records import arch_variant, draws_default_feedback, model_description
from creditaudit.records import RunRecord
from creditaudit.records.compare import recipe_difference
from creditaudit.registry import ARCHITECTURES, RULES

DATASET_PREFERENCE = ("cifar10", "cifar100", "fashion-mnist", "mnist", "mnist1d", "synthetic")

Key = tuple[str, int, float]  # (method, seed, λ)


def file_variant(record: RunRecord) -> str:
    return arch_variant(record, residual_suffix=None)


# The architectures (as :func:`file_variant` names them) the layout has files of.
LAYOUT_VARIANTS = ("resmlp", "resmlp-noLN", "vit", "student")
LAYOUT_HOLDS = ("the original study's layout holds only runs creditaudit trained itself "
                "(creditaudit train or experiment) of bp, dfa, fa or the bridges on "
                "ResidualMLP (with or without out_ln), "
                "ViT-Mini or StudentNet, with a residual stream, every block trainable, real "
                "labels, the rule's default options and feedback drawn from the run seed")
# The rules the layout has files of (its logs: bp, dfa, fa; results_*.json: the bridges).
LAYOUT_RULES = ("bp", "dfa", "fa", "state-bridge", "credit-bridge")
# The rule's settings why_not_exported judges apart (λ has files of its own).
OWN_REASONS = ("name", "penalty", "trainable_blocks", "feedback_seed")


def changed_rule_options(record: RunRecord) -> dict[str, tuple[Any, Any]]:
    """The rule's own options of ``record`` (its config's ``method`` section but those of
    :data:`OWN_REASONS`) set to another value than the rule's default, by name, as (value,
    default): ``{"feedback_scale": (100.0, 1.0)}``. The original study trained each rule
    with its defaults, and its files name a run by rule and seed alone, so such a run (an
    ablation of the rule) is no run of theirs. Empty for a rule not installed here."""
    if RULES.find(record.method) is None:
        return {}
    own = record.config.to_dict()["method"]
    default = RunConfig().replace(**{"method.name": record.method}).to_dict()["method"]
    return {key: (own[key], value) for key, value in default.items()
            if key not in OWN_REASONS and key in own and own[key] != value}


def why_not_exported(record: RunRecord) -> str | None:
    """Why no file of the layout can hold ``record`` (each of what the layout asks of
    a run that it fails: residual stream, every block trainable, real labels, feedback from
    the run seed, a rule the layout has files of, the rule's default options
    (:func:`changed_rule_options`), an
    architecture the layout has files of, a trained epoch), ending with what the layout
    holds; None when it may fill a file."""
    config = record.config
    model = model_description(record)
    reasons = []
    arch = ARCHITECTURES.find(config.model.arch)
    variant = file_variant(record)
    if arch is not None and arch.name == "own-loop":
        reasons.append(f"trained in its own loop (creditaudit.Recorder), its network "
                       f"{variant} adapted rather than built by creditaudit")
    elif arch is not None and arch.adapted:
        reasons.append(f"its network {variant} is adapted from a module "
                       f"(model.arch={config.model.arch})")
    elif variant not in LAYOUT_VARIANTS:
        reasons.append(f"architecture {variant}, which the original study did not train")
    if model is not None and model.residual is False:
        reasons.append("no residual stream (model.residual=false)")
    if not record.trains_every_block:
        reasons.append(f"not every block trainable (method.trainable_blocks="
                       f"{config.method.trainable_blocks})")
    if config.data.random_targets:
        reasons.append("random labels (data.random_targets)")
    if not draws_default_feedback(record):
        reasons.append(f"feedback drawn from method.feedback_seed="
                       f"{config.method.feedback_seed}, not the run seed")
    if record.method not in LAYOUT_RULES:
        reasons.append(f"rule {record.method}, which has no file in the layout (it holds "
                       f"{', '.join(LAYOUT_RULES)})")
    changed = changed_rule_options(record)
    if changed:
        reasons.append("rule options other than its defaults (" + ", ".join(
            f"method.{key}={value} where the default is {default}"
            for key, (value, default) in changed.items()) + ")")
    if record.epochs == 0:
        reasons.append("no trained epoch (optim.epochs=0): no trajectory")
    return f"{'; '.join(reasons)}: {LAYOUT_HOLDS}" if reasons else None


def why_unused(record: RunRecord, taken: Sequence[RunRecord]) -> str:
    """Why ``record``, a run of the layout's kind (:func:`why_not_exported` None), fills no
    file although ``taken`` fill them: no file holds its rule with its λ on its
    architecture, or its group of files was filled from another recipe's runs (one family
    fills a group, :func:`choose_family`)."""
    variant = file_variant(record)
    penalised = float(record.penalty) != 0 and (variant, record.method) != ("resmlp", "dfa")
    if penalised or (record.method in ("state-bridge", "credit-bridge") and variant != "resmlp"):
        return (f"no file of the layout holds {record.method} with λ={record.penalty:g} on "
                f"{variant} (the bridges fill results files of ResidualMLP with out_ln, a "
                f"penalised run only dfa's penalty files): {LAYOUT_HOLDS}")
    rivals = [r for r in taken if file_variant(r) == variant]
    if not rivals:
        return f"no family of its recipe was chosen for a file: {LAYOUT_HOLDS}"
    rival = min(rivals, key=lambda r: (r.method != record.method, r.seed != record.seed,
                                       r.dataset != record.dataset, r.run_id))
    difference = recipe_difference(record, rival) or "its recipe"
    return (f"of another recipe than {rival.run_id} ({difference}), whose family fills the "
            "files it could fill: one recipe fills a group of files (the preferred dataset, "
            "then the most of the needed runs, then the most epochs); export a folder "
            "holding only its recipe's runs for its files")


@dataclass
class Slot:
    """One key of one file: the run of ``method`` (λ ``penalty``) at ``seed``."""

    key: str
    method: str
    seed: int
    penalty: float = 0.0

    @property
    def run_key(self) -> Key:
        return (self.method, self.seed, float(self.penalty))


def dataset_rank(dataset: str) -> int:
    return (DATASET_PREFERENCE.index(dataset) if dataset in DATASET_PREFERENCE
            else len(DATASET_PREFERENCE))


# --- how much of a file a run fills -----------------------------------------------------
def _measured(record: RunRecord) -> int:
    return sum(e.has_diagnostics for e in record.log)


def end_of_run_parts(record: RunRecord) -> tuple[bool, bool]:
    """Whether the record's end-of-run block has its metrics and its drift (a block whose
    ``credit_quality_error`` says why its credit-quality metrics were not measured — a
    diverged model — has no metrics)."""
    block = record.diagnostics.to_dict()
    drift = block.pop("drift", None)
    return bool(block) and "credit_quality_error" not in block, bool(drift)


Fill = Callable[[RunRecord], tuple]


def log_fill(record: RunRecord) -> tuple:
    """How much of a per-epoch log file a run fills, larger is more: its entries with
    diagnostics, then its entries (a diverged run's log stops early), then whether it
    completed; then its end-of-run block, so that where it decides nothing else the run
    taken is the one the results files take."""
    return (_measured(record), len(record.log), record.status == "completed",
            *end_of_run_parts(record))


def results_fill(record: RunRecord) -> tuple:
    """How much of a results file a run fills: its end-of-run metrics and drift, then its
    log (:func:`log_fill`)."""
    return (*end_of_run_parts(record), *log_fill(record)[:3])


def why_left_out(record: RunRecord, taken: RunRecord) -> str:
    """Why ``record``, a copy of ``taken``'s run, was not taken: what it lacks."""
    lacks = []
    (metrics, drift) = end_of_run_parts(record)
    taken_metrics, taken_drift = end_of_run_parts(taken)
    if taken_metrics and not metrics:
        lacks.append("no end-of-run metrics")
    if taken_drift and not drift:
        lacks.append("no drift")
    if _measured(record) < _measured(taken):
        lacks.append(f"diagnostics at {_measured(record)} of its {len(record.log)} logged "
                     f"epochs ({_measured(taken)} of {len(taken.log)} in {taken.run_id})")
    elif len(record.log) < len(taken.log):
        lacks.append(f"{len(record.log)} logged epochs ({len(taken.log)} in {taken.run_id})")
    if record.status != taken.status:
        lacks.append(f"{record.status}, {taken.run_id} {taken.status}")
    what = "; ".join(lacks) if lacks else "fills as much; the smaller run id was taken"
    return f"a copy of the run of {taken.run_id} (same recipe, method, seed, λ): {what}"


@dataclass
class Family:
    """The runs of one recipe that fill a group of files: ``runs`` {(method, seed, λ):
    record}, and ``left_out`` {(method, seed, λ): the other copies of that run}."""

    runs: dict[Key, RunRecord] = field(default_factory=dict)
    left_out: dict[Key, list[RunRecord]] = field(default_factory=dict)


def choose_family(records: Sequence[RunRecord], slots: Sequence[Slot],
                  fill: Fill = log_fill) -> Family:
    """The runs of the best family (one recipe) for ``slots``: the preferred dataset, then
    the most of the needed runs, then the most epochs; of copies of one run, the one that
    ``fill``s the most (then the smallest run id)."""
    families: dict[str, dict[Key, list[RunRecord]]] = {}
    needed = {s.run_key for s in slots}
    for record in records:
        key = (record.method, record.seed, float(record.penalty))
        if key in needed:
            families.setdefault(record.recipe_key, {}).setdefault(key, []).append(record)
    if not families:
        return Family()

    def score(item: tuple[str, dict[Key, list[RunRecord]]]) -> tuple[int, int, int, str]:
        key, members = item
        sample = next(iter(members.values()))[0]
        return (dataset_rank(sample.dataset), -len(members), -sample.epochs, key)

    family = Family()
    for key, copies in min(families.items(), key=score)[1].items():
        ranked = sorted(sorted(copies, key=lambda r: r.run_id), key=fill, reverse=True)
        family.runs[key] = ranked[0]
        if ranked[1:]:
            family.left_out[key] = ranked[1:]
    return family
