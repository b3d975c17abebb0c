"""The [optim] options as docs/configuration.md describes them: weight decay on every trained
parameter, the cosine schedule ending at 0, and a batch size against the training set (a
last batch of one sample that a BatchNorm cannot normalise in training is refused before
the run starts, in one line)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from creditaudit import adapt
from creditaudit.config import RunConfig
from creditaudit.errors import ConfigError
from creditaudit.run.setup import refuse_one_sample_batch
from creditaudit.run.trainer import Trainer, train

pytestmark = pytest.mark.usefixtures("single_thread")


def convmixer(out_dir, **overrides) -> RunConfig:
    """A tiny ConvMixer on the synthetic task viewed as 3×32×32 images, 129 training
    samples: batches of 128 leave one."""
    return RunConfig().replace(**{
        "model.arch": "convmixer", "data.in_dim": 3072, "data.n_train": 129,
        "data.n_test": 128, "model.d": 8, "model.n_blocks": 1, "model.kernel": 1,
        "optim.epochs": 1, "diagnostics.eval_samples": 128, "diagnostics.end_of_run": False,
        "run.progress": False, "run.out_dir": str(out_dir), **overrides})


def test_a_last_batch_of_one_sample_on_one_value_per_channel_is_refused_before_training(
        tmp_path):
    """ConvMixer with patch 32 on 32×32 images: 1×1 feature maps, so its BatchNorm sees one
    value per channel in a batch of one sample. Before: the first epoch trained, then its
    last step failed as creditaudit's internal error (ValueError from torch)."""
    with pytest.raises(ConfigError, match=r"optim.batch_size=128 leaves 1 of the 129 "
                       r"training samples .* BatchNorm 'embed.bn' sees one value per "
                       r"channel.*129 mod B ≠ 1"):
        train(convmixer(tmp_path, **{"model.patch": 32}))
    assert not any(tmp_path.iterdir())  # nothing of the run was written


def test_a_batch_size_that_leaves_two_samples_trains(tmp_path):
    result = train(convmixer(tmp_path, **{"model.patch": 32, "optim.batch_size": 127}))
    assert result.record.status == "completed"


def user_net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 6), nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6)),
                         nn.Linear(6, 3))


def test_a_factory_networks_batchnorm_is_named_as_the_user_names_it():
    """A user's BatchNorm1d gets one value per channel in any batch of one sample: the
    refusal names the configuration, not the network (which is not at fault)."""
    model = adapt(user_net(), states=["0", "1"], input_shape=(4,))
    sample = torch.randn(2, 4)
    with pytest.raises(ConfigError, match=r"optim.batch_size=1 trains on batches of 1 "
                       r"sample, where the model's BatchNorm '1.1' sees"):
        refuse_one_sample_batch(model, sample, n_train=10, batch_size=1)
    with pytest.raises(ConfigError, match="leaves 1 of the 9 training samples"):
        refuse_one_sample_batch(model, sample, n_train=9, batch_size=4)
    for n_train, batch_size in ((10, 4), (8, 4), (3, 8), (0, 4)):
        refuse_one_sample_batch(model, sample, n_train=n_train, batch_size=batch_size)
    assert all(m.training for m in model.modules())  # flags as they were


class FrozenBatchNorm(nn.BatchNorm1d):
    """Held in eval mode (its running statistics) even while the network trains."""

    def train(self, mode: bool = True) -> FrozenBatchNorm:
        return super().train(False)


def test_a_batchnorm_held_in_eval_mode_takes_a_last_batch_of_one_sample():
    """A frozen BatchNorm normalises by its running statistics in training too: a batch of
    one sample trains. Before, the probe refused it as if it normalised by its batch."""
    net = nn.Sequential(nn.Linear(4, 6), nn.Sequential(nn.Linear(6, 6), FrozenBatchNorm(6)),
                        nn.Linear(6, 3))
    model = adapt(net, states=["0", "1"], input_shape=(4,))
    model.train()
    model(torch.randn(1, 4)).sum().backward()  # what training's last step does
    refuse_one_sample_batch(model, torch.randn(2, 4), n_train=9, batch_size=4)
    assert not net[1][1].training and net[0].training  # flags as they were
    stats_free = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6, track_running_stats=False),
                               nn.Linear(6, 3))
    stats_free[1].train = lambda mode=True: nn.Module.train(stats_free[1], False)
    # no running statistics: it normalises by its batch in eval mode too
    with pytest.raises(ConfigError, match="BatchNorm '1' sees one value per channel"):
        refuse_one_sample_batch(stats_free, torch.randn(2, 4), n_train=9, batch_size=4)


