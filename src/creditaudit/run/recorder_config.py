"""What a Recorder's record says the run was: its config, its data's identity, its code.

A run trained in a user's own loop has no config file: :func:`recorder_config` composes one
from the credit rule (the method section), the model's own-loop description (the model
section), ``data=`` (the data section) and the caller's ``config=`` keys;
:func:`data_identity` asks a dataset creditaudit knows for its identity, or fingerprints the
evaluation arrays (:func:`array_fingerprint`); :func:`network_identity` identifies the
user's network by the digest of its code (:func:`network_code`) and its module tree, or of
its module tree alone when it is built only of installed classes, and
:func:`distribution` names the installed package that provides it.
:class:`creditaudit.run.recorder.Recorder` writes them into the record.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import re
import typing
from collections.abc import Mapping
from typing import Any

import numpy as np
from torch import Tensor

from creditaudit.config import (
    SECTION_TYPES,
    DataConfig,
    RunConfig,
    RunSettings,
    coerce,
    config_from_dict,
    merge_overrides,
    role,
    split_key,
)
from creditaudit.config.composed import rebuild_section
from creditaudit.config.sections import COMPONENT_NAME
from creditaudit.data import DatasetSpec, check_declared, check_same_files, load_dataset
from creditaudit.data.identity import tensor_digest
from creditaudit.data.registry import digest_text
from creditaudit.data.rows import check_test_rows
from creditaudit.descriptions import DataIdentity
from creditaudit.errors import ConfigError, CreditAuditError
from creditaudit.guests import main_module_name, own_sources, source_digest, unread_source
from creditaudit.methods import CreditRule
from creditaudit.models.adapted import AdaptedModel
from creditaudit.models.registry import OwnLoopArchitecture
from creditaudit.models.structure import parameter_dtype, structure_digest
from creditaudit.protocol.verdicts import Protocol
from creditaudit.records.run_ids import CodeVersion
from creditaudit.registry import DATASETS, DIAGNOSTICS, RULES
from creditaudit.run import door
from creditaudit.run.plan import check_precision, code_version
from creditaudit.run.run_code import dataset_at_fault
from creditaudit.version import OWN_PACKAGE

# What data= names when the caller says nothing about the data.
OWN_DATA = "own-data"
OWN_SECTIONS = ("method", "model", "data")  # said by the rule, the model and data=
# Sections whose compute keys a loop must tell (the rest: the rule, the model, and how the
# Recorder itself measures — the diagnostics), and keys it knows without being told.
TOLD_SECTIONS = ("data", "optim", "run")
KNOWN_UNTOLD = {("data", "name"), ("optim", "epochs")}
# The run keys of role "place" a Recorder never applies — the loop runs where and how it
# runs, and the record's environment says what ran (device, torch_threads) — with what to
# do instead; recorded, they would claim what did not happen (run.device='cuda' beside a
# CPU model). Any other place key of the run section: the loop's own business.
NOT_APPLIED = {
    "out_dir": "give the folder as Recorder(…, out=…)",
    "progress": "give Recorder(…, progress=…)",
    "device": "the record's environment.device says where the model is",
    "threads": "the record's environment.torch_threads says torch's thread count as the "
               "Recorder was created; set it with torch.set_num_threads",
}
# The keys every dataset reads, which data of the caller's own may give too.
COMMON_DATA = tuple(f.name for f in dataclasses.fields(DataConfig) if f.name != "name")


def recorder_config(rule: CreditRule, data: str | Mapping[str, Any] | None,
                    config: Mapping[str, Any] | None, n_eval: int
                    ) -> tuple[RunConfig, type[DatasetSpec] | None, set[tuple[str, str]]]:
    """(the run config, the dataset creditaudit knows or None, the (section, key) the caller
    gave, in ``config`` or ``data``): the method section is the rule's, the model section
    the own-loop description of its model, the data section what ``data`` says,
    ``diagnostics.eval_samples`` the ``n_eval`` samples measured on; the caller's keys lay
    over the rest. Errors name the keys as the caller passed them (``data['data_dir']``)."""
    overrides = _dotted(config)
    given = {split_key(key) for key in overrides}
    for section, key in sorted(given):
        if section in OWN_SECTIONS:
            fix = {"method": f"bind it to the rule: rule(name, model, {key}=…)",
                   "model": "the model describes itself (adapt(net, states=[…]))",
                   "data": f"give it in data=, e.g. data={{'name': …, '{key}': …}}"}[section]
            raise ConfigError(f"config sets {section}.{key}: {fix}")
        if section == "run" and role(RunSettings, key) == "place":
            fix = NOT_APPLIED.get(key, "your loop decides it")
            raise ConfigError(f"config sets run.{key}, which a Recorder does not apply to "
                              f"your loop; leave it out: {fix}")
    try:
        return _recorder_config(rule, data, overrides, given, n_eval)
    except CreditAuditError as err:
        raise in_callers_words(err) from None


def _recorder_config(rule: CreditRule, data: str | Mapping[str, Any] | None,
                     overrides: dict[str, Any], given: set[tuple[str, str]], n_eval: int
                     ) -> tuple[RunConfig, type[DatasetSpec] | None, set[tuple[str, str]]]:
    measured = overrides.setdefault("diagnostics.eval_samples", n_eval)
    if measured != n_eval:
        raise ConfigError(f"config sets diagnostics.eval_samples={measured!r}, but eval_x holds "
                          f"{n_eval} samples, which every epoch is measured on: leave it out")
    model = rule.model
    adapted = isinstance(model, AdaptedModel)
    net = user_network(model)
    model_section = {
        "arch": OwnLoopArchitecture.name,
        "module": f"{type(net).__module__}:{type(net).__qualname__}",
        "states": list(model.state_names) if adapted else None,
        "readout": (list(model.readout_names) if adapted and model.readout_names is not None
                    else None)}
    data_section, spec = _data_section(data)
    given |= {("data", key) for key in data_section}
    raw = merge_overrides({"method": dataclasses.asdict(rule.options), "model": model_section,
                           "data": data_section if spec is not None else {}}, overrides)
    resolved = config_from_dict(raw)
    held = parameter_dtype(net)
    if ("run", "precision") in given and resolved.run.precision == "fp32" \
            and held not in (None, "float32"):
        # fp32 says the loop trained float32 weights; these are held in another dtype
        raise ConfigError(f"config sets run.precision='fp32', but the network's parameters "
                          f"are {held}: leave run.precision out (the record keeps the "
                          "parameters' dtype as model.dtype)")
    check_precision(resolved.run.precision, held)
    if spec is None:  # data of the user's own: a section of no installed dataset
        resolved = dataclasses.replace(resolved, data=rebuild_section("data", data_section))
    return resolved, spec, given


def not_recorded(config: RunConfig, given: set[tuple[str, str]]) -> list[str]:
    """The keys of ``config`` that change what a run computes and that a loop must tell —
    data, optimiser, run — but was not ``given`` (dotted, in config order): the config holds
    their defaults, which say nothing about the run."""
    keys = []
    for section in TOLD_SECTIONS:
        for f in dataclasses.fields(getattr(config, section)):
            key = (section, f.name)
            if f.metadata.get("role", "compute") == "compute" and key not in given \
                    and key not in KNOWN_UNTOLD:
                keys.append(f"{section}.{f.name}")
    return keys


def in_callers_words(err: CreditAuditError) -> CreditAuditError:
    """``err`` as the Recorder's caller passed things: the data section's keys as keys of
    ``data=`` (``data['data_dir']``, not the command line's ``data.data_dir
    (--data-dir)``)."""
    text = re.sub(r" \(--[a-z-]+\)", "", str(err))
    text = text.replace(" (data.name)", "").replace("allowed keys in [data]",
                                                    "allowed keys of data=")
    text = re.sub(r"\bdata\.([a-z_]+)", r"data['\1']", text)
    return type(err)(text)


def _dotted(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """Dotted keys of ``config`` (dotted already, or nested sections), a numpy number as the
    Python number it holds (``run.seed=np.int64(3)`` from ``np.arange`` was refused as no
    integer); one key given twice (``{"optim": {"lr": …}, "optim.lr": …}``) is refused, where
    one value was kept silently."""
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise ConfigError(f"config must be a mapping of keys such as {{'optim.lr': 1e-3}}, got "
                          f"{type(config).__name__}")
    out: dict[str, Any] = {}
    for key, value in config.items():
        pairs = ([(f"{key}.{k}", v) for k, v in value.items()]
                 if key in SECTION_TYPES and isinstance(value, Mapping) else [(str(key), value)])
        for dotted, given in pairs:
            if dotted in out:
                raise ConfigError(f"config gives {dotted} twice ({out[dotted]!r} and "
                                  f"{given!r}): give it once")
            out[dotted] = given.item() if isinstance(given, np.generic) else given
    return out


def _data_section(data: str | Mapping[str, Any] | None
                  ) -> tuple[dict[str, Any], type[DatasetSpec] | None]:
    """(the [data] section, its dataset when creditaudit knows it)."""
    section = {"name": OWN_DATA} if data is None else (
        {"name": data} if isinstance(data, str) else _dotted(data) if isinstance(data, Mapping)
        else None)
    if section is None:
        raise ConfigError(f"data must be a dataset name or its [data] section as a mapping, "
                          f"got {type(data).__name__}")
    name = section.get("name")
    if not isinstance(name, str) or not COMPONENT_NAME.match(name):
        raise ConfigError(f"data names the data with {name!r}: use lower-case letters, digits, "
                          "- and _ (e.g. 'my-images'), or a dataset creditaudit knows")
    spec = DATASETS.find(name)
    if spec is None:
        extra = sorted(set(section) - {"name", *COMMON_DATA})
        if extra:
            raise ConfigError(f"data: {name!r} is no dataset creditaudit knows, so it has no "
                              f"option {extra[0]!r}; give its name (and "
                              f"{', '.join(COMMON_DATA)}, which any data has) only")
        fields = {f.name: f for f in dataclasses.fields(DataConfig)}
        types = typing.get_type_hints(DataConfig)
        for key in set(section) & set(COMMON_DATA):
            section[key] = coerce(f"data.{key}", fields[key], types[key], section[key])
    return section, spec


def data_identity(spec: type[DatasetSpec[Any]] | None, config: RunConfig, eval_x: Tensor,
                  eval_y: Tensor, n_classes: int) -> DataIdentity:
    """The data's identity: the dataset's own (files or generator arguments) for a dataset
    creditaudit knows — once the evaluation arrays are checked to be samples of its test
    split and the model's classes its classes — else a fingerprint of the evaluation arrays;
    both keep the arrays' fingerprint in their provenance. The training arrays of the loop
    are never seen, so ``arrays_sha256`` stays unknown."""
    try:
        return _data_identity(spec, config, eval_x, eval_y, n_classes)
    except CreditAuditError as err:
        raise in_callers_words(err) from None


def _data_identity(spec_class: type[DatasetSpec[Any]] | None, config: RunConfig, eval_x: Tensor,
                   eval_y: Tensor, n_classes: int) -> DataIdentity:
    arrays = {"sha256": array_fingerprint(eval_x, eval_y), "samples": int(eval_x.shape[0]),
              "x": f"{str(eval_x.dtype).removeprefix('torch.')} {tuple(eval_x.shape)}",
              "y": f"{str(eval_y.dtype).removeprefix('torch.')} {tuple(eval_y.shape)}"}
    if spec_class is not None:
        with dataset_at_fault(spec_class, "declares what"):
            spec = spec_class(config.data)
            spec.check()
            classes = check_declared(spec)[1]
        if classes != n_classes:
            raise ConfigError(f"the rule's model has {n_classes} logits, but {spec.label} has "
                              f"{classes} classes: record it with data of your own "
                              "(data='my-data'), or a model with one logit per class")
        dataset_admission(spec)  # a plugin's data is checked before it is loaded
        with dataset_at_fault(spec, "declares what"):
            seed = spec.data_seed(config.run.seed)
            identity = spec.identity(seed)
        with dataset_at_fault(spec, "loaded data"):
            loaded = load_dataset(config.data, seed=config.run.seed, spec=spec)
            check_same_files(spec, identity, seed)
        check_test_rows(loaded, eval_x, eval_y, spec.label)
        arrays["checked"] = f"rows of the {spec.label} test split as loaded with these options"
        identity.provenance = {**identity.provenance, "evaluation_arrays": arrays}
        return identity
    digest = arrays["sha256"]
    return DataIdentity(
        name=config.data.name, fingerprint=digest, source=digest, n_classes=n_classes,
        input_shape=list(eval_x.shape[1:]),
        provenance={"evaluation_arrays": arrays, "identifies": (
            "the evaluation arrays (eval_x, eval_y) only: the training data of the loop is "
            "not fingerprinted")})


def dataset_admission(spec: DatasetSpec[Any]) -> door.Admission | None:
    """What the door admitted of ``spec`` (a dataset instance holding its options) when it
    is a plugin, checked as a command's run checks it (remembered once passed); None for a
    built-in. GuestError (one line) when it fails a conformance check."""
    guest = DATASETS.guest(spec.name)
    return None if guest is None else door.dataset_door(spec, guest)


def array_fingerprint(*arrays: Tensor) -> str:
    """sha256 over each tensor's dtype, shape and bytes (as stored, on the CPU): the data
    layer's :func:`~creditaudit.data.identity.tensor_digest`."""
    return tensor_digest(*arrays)


