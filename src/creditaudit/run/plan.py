"""One run plan: a config resolved once into what every command needs.

:func:`plan_run` resolves the credit rule, the architecture and the dataset a config
selects (each checks its own options, the architecture against the dataset's declared
sample shape, before anything is loaded), the model's size (built on PyTorch's meta device:
no memory), the identity of the data (a fingerprint of what would be loaded;
:meth:`RunPlan.data_identity` adds the digest of what was), the code that
computes the run (each component's ``id_version``; for a guest — a plugin, a ``module``
factory from outside creditaudit — its distribution version and the digest of its code) and
so the run id and folder. Every guest passes its conformance checks at the door
(:mod:`creditaudit.run.door`) before the plan exists; the checks it passed go into the code
block the record keeps (:mod:`creditaudit.run.run_code`: the guests, their admission and
the code block). What a guest's code raises while the plan resolves, loads or builds
it is one line naming the guest (:mod:`creditaudit.guests.blame`). Training, sweep workers,
resume, audit and experiments take the plan; none of them resolves a name again.

::

    from creditaudit.run.plan import plan_run
    plan = plan_run(config)            # ConfigError / DataError in one line if it cannot run
    plan.run_id, plan.run_dir, plan.rule.label, plan.describe_model().label
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from creditaudit.config import RunConfig, with_absolute_data_paths
from creditaudit.data import (
    Dataset,
    DatasetSpec,
    check_declared,
    check_handed,
    check_same_files,
    check_train_subset,
    dataset_spec,
    load_dataset,
)
from creditaudit.descriptions import (
    AUGMENTATION,
    CONTENT_DIGEST,
    DataIdentity,
    ModelDescription,
)
from creditaudit.errors import ConfigError, ModelContractError
from creditaudit.guests.blame import blame
from creditaudit.methods import (
    CreditRule,
    build_rule,
    check_binding,
    check_options,
    rule_class,
)
from creditaudit.models import Architecture, ResidualNet, architecture
from creditaudit.models.adapted import AdaptedModel
from creditaudit.models.images import image_view
from creditaudit.models.meta import on_meta_device
from creditaudit.models.registry import build_architecture
from creditaudit.models.structure import structure_digest
from creditaudit.protocol.verdicts import Protocol
from creditaudit.records import RunRecord
from creditaudit.records.run_ids import RunCode, compute_run_id
from creditaudit.registry import ARCHITECTURES, DATASETS, RULES
from creditaudit.run.defaults import explicit_defaults, with_all_blocks_default, with_defaults
from creditaudit.run.memory import available_memory, check_data_fits, check_fits
from creditaudit.run.resume import check_installed, check_same_code
from creditaudit.run.run_code import (
    admit,
    check_same_network,
    code_version,
    dataset_at_fault,
    guests_of,
    run_code,
)

log = logging.getLogger(__name__)


@dataclass
class RunPlan:
    """A config resolved: its components, its data identity, its run id and folder.

    ``architecture`` and ``dataset``: the components the config selects, as instances
    holding their options (``config.model``, ``config.data``). ``eval_samples``: the
    evaluation-set size actually used (``diagnostics.eval_samples``,
    shrunk to the test split when the default does not fit; for a dataset that does not
    declare its sizes, known once the data is loaded). ``model``: the model's
    description as built (on the meta device). ``protocol``: the diagnostics the run
    evaluates, with their thresholds. ``explicit_defaults``: the values the config asked
    for explicitly that compute what their defaults compute (:mod:`creditaudit.run.
    defaults`), as asked, by dotted key: ``config`` holds their defaults (one run id).
    """

    config: RunConfig
    rule: type[CreditRule]
    architecture: Architecture[Any]  # holding config.model
    dataset: DatasetSpec[Any]  # holding config.data
    data_seed: int
    identity: DataIdentity
    code: RunCode
    run_id: str
    eval_samples: int
    model: ModelDescription
    protocol: Protocol
    explicit_defaults: dict[str, Any] = field(default_factory=dict)
    _data: Dataset | None = field(default=None, repr=False)

    @property
    def run_dir(self) -> Path:
        return Path(self.config.run.out_dir) / self.run_id

    @property
    def flatten(self) -> bool:
        """Whether the model reads flat vectors (image data is flattened for it)."""
        return self.architecture.input_kind == "vector"

    @property
    def n_classes(self) -> int:
        return self.dataset.n_classes()

    def load_data(self) -> Dataset:
        """The run's data (loaded once per plan, by the dataset the plan resolved); DataError
        when a file dataset's files changed since the plan fingerprinted them
        (:func:`~creditaudit.data.check_same_files`)."""
        if self._data is None:
            with dataset_at_fault(self.dataset, "loaded data"):
                data = load_dataset(self.config.data, seed=self.config.run.seed,
                                    spec=self.dataset)
                check_same_files(self.dataset, self.identity, self.data_seed)
            self._data = data
            self._fit_eval_samples(self._data)
        return self._data

    def use_data(self, dataset: Dataset) -> None:
        """Train on ``dataset`` (already loaded by the caller) instead of loading it:
        ConfigError unless it is what the plan would load
        (:func:`~creditaudit.data.check_handed`)."""
        check_handed(dataset, self.config.data, self.identity.fingerprint)
        self._data = dataset
        self._fit_eval_samples(dataset)

    def _fit_eval_samples(self, data: Dataset) -> None:
        """``eval_samples`` fitted to the test split as loaded: a dataset that does not
        declare its sizes (files) is known only now. A shrunk default the plan already fitted
        to the same split (declared sizes) is not said twice."""
        n_test = int(data.test_x.shape[0])
        self.eval_samples = fit_eval_samples(self.config, self.dataset.name, n_test,
                                             say=self.eval_samples != n_test)

    def data_identity(self) -> DataIdentity:
        """The data identity with the sizes and the content digest of the loaded data (and
        the digest of the arrays a generated dataset read from its cache), and for images
        how the loaded data augments training batches (``augmentation``: its crop padding
        and flip, or None)."""
        data = self.load_data()
        provenance = self.identity.provenance
        if CONTENT_DIGEST in data.provenance:
            provenance = {**provenance, CONTENT_DIGEST: data.provenance[CONTENT_DIGEST]}
        if data.is_image:
            provenance = {**provenance, AUGMENTATION: data.augmentation()}
        return replace(self.identity, n_train=int(data.train_x.shape[0]),
                       n_test=int(data.test_x.shape[0]), provenance=provenance,
                       arrays_sha256=data.content_digest(), eval_samples=self.eval_samples)

    def build_model(self) -> ResidualNet:
        """The model, built by the architecture the plan resolved (drawing its initial
        weights from torch's global RNG); an adapted network a plugin built has the plugin
        as its ``origin``, named when the network raises."""
        data = self.load_data()
        guest = ARCHITECTURES.guest(self.architecture.name)
        with blame(guest):
            model = build_architecture(self.architecture, input_shape=data.input_shape,
                                       n_classes=data.n_classes)
        if guest is not None and isinstance(model, AdaptedModel) and model.origin is None:
            model.origin = guest.what  # a plugin's network of torch's layers raising in training
        return model

    def build_rule(self, model: ResidualNet) -> CreditRule:
        """The rule the plan resolved, bound to ``model`` (feedback drawn from its own
        generator)."""
        with blame(RULES.guest(self.rule.name)):
            return build_rule(model, self.config.method, n_classes=self.n_classes,
                              seed=self.config.run.seed, cls=self.rule, check=False)

    def as_given(self) -> dict[str, Any]:
        """The config's sections (``config.to_dict()``) with the values the plan put back to
        their defaults as they were asked (``method.trainable_blocks = 2`` of 2 blocks): what
        labels a run by the values its user wrote."""
        raw = self.config.to_dict()
        for key, value in self.explicit_defaults.items():
            section, _, name = key.partition(".")
            raw[section][name] = value
        return raw

    def describe(self) -> dict[str, Any]:
        """What a plan says in a dry run: run id, rule, model, data, code."""
        return {"run_id": self.run_id, "rule": self.rule.label, "model": self.model.label,
                "data": self.dataset.label, "eval_samples": self.eval_samples,
                "code": self.code.to_dict()}


def plan_run(config: RunConfig, *, trained: RunRecord | None = None) -> RunPlan:
    """Resolve ``config`` (see the module docstring). One-line ConfigError/DataError when
    it cannot run: a component not installed, an option its component refuses, an
    architecture that cannot read the dataset's samples, a rule that cannot train the
    model (:func:`~creditaudit.methods.check_binding`), a model too large for this
    machine's memory, an evaluation set larger than the test split, missing data files.

    ``trained``: the record of the finished run this plan rebuilds (audit): a guest whose
    code is not the code that run recorded is refused before it builds a network, loads
    data or is checked at the door (:func:`~creditaudit.run.resume.check_same_code`). Its
    rule options are not refused again (:func:`~creditaudit.methods.check_options`): a
    run trained before a refusal existed (an option found later to change nothing) is
    audited as it was trained.

    The plan's config names its data folder by an absolute path (the run id does not cover
    it): a record written from it finds its data from any folder."""
    config = given = with_absolute_data_paths(config)
    if trained is not None:  # a plugin it used, uninstalled since: named, not "choose one"
        check_installed(trained)
    else:
        check_precision(config.run.precision)
    rule = rule_class(config.method.name)
    if trained is None:
        with blame(RULES.guest(rule.name)):
            check_options(rule, config.method)
    arch_class = architecture(config.model.arch)
    if arch_class.unbuildable:  # e.g. a run recorded from the user's own loop
        raise ConfigError(f"model.arch={arch_class.name!r}: {arch_class.unbuildable}")
    spec_class = dataset_spec(config.data.name)
    data_guest = DATASETS.guest(spec_class.name)
    with dataset_at_fault(spec_class, "declares what"):
        spec = spec_class(config.data)
        spec.check()
        input_shape, n_classes = check_declared(spec)
    arch_guest = ARCHITECTURES.guest(arch_class.name)
    with blame(arch_guest):
        arch = arch_class(config.model)
    try:
        with blame(arch_guest):
            arch.check(input_shape)
    except ConfigError as err:
        # the dataset's hint makes its samples images: said only while they are not
        hint = (spec.hints.get("images") if arch.input_kind == "image"
                and image_view(input_shape) is None else None)
        if hint is None:
            raise
        raise ConfigError(f"{err}; data.name={spec.name!r}: {hint}") from None
    config = with_defaults(config, rule, spec, arch)  # one computation, one run id
    if config.data is not spec.options:
        with blame(data_guest):
            spec = spec_class(config.data)
    if config.model is not arch.options:
        with blame(arch_guest):
            arch = arch_class(config.model)
    factory = arch.guest_code()  # code a built-in architecture runs
    protocol = Protocol.from_config(config.diagnostics)
    guests = guests_of(rule, arch, spec, protocol, factory)
    if trained is not None:  # before the guests build, load or are checked
        check_same_code(trained, guests)
    with blame(arch_guest):
        model, built = _describe_on_meta(arch, rule, input_shape, n_classes)
    tb = config.method.trainable_blocks
    if tb is not None and model.n_blocks is not None and tb > model.n_blocks:
        raise ConfigError(f"method.trainable_blocks={tb} exceeds the model's "
                          f"{model.n_blocks} blocks; use 0…{model.n_blocks}")
    config = with_all_blocks_default(config, built, model.n_blocks)
    check_fits(model, built, rule, config, n_classes)
    with dataset_at_fault(spec, "declares what"):
        check_data_fits(spec.name, spec.sizes(), input_shape)
        eval_samples = _eval_samples(config, spec)
        seed = spec.data_seed(config.run.seed)
        identity = spec.identity(seed)
    admitted = admit(config, rule, arch, spec, protocol, input_shape, n_classes, factory,
                     built.state_layouts)
    # what a model guest's code built: a file it reads can change it, not the run id
    structure = structure_digest(built) if "model" in guests else None
    untied = structure_digest(built, shared=False) if "model" in guests else None
    code = run_code(rule, arch, spec, protocol, guests, admitted, structure,
                    None if untied == structure else untied)
    if trained is not None:
        check_same_network(trained, code, arch, trained.run_id)
    # Features and parameters are made in torch's default dtype (a caller's float64 is
    # another computation, under another id)
    run_id = compute_run_id(config, identity.fingerprint, code,
                            dtype=str(torch.get_default_dtype()).removeprefix("torch."))
    return RunPlan(config=config, rule=rule, architecture=arch, dataset=spec, data_seed=seed,
                   identity=identity, code=code, run_id=run_id, eval_samples=eval_samples,
                   model=model, protocol=protocol,
                   explicit_defaults=explicit_defaults(given, config))


def run_id(config: RunConfig) -> str:
    """The run id of ``config`` (its folder name below ``run.out_dir``)."""
    return plan_run(config).run_id


def check_precision(precision: str, dtype: str | None = None) -> None:
    """Refuse ``run.precision='bf16'`` for float64 parameters, all or some (``dtype``, e.g.
    ``"float64"`` or a Recorder's network's ``"float32+float64"``, as
    :func:`~creditaudit.models.structure.parameter_dtype` names them; None: torch's
    default dtype, in which a run makes its features and parameters): bf16 autocast casts
    float32 tensors only, so the float64 parameters' arithmetic would stay float64 (every
    step the fp32 run's, for a float64 network) while the record said bf16."""
    dtype = str(torch.get_default_dtype()).removeprefix("torch.") if dtype is None else dtype
    if precision == "bf16" and "float64" in dtype.split("+"):
        steps = ("every step would be the float64 run's" if dtype == "float64" else
                 f"the network's parameters are {dtype}: its float64 ones would train in "
                 "float64, not bf16")
        raise ConfigError("run.precision='bf16' trains under bf16 autocast, which leaves "
                          f"float64 parameters and features in float64 ({steps}): leave "
                          "run.precision out (the record says the parameters' dtype, "
                          "model.dtype), or train float32 parameters")


