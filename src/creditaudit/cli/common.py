"""Options shared by subcommands that build a run config."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import shlex
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from creditaudit.config import (
    DEVICES,
    PRECISIONS,
    RunConfig,
    apply_overrides,
    apply_where_read,
    config_help,
    parse_override,
)
from creditaudit.config.validation import INT64
from creditaudit.errors import ConfigError, CreditAuditError
from creditaudit.registry import ARCHITECTURES, DATASETS, RULES, Registry


def finite_float(text: str) -> float:
    """argparse type of every float option: a finite number (NaN and ±inf are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number; give a finite "
                                         "value")
    return value


def whole_number(minimum: int, maximum: int | None = None) -> Any:
    """argparse type of an integer option with the bounds of the config key it sets, for a
    command without ``--set`` (``demo --epochs``): a value out of them is refused naming
    the flag, not a config key the command has no flag for. Without ``maximum``, a config's
    largest integer (64 bits) is the bound."""
    maximum = INT64 if maximum is None else maximum

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum or value > maximum:
            bounds = f">= {minimum}" if value < minimum else f"in {minimum} … {maximum}"
            raise argparse.ArgumentTypeError(f"{value} is out of range; it must be {bounds}")
        return value

    parse.__name__ = "whole number"  # argparse's "invalid whole number value: …"
    return parse


def folder(text: str) -> str:
    """argparse type of an output folder: not empty (an empty path silently means the
    current folder), no NUL character (no file path holds one)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path would mean the current folder; give "
                                         "a folder (. for the current one)")
    if "\0" in text:
        raise argparse.ArgumentTypeError(f"{text!r} holds a NUL character (\\x00), which no "
                                         "file path can hold; give the path without it")
    return text


def output_file(text: str) -> str:
    """argparse type of an output file: not empty (an empty path names no file: the report
    would be printed instead, as if the option were not given)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path names no file; give a file to write "
                                         "(or leave the option out to print)")
    return text


# What --precision changes (run.precision): the training steps only (CreditRule.autocast);
# the diagnostics compute credits without it, the end-of-run ρ and nudging on a float64 copy.
PRECISION_EFFECT = ("bf16 steps run under bf16 autocast; the diagnostics run in the "
                    "parameters' dtype (float32 from the command line), never under "
                    "autocast, and the end-of-run ρ and nudging in float64")
# (flag, dotted config key, help) for the most used fields; everything else via --set.
SHORTCUTS: list[tuple[str, str, dict[str, Any]]] = [
    ("--method", "method.name", {"registry": RULES, "help": "credit rule"}),
    ("--arch", "model.arch", {"registry": ARCHITECTURES, "help": "architecture"}),
    ("--dataset", "data.name", {"registry": DATASETS, "help": "dataset"}),
    ("--data-dir", "data.data_dir", {"help": "dataset folder (CIFAR python batches or IDX "
                                             "files; not for synthetic or mnist1d)"}),
    ("--epochs", "optim.epochs", {"type": int, "help": "training epochs"}),
    ("--seed", "run.seed", {"type": int, "help": "seed of init, data order and feedback"}),
    ("--penalty", "method.penalty", {"type": finite_float, "help": "residual-branch penalty λ"}),
    ("--width", "model.d", {"type": int, "help": "model width d"}),
    ("--blocks", "model.n_blocks", {"type": int, "help": "number of blocks L"}),
    ("--out", "run.out_dir", {"help": "results folder (each run gets OUT/RUN_ID/)"}),
    ("--device", "run.device", {"choices": DEVICES, "help": "device"}),
    ("--precision", "run.precision", {"choices": PRECISIONS,
                                      "help": f"training precision: {PRECISION_EFFECT}"}),
    ("--threads", "run.threads", {"type": int, "help": "torch CPU threads"}),
    ("--tensorboard", "run.tensorboard", {
        "metavar": "DIR", "help": "log every epoch, the protocol, the end-of-run metrics and "
                                  "the config to TensorBoard in DIR/RUN_ID/"}),
    ("--wandb", "run.wandb_project", {
        "metavar": "PROJECT", "help": "log the same to this Weights & Biases project "
                                      "(WANDB_MODE=offline: to disk, no account)"}),
    ("--frozen-acc", "diagnostics.frozen_acc", {
        "type": finite_float, "help": "frozen-blocks test accuracy as a fraction (e.g. 0.349) for "
                               "protocol diagnostic (d)"}),
]
# (flag, dotted config key, help) for on/off switches that store one value when given.
SWITCHES: list[tuple[str, str, bool, str]] = [
    ("--no-out-ln", "model.out_ln", False, "drop the terminal LayerNorm (model.out_ln=false)"),
    ("--no-progress", "run.progress", False, "no progress output (run.progress=false)"),
    ("--stop-on-walkback", "diagnostics.stop_on_walkback", True,
     "end the run (status completed, record['stopped_early']) once the protocol verdict turns "
     "to needs walk-back (diagnostics.stop_on_walkback=true)"),
    ("--allow-unverified-reference", "diagnostics.allow_unverified_reference", True,
     "train a model whose backward is not the gradient of its forward (refused otherwise); "
     "its verdict is unverified and every cosine, Γ and (b) is marked so "
     "(diagnostics.allow_unverified_reference=true)"),
]


