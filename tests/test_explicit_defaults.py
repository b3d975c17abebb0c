"""A value given explicitly that computes what its default computes names the default's run:
one run id, one recorded config, one recipe — never a second run of the same computation.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from creditaudit import RunConfig
from creditaudit.config import semantic_dict
from creditaudit.records.recipes import recipe_key
from creditaudit.run.plan import plan_run
from creditaudit.run.trainer import train

FASHION = "/usr/share/datasets/fashion-mnist"
TINY = {"data.n_train": 200, "data.n_test": 100, "model.d": 16, "model.n_blocks": 2,
        "optim.epochs": 1, "diagnostics.eval_samples": 100, "diagnostics.end_of_run": False,
        "run.progress": False}
TRANSFORMER = {"data.name": "mnist1d", "model.arch": "module",
               "model.factory": "creditaudit.testing.zoo:TransformerClassifier",
               "model.args": {"image_shape": [1, 1, 40], "patch": [1, 4], "d": 16, "depth": 2,
                              "heads": 2},
               "model.states": ["encoder.layers.0", "encoder.layers.1"]}

# (the run's settings, the same value given explicitly)
PAIRS = {
    "protocol": ({}, {"diagnostics.protocol": ["a", "b", "c", "d"]}),
    "data_seed": ({"run.seed": 42}, {"data.data_seed": 42}),
    "data_seed, another run seed": ({"run.seed": 7}, {"data.data_seed": 7}),
    "train_subset": ({}, {"data.train_subset": 200}),
    "feedback_seed": ({"method.name": "dfa", "run.seed": 123},
                      {"method.feedback_seed": 123}),
    "none_args": (TRANSFORMER, {"model.none_args": []}),
    "trainable_blocks = L": ({}, {"method.trainable_blocks": 2}),
    "trainable_blocks = L, dfa": ({"method.name": "dfa"}, {"method.trainable_blocks": 2}),
    "trainable_blocks = L, adapted": (TRANSFORMER, {"method.trainable_blocks": 1}),
    "args": ({**TRANSFORMER, "model.args": None, "data.name": "fashion-mnist",
              "data.data_dir": FASHION,
              "model.states": [f"encoder.layers.{i}" for i in range(4)]}, {"model.args": {}}),
}


def _config(tmp_path, **values) -> RunConfig:
    overrides = {**TINY, "run.out_dir": str(tmp_path), **values}
    if overrides.get("data.name", "synthetic") != "synthetic":  # not options of mnist(1d)
        overrides = {k: v for k, v in overrides.items()
                     if k not in ("data.n_train", "data.n_test", "model.d", "model.n_blocks")}
    return RunConfig().replace(**{k: v for k, v in overrides.items() if v is not None})


@pytest.mark.parametrize("name", PAIRS)
def test_an_explicit_default_names_the_default_run(tmp_path, name):
    base, explicit = PAIRS[name]
    if base.get("data.data_dir") and not Path(base["data.data_dir"]).exists():
        pytest.skip("dataset-fashion-mnist is not installed")
    default = plan_run(_config(tmp_path, **base))
    given = _config(tmp_path, **{**base, **explicit})
    assert semantic_dict(given) != semantic_dict(default.config)  # the value is explicit
    plan = plan_run(given)
    assert plan.run_id == default.run_id
    assert plan.config.to_dict() == default.config.to_dict()  # what the record keeps
    assert recipe_key(plan.config) == recipe_key(default.config)


@pytest.mark.parametrize("explicit", [{"data.data_seed": 43}, {"data.train_subset": 199},
                                      {"method.trainable_blocks": 1},
                                      {"diagnostics.protocol": ["a", "b", "c"]},
                                      {"diagnostics.protocol": ["b", "a", "c", "d"]},
                                      {"method.feedback_seed": 43, "method.name": "dfa"}])
def test_a_value_other_than_the_effective_default_stays_its_own_run(tmp_path, explicit):
    default = plan_run(_config(tmp_path, **{k: v for k, v in explicit.items()
                                            if k == "method.name"}))
    plan = plan_run(_config(tmp_path, **explicit))
    assert plan.run_id != default.run_id


def test_a_run_given_its_data_seed_explicitly_is_served_as_the_default_run(tmp_path):
    first = train(_config(tmp_path))
    again = train(_config(tmp_path, **{"data.data_seed": 42}))
    assert again.status == "completed" and again.run_dir == first.run_dir
    assert again.record.config.data.data_seed is None


@pytest.mark.parametrize("answer", [{"n_train": 200}, {"n_train": 50000, "no_such": None},
                                    ["data_seed"]])
def test_what_a_dataset_says_of_its_defaults_is_checked(tmp_path, monkeypatch, answer):
    from creditaudit.data.registry import SyntheticData
    from creditaudit.errors import GuestError

    monkeypatch.setattr(SyntheticData, "same_as_default", lambda self, seed: answer)
    with pytest.raises(GuestError, match="same_as_default"):
        plan_run(_config(tmp_path))


def test_minus_zero_names_the_run_of_zero(tmp_path):
    """``-0.0`` and ``0.0`` compare equal and train the same: one run id, not two."""
    zero = plan_run(_config(tmp_path, **{"method.name": "dfa", "method.feedback_scale": 0.0}))
    minus = plan_run(_config(tmp_path, **{"method.name": "dfa",
                                          "method.feedback_scale": -0.0}))
    assert minus.run_id == zero.run_id


def test_minus_zero_of_a_generator_names_the_run_of_zero(tmp_path):
    """A generator's argument −0.0 makes the data 0.0 makes: one data fingerprint, one run
    id (the fingerprint hashes the generator's arguments, where JSON spelled −0.0 apart)."""
    zero = plan_run(_config(tmp_path, **{"data.alpha": 0.0}))
    minus = plan_run(_config(tmp_path, **{"data.alpha": -0.0}))
    assert minus.identity.fingerprint == zero.identity.fingerprint
    assert minus.identity.source == zero.identity.source  # the recipe's
    assert minus.run_id == zero.run_id
    assert minus.load_data().content_digest() == zero.load_data().content_digest()


def test_all_blocks_of_an_adapted_model_whose_builder_froze_one_stay_apart():
    """On an adapted model ``trainable_blocks = L`` unfreezes what its builder froze between
    named states, which the default leaves frozen: another computation, kept as given."""
    import dataclasses

    import torch
    from torch import nn

    from creditaudit import adapt
    from creditaudit.run.defaults import with_all_blocks_default

    def built(frozen: bool) -> nn.Module:
        net = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 3))
        net[2].weight.requires_grad_(not frozen)
        return adapt(net, ["0", "1", "2"], example=torch.randn(2, 4))

    config = RunConfig().replace(**{"method.trainable_blocks": 2})
    assert with_all_blocks_default(config, built(False), 2).method.trainable_blocks is None
    assert with_all_blocks_default(config, built(True), 2).method.trainable_blocks == 2
    other = dataclasses.replace(config, method=dataclasses.replace(config.method,
                                                                   trainable_blocks=1))
    assert with_all_blocks_default(other, built(False), 2) is other


def test_a_record_of_all_blocks_given_explicitly_is_standard(tmp_path):
    """A record written before k = L was mapped to the default (its config keeps k = L) is
    the ordinary run: standard, plain, in the default's figure group."""
    import dataclasses

    from creditaudit.results.runs import figure_recipe

    record = train(_config(tmp_path)).record
    assert record.is_standard and record.is_plain
    method = record.config.method
    for k, standard in ((2, True), (1, False)):
        old = dataclasses.replace(record, config=dataclasses.replace(
            record.config, method=dataclasses.replace(method, trainable_blocks=k)))
        assert old.is_standard is standard and old.is_plain is standard
        assert (figure_recipe(old) == figure_recipe(record)) is standard