class NoisyNet(nn.Module):
    """Draws from torch's RNG in every forward, eval mode too (a noise layer of its own)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm = nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.conv(x)) + 0.01 * torch.rand_like(x)
        return self.head(h.flatten(1))


def test_the_one_sample_probe_leaves_the_rng_training_draws_from():
    """The probe forwards the network once before training: one that draws from the RNG
    moved training's random streams (and its results) away from the same run's before."""
    model, sample = NoisyNet(), torch.randn(3, 1, 2, 2)
    before = torch.get_rng_state()
    refuse_one_sample_batch(model, sample, n_train=9, batch_size=4)
    assert torch.equal(torch.get_rng_state(), before)


class SqueezedNet(nn.Module):
    """Fails on any batch of one sample by its own fault (squeeze drops the batch axis)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.norm, self.head = nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.embed(x.squeeze())))


def test_a_network_that_fails_on_one_sample_by_itself_is_left_to_training():
    """The probe adds no failure of its own: training names the network's."""
    refuse_one_sample_batch(SqueezedNet(), torch.randn(2, 4), n_train=9, batch_size=4)


def test_batchnorm_over_feature_maps_takes_a_batch_of_one_sample():
    """BatchNorm2d over 2×2 maps normalises 4 values per channel: not refused, nothing
    updated by the probe."""
    net = nn.Sequential(nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 3))
    model = adapt(net, states=["0", "1"], input_shape=(1, 2, 2))
    before = net[1].running_mean.clone()
    refuse_one_sample_batch(model, torch.randn(3, 1, 2, 2), n_train=9, batch_size=4)
    assert torch.equal(net[1].running_mean, before)


def test_weight_decay_applies_to_every_trained_parameter_and_cosine_ends_at_zero(tmp_path):
    """What the key table says: biases and LayerNorm gains decay like the weights."""
    config = RunConfig().replace(**{
        "data.in_dim": 8, "data.n_train": 128, "data.n_test": 128, "model.d": 8,
        "model.n_blocks": 1, "optim.epochs": 1, "optim.batch_size": 64,
        "optim.weight_decay": 0.25, "diagnostics.eval_samples": 128,
        "diagnostics.end_of_run": False, "run.progress": False, "run.out_dir": str(tmp_path)})
    trainer = Trainer(config)
    decayed = {id(p) for group in trainer.optimizer.param_groups
               if group["weight_decay"] == 0.25 for p in group["params"]}
    names = [name for name, p in trainer.model.named_parameters() if id(p) not in decayed]
    assert names == []
    assert any("ln" in name or "norm" in name for name, _ in trainer.model.named_parameters())
    record = trainer.run().record
    assert record.log[0].lr == 1e-3 and record.log[-1].lr == 0.0


def test_a_runs_thread_count_is_its_own(tmp_path):
    """run.threads=1 applies to that run: the caller's count is back after train(), and the
    next run with run.threads unset trains (and records) the caller's count. Before, the
    process kept 1 thread, so the next run depended on which run came before it."""
    base = {"data.in_dim": 8, "data.n_train": 64, "data.n_test": 128, "model.d": 8,
            "model.n_blocks": 1, "optim.epochs": 1, "diagnostics.eval_samples": 128,
            "diagnostics.end_of_run": False, "run.progress": False}
    torch.set_num_threads(2)  # the single_thread fixture puts its own count back
    one = train(RunConfig().replace(**base, **{"run.threads": 1,
                                               "run.out_dir": str(tmp_path / "a")}))
    assert one.record.environment["torch_threads"] == 1
    assert torch.get_num_threads() == 2
    unset = train(RunConfig().replace(**base, **{"run.out_dir": str(tmp_path / "b")}))
    assert unset.record.environment["torch_threads"] == 2


@pytest.mark.parametrize("method", ["state-bridge", "credit-bridge"])
def test_the_bridges_auxiliary_nets_keep_a_constant_rate(tmp_path, method):
    """method.bridge_lr is constant: the run's cosine schedule reaches 0, theirs does not."""
    result = train(RunConfig().replace(**{
        "method.name": method, "method.bridge_lr": 0.004, "data.in_dim": 8,
        "data.n_train": 64, "data.n_test": 128, "model.d": 8, "model.n_blocks": 1,
        "optim.epochs": 1, "optim.batch_size": 32, "diagnostics.eval_samples": 128,
        "diagnostics.end_of_run": False, "run.progress": False, "run.out_dir": str(tmp_path)}))
    aux = getattr(result.rule, "value_optimizer", None) or result.rule.predictor_optimizer
    assert result.record.log[-1].lr == 0.0
    assert [group["lr"] for group in aux.param_groups] == [0.004]