def _describe_on_meta(arch: Architecture[Any], rule: type[CreditRule],
                      input_shape: tuple[int, ...], n_classes: int
                      ) -> tuple[ModelDescription, nn.Module]:
    """The model's description and the model, built on the meta device (no memory, no
    random draws; on the CPU under a forked RNG when the meta build raises); a
    refusal when ``rule`` cannot train it (a rule without ``adapted_models`` on an adapted
    model)."""
    try:
        with on_meta_device():
            model = build_architecture(arch, input_shape=input_shape, n_classes=n_classes)
    except Exception as err:  # noqa: BLE001 - code that cannot run on meta (BioTorch frsf)
        if isinstance(err, ConfigError | ModelContractError):
            raise  # the options' fault, on any device
        if _too_large_to_address(err):  # a CPU build would overflow the same way
            raise ConfigError(f"model.arch={arch.name!r} with these options asks for a "
                              f"tensor too large to address ({err}); choose a smaller model "
                              "or input (model.* sizes, data.in_dim)") from None
        # described from a real build instead; a fault of the model itself fails that too,
        # and is reported from there, as any run would meet it
        log.debug("building %s on the meta device failed (%s: %s); describing a CPU build",
                  arch.name, type(err).__name__, err)
        with torch.random.fork_rng(devices=[]):
            model = build_architecture(arch, input_shape=input_shape, n_classes=n_classes)
    try:
        check_binding(rule, model)
    except ModelContractError as err:
        raise ConfigError(f"method.name={rule.name!r} cannot train model.arch="
                          f"{arch.name!r}: {err}") from None
    return model.describe(), model