def add_device_options(parser: argparse.ArgumentParser, *, precision: bool = True) -> None:
    """``--device`` (and ``--precision``) for commands that do not take the full config."""
    parser.add_argument("--device", choices=DEVICES, default=None,
                        help="device of every run (run.device; auto = cuda if available)")
    if precision:
        parser.add_argument("--precision", choices=PRECISIONS, default=None,
                            help="training precision of every run (run.precision): "
                                 + PRECISION_EFFECT)


REFUSED_TOGETHER = "refused_together"  # the attribute of a parser that holds its pairs


def refuse_together(parser: argparse.ArgumentParser, flag: str, others: tuple[str, ...], *,
                    unless: str | None = None) -> None:
    """Refuse each of ``others`` given with ``flag`` (each is accepted alone, and ``flag``
    would ignore it) as argparse refuses two flags of a mutually exclusive group: a usage
    error, ``argument OTHER: not allowed with argument FLAG`` (exit 2). With ``unless`` (a
    flag), only when ``unless`` is not given (the line then ends ``without UNLESS``). A flag
    at its default value is not given, as in argparse's groups. Checked by
    :func:`refused_together` once the command line is parsed."""
    pairs = getattr(parser, REFUSED_TOGETHER, [])
    pairs.extend((flag, other, unless) for other in others)
    setattr(parser, REFUSED_TOGETHER, pairs)


