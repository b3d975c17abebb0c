"""Which settings tell the runs of a report apart, and the table columns that show them.

A run's settings are the config values its run id covers, plus what identifies its data and
(where not creditaudit's) its network's code (:func:`run_settings`). Wherever runs differ in
a setting that no fixed column of a report table shows (epochs, data size, learning rate,
…), the table gets a column for it, named by its config key (:func:`differing_settings`);
the keys of one option table (``model.args.*``) share a column, and past
:data:`MAX_SETTING_COLUMNS` columns all of them share one (:func:`setting_columns`,
:func:`setting_cells`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from creditaudit.config import non_semantic
from creditaudit.formatting import fmt, markdown_text
from creditaudit.records import NOT_RECORDED, RunRecord

# The settings the fixed columns show: the rule and λ, the architecture with its width and
# depth, the terminal LN, the dataset and the seed.
SHOWN_SETTINGS = frozenset({"method.name", "method.penalty", "model.arch", "model.d",
                            "model.n_blocks", "model.out_ln", "data.name", "run.seed"})
DATA_SOURCE = "data source"
MODEL_CODE = "model code"
RULE_CODE = "rule code"  # a plugin rule's code digest: edited between seeds, two rules
MODEL_DTYPE = "model dtype"  # the dtype the parameters were held in (model.dtype)
# What a record without model.dtype held (those before it was kept), as its recipe reads it.
LEGACY_DTYPE = "float32"


def setting_text(value: Any) -> str:
    """A config value as a table cell: ``yes``/``no``, ``—`` for None, floats in ``g``."""
    if isinstance(value, float):
        return f"{value:g}"
    return fmt(value, "") if value is None or isinstance(value, bool) else str(value)


def run_settings(run: RunRecord) -> dict[str, str]:
    """Every setting that makes ``run`` the run it is, as cell text by dotted config key:
    the config values its run id covers (output folder, threads, device, … left out; "not
    recorded" for those a run from a user's own loop was not told) and, as ``data
    source`` and ``model code``, what identifies its data apart from the seed and its
    network's code where it is not creditaudit's (hash prefixes); ``rule code``, the
    credit rule's where it is not creditaudit's (a plugin rule: seeds trained before and
    after its code changed are no seeds of one rule); ``model dtype``, the parameters'
    dtype (its diagnostics ran in it) where the record has one."""
    skip = non_semantic(run.config)
    unknown = set(run.not_recorded)
    settings: dict[str, str] = {}
    for section, values in run.config.to_dict().items():
        for name, value in values.items():
            if (section, name) in skip:
                continue
            if isinstance(value, dict):  # a diagnostic's options table
                settings.update({f"{section}.{name}.{k}": setting_text(v)
                                 for k, v in value.items()})
            elif f"{section}.{name}" in unknown:  # a run from a loop that did not say
                settings[f"{section}.{name}"] = NOT_RECORDED
            else:
                settings[f"{section}.{name}"] = setting_text(value)
    data = run.data
    if data is not None and data.source:
        settings[DATA_SOURCE] = data.source[:12]
    code = run.model_code_digest
    if code is not None:  # a network of the user's own code: two scripts' Nets
        settings[MODEL_CODE] = code[:12]
    rule_code = run.rule_code_digest
    if rule_code is not None:
        settings[RULE_CODE] = rule_code[:12]
    dtype = run.model.dtype if run.model is not None else None
    if dtype is not None:  # trained and measured in it (a Recorder's bf16 net); float32 too
        settings[MODEL_DTYPE] = dtype
    return settings


def differing_settings(runs: Sequence[RunRecord]) -> list[str]:
    """The settings whose text differs between ``runs`` and that no fixed column shows, in
    config order. A setting some runs do not have — an option of one rule, dataset or
    architecture (``method.bridge_hidden`` beside BP) — differs where the runs that have it
    differ, and where a run without it is alike in every fixed column to one with it (else
    the rule's, dataset's or architecture's column already tells them apart). The data
    source (model code) counts only where no ``data.*`` (``model.*``) setting differs (else
    it differs because they do), the rule code only where runs of one rule differ in it (two
    rules' codes differ because the rules do); a record without a model dtype (before it
    was kept) held float32, as its recipe says, so it differs only from another dtype."""
    table = [run_settings(run) for run in runs]
    keys = list(dict.fromkeys(key for settings in table for key in settings))

    def text(settings: dict[str, str], key: str) -> str:
        return settings.get(key, LEGACY_DTYPE if key == MODEL_DTYPE else "—")

    # What the fixed columns show of each run: runs alike there are told apart by no column
    shown = [tuple(settings.get(key) for key in sorted(SHOWN_SETTINGS)) for settings in table]

    def values(key: str) -> set[str]:
        if key in (MODEL_DTYPE, RULE_CODE):  # absent: float32; a built-in rule's code
            return {text(settings, key) for settings in table}
        having = {row for row, settings in zip(shown, table, strict=True) if key in settings}
        lacking = {row for row, settings in zip(shown, table, strict=True)
                   if key not in settings}
        # absent beside a run it is not told apart from (one factory given model.args.d
        # and not; a rule's option an older record lacks): '—' differs from its value
        return {settings[key] for settings in table if key in settings} \
            | ({text({}, key)} if having & lacking else set())

    differ = [key for key in keys if key not in SHOWN_SETTINGS and len(values(key)) > 1]
    if any(key.startswith("data.") for key in differ):
        differ = [key for key in differ if key != DATA_SOURCE]
    if any(key.startswith("model.") for key in differ):
        differ = [key for key in differ if key != MODEL_CODE]
    rule_codes: dict[str, set[str]] = {}
    for run, settings in zip(runs, table):
        rule_codes.setdefault(run.method, set()).add(text(settings, RULE_CODE))
    if all(len(codes) == 1 for codes in rule_codes.values()):
        differ = [key for key in differ if key != RULE_CODE]
    return differ


# More differing settings than this share one column: runs that mix recipes (a sweep over
# model.args of an outside network) gave report.md one column per key, ~40 of them.
MAX_SETTING_COLUMNS = 4
SETTINGS_COLUMN = "settings"


def setting_columns(keys: Sequence[str]) -> dict[str, list[str]]:
    """Table columns for the differing setting ``keys`` (column name → its keys): the keys
    of one table-valued option (``model.args.d``, ``model.args.depth``; ``diagnostics.a.*``)
    share a column named after it; past :data:`MAX_SETTING_COLUMNS` columns every key goes
    into one ``settings`` column."""
    columns: dict[str, list[str]] = {}
    for key in keys:
        parts = key.split(".")
        columns.setdefault(".".join(parts[:2]) if len(parts) > 2 else key, []).append(key)
    if len(columns) > MAX_SETTING_COLUMNS:
        return {SETTINGS_COLUMN: list(keys)}
    return columns


def setting_cells(values: dict[str, str], keys: Sequence[str]) -> dict[str, str]:
    """The cells of :func:`setting_columns` of ``keys`` for one run's ``values``
    (:func:`run_settings`): a key alone shows its value; a shared column ``key=value``
    pairs, each key without the column's own name (``d=32, depth=2``)."""
    cells = {}
    for column, members in setting_columns(keys).items():
        if members == [column]:
            cells[column] = markdown_text(values.get(column, "—"))
            continue
        prefix = "" if column == SETTINGS_COLUMN else column + "."
        cells[column] = markdown_text(", ".join(f"{key.removeprefix(prefix)}="
                                                f"{values.get(key, '—')}" for key in members))
    return cells


__all__ = ["SHOWN_SETTINGS", "DATA_SOURCE", "MODEL_CODE", "RULE_CODE", "setting_text",
           "run_settings", "differing_settings", "MAX_SETTING_COLUMNS", "SETTINGS_COLUMN",
           "setting_columns", "setting_cells"]
