"""Architectures and datasets are instances holding their options (issue #36): creditaudit
calls every hook on an instance — a run, its plan, the readers of its record and each
built-in's conformance suite meet no call of the older class-level spelling, which warns —;
the registries refuse a class lacking a hook it must implement, in one line naming it; and a
plugin written for the older interface (classmethods taking the options first) trains as its
new-style twin does."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import pytest
import torch

from creditaudit import RunConfig, train
from creditaudit.data import DATASETS, DatasetSpec, GeneratedDataset, data_dir, load_dataset
from creditaudit.data.registry import SyntheticOptions
from creditaudit.errors import ConfigError
from creditaudit.models import ARCHITECTURES, Architecture, ResidualNet
from creditaudit.models.registry import ResidualOptions, ResMLPArchitecture, StudentOptions
from creditaudit.protocol.records import arch_variant, model_description
from creditaudit.records import load_record
from creditaudit.run.plan import plan_run
from creditaudit.run.setup import rebuild_run
from creditaudit.study.experiments.configs import image_view
from creditaudit.testing import check_dataset, check_model
from creditaudit.testing.common import TINY_ARCHS, tiny_model
from integrity_support import write_idx_dataset
from plugin_support import GUESTS, PLUGINS, cli

pytestmark = pytest.mark.usefixtures("single_thread")

# What the hook descriptor says when it is reached through the class (the older spelling).
OLDER_CALL = r".*is the older spelling of"
TINY = {"optim.epochs": 1, "optim.batch_size": 32, "run.progress": False,
        "diagnostics.eval_samples": 32, "diagnostics.rho_samples": 8,
        "diagnostics.rho_directions": 2, "diagnostics.null_draws": 2,
        "diagnostics.end_of_run": False}
GENERATED = {"data.n_train": 60, "data.n_test": 40}
RUNS = {  # one tiny run of each built-in architecture, and of every kind of dataset
    "resmlp": {"method.name": "bp", "data.in_dim": 8, "model.d": 8, "model.n_blocks": 2,
               **GENERATED},
    "student": {"method.name": "dfa", "model.arch": "student", "data.in_dim": 8, **GENERATED},
    "vit": {"method.name": "dfa", "model.arch": "vit", "data.in_dim": 3072, "model.d": 8,
            "model.n_blocks": 1, "model.heads": 2, "model.mlp_ratio": 1, "model.patch": 16,
            **GENERATED},
    "convmixer-files": {"method.name": "bp", "model.arch": "convmixer", "data.name": "mnist",
                        "model.d": 8, "model.n_blocks": 1, "model.patch": 7,
                        "model.kernel": 3},
    "module-mnist1d": {"method.name": "dfa", "data.name": "mnist1d", "model.arch": "module",
                       "model.factory": "creditaudit.testing.zoo:TransformerClassifier",
                       "model.args": {"image_shape": [1, 1, 40], "patch": [1, 8], "d": 8,
                                      "depth": 2, "heads": 2},
                       "model.states": ["encoder.layers.0", "encoder.layers.1"],
                       **GENERATED},
}


@pytest.fixture
def no_older_calls():
    """Any hook reached through its class by creditaudit's own code is an error."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=OLDER_CALL, category=DeprecationWarning)
        yield


@pytest.fixture(scope="module")
def idx_folder(tmp_path_factory) -> Path:
    return write_idx_dataset(tmp_path_factory.mktemp("idx") / "mnist", n_train=64, n_test=32)


@pytest.mark.parametrize("name", RUNS)
def test_a_run_its_plan_and_its_readers_call_hooks_on_instances(name, tmp_path, idx_folder,
                                                                no_older_calls):
    values = {**TINY, **RUNS[name], "run.out_dir": str(tmp_path)}
    if values.get("data.name") == "mnist":
        values["data.data_dir"] = str(idx_folder)
    config = RunConfig().replace(**values)
    plan = plan_run(config)
    assert isinstance(plan.architecture, Architecture) and isinstance(plan.dataset,
                                                                       DatasetSpec)
    assert plan.architecture.options is config.model and plan.dataset.options is config.data
    assert plan.describe()["data"] == plan.dataset.label and plan.n_classes == 10
    result = train(plan)
    model = result.model
    assert isinstance(model.architecture, Architecture)  # the instance that built it
    assert model.architecture.options is config.model
    record = load_record(result.run_dir / "record.json")
    assert model_description(record) is not None and arch_variant(record)
    older = dataclasses.replace(record, data=None)  # a record before schema 3: asks the data
    assert older.n_classes == 10
    rebuilt = rebuild_run(record, result.run_dir)
    for a, b in zip(model.state_dict().values(), rebuilt.rule.model.state_dict().values()):
        assert torch.equal(a.cpu(), b)
    assert load_dataset(config.data, seed=0).n_classes == 10
    if plan.dataset.kind == "files":
        assert data_dir(config.data) == idx_folder


def test_every_builtin_passes_its_suite_with_hooks_called_on_instances(idx_folder,
                                                                       no_older_calls):
    for cls in ARCHITECTURES.builtin_classes():
        if not cls.adapted:
            check_model(cls, {"n_blocks": 2} if "n_blocks" in cls.option_names() else {})
    for name in ("synthetic", "mnist1d"):
        check_dataset(DATASETS.get(name), {"n_train": 50})
    check_dataset(DATASETS.get("mnist"), {"data_dir": str(idx_folder)})
    for arch in TINY_ARCHS:
        assert isinstance(tiny_model(arch=arch), torch.nn.Module)
    assert image_view("smoke", "mnist1d") is None