def _too_large_to_address(err: BaseException) -> bool:
    """Whether ``err`` is PyTorch's refusal of a tensor whose size in bytes overflows a
    64-bit integer (``Storage size calculation overflowed with sizes=[…]``): sizes no
    machine can hold, refused before the memory check can weigh them."""
    return isinstance(err, RuntimeError) and "size calculation overflowed" in str(err)


def _eval_samples(config: RunConfig, spec: DatasetSpec[Any]) -> int:
    """``diagnostics.eval_samples`` fitted to the test split the dataset declares
    (:func:`fit_eval_samples`); as asked when it declares no sizes (fitted once loaded).
    ConfigError, too, when ``data.train_subset`` exceeds the training split it declares."""
    sizes = spec.sizes()
    if sizes is None:
        return config.diagnostics.eval_samples
    check_train_subset(config.data, spec.name, sizes[0])
    return fit_eval_samples(config, spec.name, sizes[1])


# (dataset, test samples) whose fitted default was said in this process
_SAID_FITTED: set[tuple[str, int]] = set()


def fit_eval_samples(config: RunConfig, dataset: str, n_test: int, *, say: bool = True) -> int:
    """``diagnostics.eval_samples``, or the whole test split of ``n_test`` samples when the
    default 1280 exceeds it (said in one log line, once per dataset and process, unless
    ``say`` is False); ConfigError when a value the user chose exceeds it. The shrunk
    default needs no place in the run id: ``n_test`` follows from what the id holds (the
    generator's options, the files' content)."""
    wanted = config.diagnostics.eval_samples
    if wanted <= n_test:
        return wanted
    if wanted == type(config.diagnostics)().eval_samples:
        if say and (dataset, n_test) not in _SAID_FITTED:  # once: a sweep plans many runs
            _SAID_FITTED.add((dataset, n_test))
            log.info("diagnostics.eval_samples: the default %d exceeds the %d test samples of "
                     "%s; evaluating on all %d", wanted, n_test, dataset, n_test)
        return n_test
    raise ConfigError(f"diagnostics.eval_samples={wanted} exceeds the {n_test} test samples "
                      f"of {dataset}; use at most {n_test}")


# code_version lives in run_code; re-exported here, where the recorders import it from
__all__ = ["RunPlan", "plan_run", "run_id", "check_precision", "available_memory", "code_version"]