def guest_code(rule: CreditRule, protocol: Protocol
               ) -> tuple[CodeVersion, tuple[CodeVersion, ...]]:
    """The code versions of a Recorder's credit rule (bound, with its options) and protocol
    diagnostics, as a run plan's are (:func:`~creditaudit.run.plan.code_version`): a
    plugin's distribution and code digest, for the run id and the record, once it passed
    the door under the rule's options (:mod:`creditaudit.run.door`; a plugin that fails is
    refused in one line before any file is written)."""
    cls = type(rule)
    guest = RULES.guest(cls.name)
    admitted = (door.rule_door(cls, guest, options=rule.options,
                                layouts=rule.model.state_layouts)
                if guest is not None else None)
    diagnostics = []
    for diagnostic in protocol.diagnostics:
        found = DIAGNOSTICS.guest(diagnostic.name)
        admission = door.diagnostic_door(diagnostic, found) if found is not None else None
        diagnostics.append(code_version(DIAGNOSTICS, type(diagnostic), found, admission))
    return code_version(RULES, cls, guest, admitted), tuple(diagnostics)


def user_network(model: Any) -> Any:
    """The user's own module: the one an adapted model wraps, or the model itself."""
    return model.net if isinstance(model, AdaptedModel) else model


def network_code(net: Any) -> tuple[str | None, str | None]:
    """(digest, why there is none) of the code of the user's network ``net``: the sha256 of
    the source files of the modules defining the classes it is made of (its own and its
    submodules': an ``nn.Sequential`` of your blocks is your blocks' code; a script's
    ``__main__`` is its file) and of the modules of the user's own code they import, found
    as a ``module`` factory's are (:func:`creditaudit.guests.own_sources`). (None, None)
    when no such file is the user's: creditaudit's classes (its version names their code)
    and installed distributions' (``module_packages`` names their versions). (None,
    reason) when a class's source file cannot be read (:func:`creditaudit.guests.unread_source`:
    a notebook, the interpreter prompt, a zip archive): the code is not identified."""
    classes: dict[str, type] = {}
    for module in net.modules():  # the network first: each module named by its outermost class
        classes.setdefault(type(module).__module__, type(module))
    modules = [m for m in classes if main_module_name(m).partition(".")[0] != OWN_PACKAGE]
    for module in modules:
        if (why := unread_source(module)) is not None:
            cls = classes[module]
            return None, (f"the code of {cls.__module__}:{cls.__qualname__} cannot be read: "
                          f"{why}, so the run id cannot tell its code from other code: pass "
                          "name= to tell such runs apart")
    found = own_sources(modules)
    if found is None or not found[1]:
        return None, None
    return source_digest(*found), None