def refused_together(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """The usage error of the first pair :func:`refuse_together` declared on ``parser``
    that ``args`` gives both flags of; None when there is none."""
    for flag, other, unless in getattr(parser, REFUSED_TOGETHER, ()):
        if _given(parser, args, flag) and _given(parser, args, other) and not (
                unless is not None and _given(parser, args, unless)):
            return (f"argument {other}: not allowed with argument {flag}"
                    + (f" without {unless}" if unless is not None else ""))
    return None


def _given(parser: argparse.ArgumentParser, args: argparse.Namespace, flag: str) -> bool:
    """Whether ``flag`` of ``parser`` holds a value other than its default in ``args``."""
    action = next(a for a in parser._actions if flag in a.option_strings)
    return getattr(args, action.dest, action.default) != action.default


class OneConfig(argparse.Action):
    """``--config FILE``, given once: a second file would silently replace the first (the
    files are not merged)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if getattr(namespace, self.dest, None) is not None:
            parser.error(f"--config is given twice ({getattr(namespace, self.dest)} and "
                         f"{values}); give one config file and change its keys with --set")
        setattr(namespace, self.dest, values)


def add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", action=OneConfig,
                        help="TOML config with [data] [model] [method] [optim] [diagnostics] "
                             "[run] sections (e.g. a run folder's config.toml), or a run's "
                             "record.json; flags and --set override it")
    for flag, key, kwargs in SHORTCUTS:
        kwargs = dict(kwargs)
        registry = kwargs.pop("registry", None)
        if registry is not None:
            kwargs["help"] = f"{kwargs['help']}: {registry_choices(registry)}"
            kwargs["metavar"] = "NAME"
        kwargs["help"] = f"{kwargs['help']} ({key})"
        if key == "model.arch":
            kwargs["help"] += ("; any nn.Module: module:package.module:factory (= --arch module "
                               "--set model.factory=package.module:factory)")
        if "choices" not in kwargs:
            kwargs.setdefault("metavar", flag.lstrip("-").upper().replace("-", "_"))
        parser.add_argument(flag, dest=key, default=None, **kwargs)
    for flag, key, value, help_text in SWITCHES:
        parser.add_argument(flag, dest=key, action="store_const", const=value, default=None,
                            help=help_text)
    parser.add_argument("-q", "--quiet", dest="run.progress", action="store_const",
                        const=False, help="print no progress: no bar, no epoch lines (the "
                                          "same as --no-progress)")
    keys = ", ".join(key for key, _, _ in config_help())
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help=f"override any config field, e.g. --set method.penalty=0.01 "
                             f"(keys: {keys}; plus the options of the selected rule, "
                             "architecture and dataset, e.g. method.ep_beta, model.d, "
                             "data.n_train); see docs/configuration.md")


def config_file(path: str) -> RunConfig:
    """The config of ``--config PATH`` (:func:`~creditaudit.records.load_config_file`), its
    rules between keys left to the flags and ``--set`` laid over it (``apply_overrides``
    checks the config they give: a file's stop_on_walkback with protocol_every=0 is
    amended by ``--set diagnostics.protocol_every=1``, as the refusal says).
    When that fails on a run record (or its folder) of a run that cannot be rebuilt — one
    recorded from a user's own loop, whose data (``own-data``) no config names — the line
    says so, as audit's does, instead of the config's first unreadable key, and names the
    way such a record reaches TensorBoard or W&B (what ``train --tensorboard`` on a
    finished run does): :func:`creditaudit.loggers.replay`."""
    from creditaudit.records import load_config_file

    try:
        return load_config_file(path, checked=False)
    except ConfigError:
        refusal = _rebuild_refusal(path)
        if refusal is None:
            raise
        raise ConfigError(f"{refusal}; to log its record to TensorBoard or W&B, replay it "
                          "with creditaudit.loggers.replay (docs/logging.md)") from None


def _rebuild_refusal(path: str) -> str | None:
    """:func:`~creditaudit.run.setup.rebuild_refusal` of the run record at ``path`` (a
    record.json or its folder); None for anything else."""
    from creditaudit.errors import RunRecordError
    from creditaudit.records import load_record
    from creditaudit.records.files import record_path
    from creditaudit.run.setup import rebuild_refusal

    try:
        record = load_record(path, check_content=False)
    except RunRecordError:
        return None
    return rebuild_refusal(record, record_path(path).parent)


# Config key → (the value a flag gave it, the flag as the command line spelled it:
# ``"model.d": (30, "--width 30")``), for the keys the command line's flags set.
FlagsGiven = Mapping[str, tuple[Any, str]]


def config_from_args(args: argparse.Namespace, base: RunConfig | None = None) -> RunConfig:
    """The run config of ``args`` (``--config``, the flags, ``--set``, then
    ``CREDITAUDIT_SET``); a refusal of a value a flag gave names the flag."""
    return config_and_flags(args, base)[0]


def config_and_flags(args: argparse.Namespace, base: RunConfig | None = None
                     ) -> tuple[RunConfig, FlagsGiven]:
    """:func:`config_from_args`, and the keys its flags set (:data:`FlagsGiven`), by which
    :func:`in_flags` spells a later refusal (one raised while the run is planned)."""
    config = config_file(args.config) if args.config else (base or RunConfig())
    flags = {key: flag for flag, key, _ in SHORTCUTS}
    flags.update({key: flag for flag, key, _, _ in SWITCHES})
    flags["run.progress"] = "--no-progress/-q"
    overrides = {key: value for _, key, _ in SHORTCUTS
                 if (value := getattr(args, key, None)) is not None}
    for _, key, _, _ in SWITCHES:
        if getattr(args, key, None) is not None:
            overrides[key] = getattr(args, key)
    # what each flag given sets, as the command line spelled it (for a refusal of its value)
    shortcuts = {key for _, key, _ in SHORTCUTS}
    given = {key: f"{flags[key]} {shlex.quote(str(value))}" if key in shortcuts else flags[key]
             for key, value in overrides.items()}
    arch = overrides.get("model.arch")
    if isinstance(arch, str) and ":" in arch:  # --arch module:package.module:factory
        overrides["model.arch"], _, overrides["model.factory"] = arch.partition(":")
        flags["model.factory"] = "--arch"
        given["model.factory"] = given["model.arch"]
    typed = {key: (overrides[key], flag) for key, flag in given.items()}
    for item in args.set:
        key, value = parse_override(item, given_as="--set")
        # against the flag's own value: of two --set of one key the last counts, flag or not
        if key in typed and not _same_value(typed[key][0], value):
            raise ConfigError(f"{flags[key]} and --set {item.strip()} give {key} two values "
                              f"({typed[key][0]!r} and {value!r}); give one of them")
        set_last(overrides, key, value)
    try:
        config = apply_overrides(config, overrides)
    except ConfigError as err:
        raise ConfigError(named_by_flag(str(err), given)) from None
    shrink = env_overrides()
    return (apply_where_read(config, shrink) if shrink else config), typed


def in_flags(message: str, typed: FlagsGiven) -> str:
    """``message``, a refusal raised once the config was built (while its run is planned),
    with each ``key=value`` that a flag of ``typed`` gave spelled as that flag
    (``model.d=30 is not divisible …`` → ``--width 30 is not divisible …``); a key with
    another value (advice: ``such as model.arch='resmlp'``) is left as it is."""
    for key, (value, flag) in typed.items():
        for spelled in dict.fromkeys((repr(value), str(value))):
            message = re.sub(re.escape(f"{key}={spelled}") + r"(?!\w|\.\d)",
                             lambda _, flag=flag: flag, message)
    return message


def device_flags(args: argparse.Namespace) -> FlagsGiven:
    """The keys ``--device`` and ``--precision`` (:func:`add_device_options`) set, as
    :data:`FlagsGiven` (a flag not given is left out)."""
    pairs = (("run.device", "--device", getattr(args, "device", None)),
             ("run.precision", "--precision", getattr(args, "precision", None)))
    return {key: (value, f"{flag} {value}") for key, flag, value in pairs if value is not None}


@contextlib.contextmanager
def refusals_in_flags(typed: FlagsGiven) -> Iterator[None]:
    """Within: a refusal (CreditAuditError) names the flags of ``typed`` it is about, as
    :func:`in_flags` spells them (``run.device='cuda' but …`` → ``--device cuda but …``)."""
    try:
        yield
    except CreditAuditError as err:
        err.args = (in_flags(str(err), typed), *err.args[1:])
        raise


def named_by_flag(message: str, given: dict[str, str]) -> str:
    """``message``, a refusal of a config key's value, prefixed with the flag that gave it
    (``--width 0: model.d=0 is out of range …``) when a flag of ``given`` (config key →
    the flag as the command line spelled it) set that key; else as it is."""
    for key, flag in given.items():
        if message.startswith((f"{key}=", f"{key} ")):
            return f"{flag}: {message}"
    return message


def set_last(overrides: dict[str, Any], key: str, value: Any) -> None:
    """Set ``key`` as the last override: overrides are merged in order, so a key given again
    after a table that holds it (``diagnostics.a.growth=3``, ``diagnostics.a={…}``,
    ``diagnostics.a.growth=5``) is applied after the table, as the last given."""
    overrides.pop(key, None)
    overrides[key] = value


def _same_value(a: Any, b: Any) -> bool:
    """Whether a flag's value and a ``--set`` value are one value (``--epochs 2`` and
    ``optim.epochs=2``; ``--penalty 1`` and ``method.penalty=1.0``), a bool only a bool."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def registry_choices(registry: Registry) -> str:
    """The installed names of an axis, for help texts (argparse does not check them: the
    registry does, so a broken plugin's name gets its one-line reason). No plugin is
    imported: help works whatever a plugin does when imported."""
    return ", ".join(registry.listed_names())