def test_the_suites_take_an_instance_holding_its_options(idx_folder):
    options = ResidualOptions(d=8, n_blocks=2)
    report = check_model(ResMLPArchitecture(options))
    assert report.passed and not report.expected_failures
    spec = DATASETS.get("mnist")(DATASETS.get("mnist").Options(data_dir=str(idx_folder)))
    report = check_dataset(spec)
    assert report.passed and not report.expected_failures


def test_the_older_spelling_still_works_and_says_the_newer_one():
    options = ResidualOptions(d=8, n_blocks=2)
    with pytest.warns(DeprecationWarning, match=r"ResMLPArchitecture\(options\)\.build"):
        model = ResMLPArchitecture.build(options, input_shape=(6,), n_classes=4)
    assert isinstance(model, ResidualNet) and model.d == 8


# --- the validators ---------------------------------------------------------------------------
class NoBuild(Architecture):
    name, label = "no-build", "No build"


class OlderBuild(Architecture):
    name, label = "older-build", "Older build"

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        raise NotImplementedError


class NoIdentity(DatasetSpec):
    name, label, kind = "no-identity", "No identity", "generated"

    def input_shape(self):
        return (4,)

    def load(self, seed):
        raise NotImplementedError


class Generated(GeneratedDataset):  # identity() comes from GeneratedDataset
    name, label = "generated", "Generated"

    def input_shape(self):
        return (4,)

    def load(self, seed):
        raise NotImplementedError


def test_a_class_lacking_a_hook_it_must_implement_is_refused():
    with pytest.raises(ConfigError, match=r"^here \(no-build\) must implement build\(\)$"):
        ARCHITECTURES.validate(NoBuild, "here")
    with pytest.raises(ConfigError, match=r"^here \(no-identity\) must implement identity\(\)$"):
        DATASETS.validate(NoIdentity, "here")
    assert ARCHITECTURES.validate(OlderBuild, "here") is OlderBuild  # a classmethod hook
    assert DATASETS.validate(Generated, "here") is Generated  # inherited from a parent


def test_options_come_from_the_parameter_of_the_base_and_are_declared_once():
    assert ResMLPArchitecture.Options is ResidualOptions  # Architecture[ResidualOptions]
    assert DATASETS.get("synthetic").Options is SyntheticOptions
    assert repr(ResMLPArchitecture(ResidualOptions(d=8))).startswith("ResMLPArchitecture(d=8,")

    class Contradicts(Architecture[ResidualOptions]):
        name, label, Options = "contradicts", "Contradicts", StudentOptions

        def build(self, *, input_shape, n_classes):
            raise NotImplementedError

    with pytest.raises(ConfigError, match=r"^here \(contradicts\) sets Options = "
                       r"StudentOptions but its base is parameterised by ResidualOptions"):
        ARCHITECTURES.validate(Contradicts, "here")


def test_a_plugin_lacking_a_hook_is_refused_in_one_line_naming_it(tmp_path):
    site = GUESTS.install(tmp_path / "site", only=["h8-no-build", "h8-no-identity"])
    for flag, name, hook in (("--arch", "h8-no-build", "build"),
                             ("--dataset", "h8-no-identity", "identity")):
        done = cli(site, "train", flag, name, "--out", str(tmp_path / "runs"), "-q",
                   cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        line = done.stderr.strip()
        assert "\n" not in line and "Traceback" not in line
        assert line.startswith("creditaudit: error: ") and f"must implement {hook}()" in line
        assert "creditaudit_guests.h8_older" in line and f"{name!r}" in line


# --- an older-style plugin and its new-style twin -----------------------------------------------
TWIN_RUN = ["--method", "dfa", "--epochs", "1", "--no-progress", "--set", "data.n_train=256",
            "--set", "data.n_test=128", "--set", "data.dim=8", "--set", "model.width=16",
            "--set", "model.depth=2", "--set", "diagnostics.eval_samples=128",
            "--set", "diagnostics.end_of_run=false"]
OLDER_NAMES = {"h8-plain-mlp": "plain-mlp", "h8-gaussian-mixture": "gaussian-mixture"}


def _comparable(run_dir: Path) -> dict:
    """The record without what differs between two trainings of the same run by other code
    of the same numbers: times, folders, the code's origin and digest, the run id."""
    text = (run_dir / "record.json").read_text().replace(f'"{run_dir.name}"', '"RUN_ID"')
    for older, newer in OLDER_NAMES.items():
        text = text.replace(f'"{older}"', f'"{newer}"')
    record = json.loads(text)
    for key in ("created", "updated", "environment", "content_sha256"):
        record.pop(key)
    record["config"]["run"].pop("out_dir")
    for entry in record["log"]:
        entry.pop("seconds")
    return record


def test_an_older_style_plugin_trains_as_its_new_style_twin(tmp_path):
    newer = PLUGINS.install(tmp_path / "newer", only=["plain-mlp", "gaussian-mixture"])
    older = GUESTS.install(tmp_path / "older", only=list(OLDER_NAMES))
    runs = {}
    for site, arch, data in ((newer, "plain-mlp", "gaussian-mixture"),
                             (older, "h8-plain-mlp", "h8-gaussian-mixture")):
        out = tmp_path / f"runs-{arch}"
        done = cli(site, "train", "--arch", arch, "--dataset", data, *TWIN_RUN, "--out",
                   str(out), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        (runs[arch],) = out.iterdir()
    assert runs["plain-mlp"].name.startswith("dfa-plain-mlp-gaussian-mixture-s42-")
    assert runs["h8-plain-mlp"].name.startswith("dfa-h8-plain-mlp-h8-gaussian-mixture-s42-")
    first, second = _comparable(runs["plain-mlp"]), _comparable(runs["h8-plain-mlp"])
    assert first["log"] and first == second
    weights = [torch.load(run / "checkpoint.pt", weights_only=True)["model"]
               for run in runs.values()]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