def network_identity(net: Any) -> tuple[str | None, dict[str, str | None]]:
    """(the digest the run id and the recipe cover, what the record's
    ``components.model`` keeps of it) for the user's network ``net``: the digest of its code
    (:func:`network_code`) together with its module tree where source files of the user's
    define its classes (``code_digest_of: "source+structure"``, each part kept as
    ``source_digest`` and ``structure_digest``); for a network built only of installed
    classes — an ``nn.Sequential`` of torch's layers in a script, a package's or
    creditaudit's network — the digest of its module tree
    (:func:`~creditaudit.models.structure.structure_digest`: classes, settings, parameter
    and buffer names, shapes and dtypes; ``code_digest_of: "structure"``), whose classes'
    code the versions in ``module_packages`` and the environment name; None, with
    ``code_digest_reason``, when a class has no source file."""
    source, reason = network_code(net)
    if reason is not None:
        return None, {"code_digest": None, "code_digest_reason": reason}
    structure = structure_digest(net)
    if source is None:
        return structure, {"code_digest": structure, "code_digest_of": "structure"}
    # The files say what the classes do, the tree which of them were built and how: a
    # script that picks its activation from sys.argv is one file and two networks.
    both = digest_text({"source": source, "structure": structure})
    return both, {"code_digest": both, "code_digest_of": "source+structure",
                  "source_digest": source, "structure_digest": structure}