ENV_OVERRIDES = "CREDITAUDIT_SET"


def env_overrides() -> dict[str, Any]:
    """``--set`` overrides from the environment, for every run a command trains.

    ``CREDITAUDIT_SET="optim.epochs=1 data.n_train=600"`` shrinks (or otherwise changes) every
    run of ``train``, ``sweep`` and ``demo`` without editing the command: a quick dry run of
    any documented command, which the docs' own tests use. Applied after every other source
    (config file, flags, ``--set``, sweep grid), so the runs are other runs (other run ids),
    never mistaken for the full-size ones. Each run takes the keys its components read
    (:func:`creditaudit.config.apply_where_read`): ``data.n_train`` shrinks generated data and
    leaves a file dataset alone. Call it once per command: it says so on stderr.
    """
    text = os.environ.get(ENV_OVERRIDES, "").strip()
    if not text:
        return {}
    try:
        items = shlex.split(text)
    except ValueError as err:
        raise ConfigError(f"{ENV_OVERRIDES}={text!r} is not a list of KEY=VALUE words: {err}; "
                          "quote values that hold spaces") from None
    overrides: dict[str, Any] = {}
    try:
        for item in items:
            set_last(overrides, *parse_override(item))
    except ConfigError as err:  # say where the word came from: no flag of the command has it
        raise ConfigError(f"{ENV_OVERRIDES}={text!r}: {err}") from None
    print(f"creditaudit: {ENV_OVERRIDES} overrides every run: {' '.join(items)}",
          file=sys.stderr)
    return overrides