def check_frozen_as_recorded(recorded: Mapping[str, int] | None, rule: CreditRule) -> None:
    """ConfigError (one line) when the parameters frozen outside ``rule`` now
    (:meth:`~creditaudit.methods.CreditRule.frozen_outside`) are not those the record lists
    (``recorded``, taken when the Recorder was created): the run id and the recipe cover
    them, so a parameter frozen or unfrozen since would leave the record untrue. So is one
    that binding the rule froze (``frozen``, ``trainable_blocks``) and the loop unfroze: an
    optimiser holding it trains it, and a frozen-blocks run would train its blocks."""
    if unfrozen := [name for name, p in user_network(rule.model).named_parameters()
                    if id(p) in rule.frozen_by_binding and p.requires_grad]:
        raise ConfigError(f"{', '.join(unfrozen[:3])}{' …' if len(unfrozen) > 3 else ''}, "
                          f"frozen by binding {rule.name!r}, no longer frozen since the "
                          "Recorder was created: the record says the rule does not train "
                          "them; keep them frozen (requires_grad=False) for the whole run (a "
                          "loop that unfreezes them is another run: record it with a rule "
                          "bound to train them)")
    now, before = rule.frozen_outside(), dict(recorded or {})
    if now == before:
        return
    changes = [f"{', '.join(names)} {what}" for names, what in (
        ([n for n in now if n not in before], "frozen"),
        ([n for n in before if n not in now], "no longer frozen"),
        ([n for n in now if n in before and now[n] != before[n]], "resized")) if names]
    raise ConfigError("the parameters frozen outside the rule changed after the Recorder "
                      f"was created ({'; '.join(changes)}), which its record and run id "
                      "would not say: set requires_grad before creating the Recorder, then "
                      "keep it for the whole run")


def distribution(module: str) -> str | None:
    """``dist==version`` of the installed distribution that provides ``module``, or None
    (a script's ``__main__``, a folder on the path)."""
    top = module.split(".")[0]
    names = importlib.metadata.packages_distributions().get(top) or []
    for name in names:
        try:
            return f"{name}=={importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None
