"""local-ce (Nøkland & Eidnes 2019, 'pred'): every state's credit is the gradient of its own
linear classifier's cross-entropy.

In float64 the credit is autograd's gradient of Σ_b CE(D φ(h_b) + c, y_b) for vectors,
tokens and feature maps; one step's hidden-layer gradient is autograd's of Σ_l batch-mean
local CE_l with detached inputs (the source's update) and the classifiers take one AdamW
step of their own gradients at the run's lr; zero classifiers train nothing but the readout
on the first step; the conformance suite passes and catches wrong variants; resume is
bit-identical; runs train through adapt(...) and the CLI.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit import adapt, diagnose, rule
from creditaudit.config import RunConfig
from creditaudit.errors import ConfigError
from creditaudit.measures.null import fresh_feedback_null, has_feedback
from creditaudit.methods import rule_class
from creditaudit.methods.local_ce import LocalCE
from creditaudit.models import ResidualMLP
from creditaudit.optim import make_adamw
from creditaudit.run.trainer import train
from creditaudit.testing import check_rule
from creditaudit.testing.common import tiny_batch
from creditaudit.testing.rule_lifecycle import state_dict_round_trips_and_resumes
from creditaudit.testing.rule_properties import make_rule

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64


def random_classifiers(rule: LocalCE, seed: int = 3) -> None:
    """Non-zero classifiers (zero ones give zero credits, which any rule matches)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in [*rule.weights, *rule.biases]:
            p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype))


def phi(h: Tensor) -> Tensor:
    """The source's pooling, written out: tokens and positions averaged."""
    return {2: lambda: h, 3: lambda: h.mean(dim=1), 4: lambda: h.mean(dim=(2, 3))}[h.dim()]()


@pytest.mark.parametrize("arch,dim", [("resmlp", 2), ("vit", 3), ("convmixer", 4)])
def test_credit_is_the_gradient_of_the_summed_local_cross_entropy(arch, dim):
    rule_ = make_rule(LocalCE, arch=arch)
    random_classifiers(rule_)
    x, y = tiny_batch(arch=arch)
    credits = rule_.credits(x, y)
    states, _ = rule_.model.forward_states(x)
    assert len(credits) == len(states) == rule_.model.n_blocks + 1  # h_L included
    for h, a, weight, bias in zip(states, credits, rule_.weights, rule_.biases, strict=True):
        assert h.dim() == dim and a.dtype == F64
        h = h.detach().requires_grad_(True)
        loss = F.cross_entropy(phi(h) @ weight.detach().T + bias.detach(), y, reduction="sum")
        (want,) = torch.autograd.grad(loss, h)
        torch.testing.assert_close(a, want, rtol=1e-12, atol=1e-14)
        assert a.abs().max() > 0


def test_one_step_is_the_sources_update_of_hidden_layers_readout_and_classifiers():
    """normalise_credit=false (the default): the blocks' gradient is autograd's of
    Σ_l batch-mean CE_l(D_l h_l + c_l) with each block's input detached, the readout's that of
    its CE on the detached h_L; the classifiers take one AdamW step (no decay) of autograd's
    gradients at the run's lr × classifier_lr_scale."""
    rule_ = make_rule(LocalCE, classifier_lr_scale=2.0)
    assert rule_.options.normalise_credit is False
    random_classifiers(rule_)
    model = rule_.model
    x, y = tiny_batch(seed=4)

    # the reference, by autograd on copies
    weights = [w.detach().clone().requires_grad_(True) for w in rule_.weights]
    biases = [b.detach().clone().requires_grad_(True) for b in rule_.biases]
    h = model.embed(x)
    states = [h]
    for block in model.blocks:
        inp = states[-1].detach()
        states.append(model.next_state(inp, block(inp)))
    objective = F.cross_entropy(model.readout(states[-1].detach()), y)
    for h, w, b in zip(states, weights, biases):
        objective = objective + F.cross_entropy(h @ w.T + b, y)
    objective.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    reference = make_adamw([*weights, *biases], lr=0.1, weight_decay=0.0)
    reference.step()

    optimizer = torch.optim.SGD(rule_.trainable_parameters(), lr=0.05)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert rule_.train_step(x, y, optimizer).finite
    for name, p in model.named_parameters():
        torch.testing.assert_close(before[name] - p.detach(), 0.05 * want[name],
                                   rtol=1e-9, atol=1e-13, msg=name)
    for mine, ref in zip([*rule_.weights, *rule_.biases], [*weights, *biases], strict=True):
        torch.testing.assert_close(mine.detach(), ref.detach(), rtol=1e-12, atol=1e-14)
        assert mine.grad is None  # nothing left for the next step


def test_classifier_gradients_are_autograds_and_the_lr_follows_the_run_every_step():
    rule_ = make_rule(LocalCE)
    random_classifiers(rule_)
    x, y = tiny_batch(seed=5)
    states, _ = rule_.model.forward_states(x)
    rule_.classifier_credits(states, y, keep_gradients=True)
    for h, w, b in zip(states, rule_.weights, rule_.biases):
        w_, b_ = w.detach().requires_grad_(True), b.detach().requires_grad_(True)
        loss = F.cross_entropy(h.detach() @ w_.T + b_, y)
        gw, gb = torch.autograd.grad(loss, [w_, b_])
        torch.testing.assert_close(w.grad, gw, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(b.grad, gb, rtol=1e-12, atol=1e-14)
    rule_.classifier_optimizer.zero_grad(set_to_none=True)

    # a schedule that sets the run's lr to 0 stops the classifiers too
    optimizer = torch.optim.SGD(rule_.trainable_parameters(), lr=0.1)
    assert rule_.train_step(x, y, optimizer).finite
    moved = [w.detach().clone() for w in rule_.weights]
    optimizer.param_groups[0]["lr"] = 0.0
    assert rule_.train_step(x, y, optimizer).finite
    assert all(torch.equal(a, w) for a, w in zip(moved, rule_.weights))


def test_zero_classifiers_train_only_the_readout_on_the_first_step():
    rule_ = make_rule(LocalCE)
    model = rule_.model
    assert all(not w.any() for w in [*rule_.weights, *rule_.biases])
    x, y = tiny_batch()
    assert all(not a.any() for a in rule_.credits(x, y))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(rule_.trainable_parameters(), lr=0.1)
    assert rule_.train_step(x, y, optimizer).finite
    for name, p in model.named_parameters():
        readout = name.startswith(("out_ln.", "out_head."))
        assert torch.equal(p, before[name]) != readout, name
    # the classifiers trained, so the second step's credits are not zero
    assert all(w.any() for w in rule_.weights)
    assert all(a.any() for a in rule_.credits(x, y))


@pytest.mark.parametrize("arch", ["resmlp", "adapted-resnet"])
def test_a_non_finite_step_updates_neither_the_model_nor_the_classifiers(arch):
    rule_ = make_rule(LocalCE, arch=arch)
    optimizer = torch.optim.AdamW(rule_.trainable_parameters(), lr=1e-2)
    assert rule_.train_step(*tiny_batch(arch=arch), optimizer).finite
    random_classifiers(rule_)  # non-zero classifiers would carry the NaN into every credit
    before = {n: p.detach().clone() for n, p in rule_.model.named_parameters()}
    saved = rule_.state_dict()
    x, y = tiny_batch(seed=2, arch=arch)
    x[0] = float("inf")
    assert not rule_.train_step(x, y, optimizer).finite
    for name, p in rule_.model.named_parameters():
        assert torch.equal(p, before[name]), name
    after = rule_.state_dict()
    for a, b in zip([*saved["weights"], *saved["biases"]], [*after["weights"],
                                                           *after["biases"]]):
        assert torch.equal(a, b)
    moments = [(s["exp_avg"], s["exp_avg_sq"]) for s in saved["optimizer"]["state"].values()]
    assert moments and all(torch.equal(a, b) and torch.equal(c, d) for (a, c), (b, d) in zip(
        moments, [(s["exp_avg"], s["exp_avg_sq"])
                  for s in after["optimizer"]["state"].values()]))


class WrongSign(LocalCE):
    """Reports the right credit and trains the blocks with its negative."""

    name = "h10-wrong-sign"

    def classifier_credits(self, states, y, *, keep_gradients=False):
        credits = super().classifier_credits(states, y, keep_gradients=keep_gradients)
        return [-a for a in credits] if keep_gradients else credits


class ForgetsItsOptimiser(LocalCE):
    """Saves the classifiers but not their AdamW moments."""

    name = "h10-forgets-optimiser"

    def load_state_dict(self, state):
        super().load_state_dict({**state, "optimizer": type(self)(
            self.model, self.options, n_classes=self.n_classes,
            generator=torch.Generator()).classifier_optimizer.state_dict()})


def test_the_conformance_suite_passes_and_catches_wrong_variants():
    check_rule(LocalCE)
    with pytest.raises(AssertionError, match="local_update_is_the_surrogate_gradient"):
        check_rule(WrongSign, archs=("resmlp",))
    with pytest.raises(AssertionError, match="state_dict_round_trips_and_resumes"):
        check_rule(ForgetsItsOptimiser, archs=("resmlp",))


@pytest.mark.parametrize("arch", ["resmlp", "adapted-resnet"])
def test_a_resumed_rule_trains_bit_identically(arch):
    state_dict_round_trips_and_resumes(LocalCE, arch)


def test_to_moves_the_classifiers_and_their_optimiser_state():
    rule_ = make_rule(LocalCE)
    optimizer = torch.optim.SGD(rule_.trainable_parameters(), lr=0.1)
    assert rule_.train_step(*tiny_batch(), optimizer).finite
    before = [p.detach().clone() for p in [*rule_.weights, *rule_.biases]]
    meta = torch.device("meta")
    assert rule_.to(meta) is rule_
    held = [*rule_.weights, *rule_.biases]
    assert all(p.device == meta for p in rule_.model.parameters())
    assert all(p.device == meta and p.shape == b.shape for p, b in zip(held, before))
    # the optimiser holds the moved parameters, its moments moved with them
    optimised = [p for g in rule_.classifier_optimizer.param_groups for p in g["params"]]
    assert all(a is b for a, b in zip(optimised, held, strict=True))
    moments = [t for p in held for k, t in rule_.classifier_optimizer.state[p].items()
               if k != "step"]
    assert len(moments) == 2 * len(held) and all(t.device == meta for t in moments)


def test_a_zero_classifier_rate_is_refused_before_a_run(tmp_path):
    """The classifiers start at zero: at classifier_lr_scale=0 they never move, every
    credit stays 0 and no block trains, so the value is refused in one line, before a run
    folder exists."""
    torch.manual_seed(0)
    model = ResidualMLP(in_dim=6, d=8, n_classes=3, n_blocks=2)
    with pytest.raises(ConfigError, match=r"^method.classifier_lr_scale=0.0 keeps the local "
                                          r"classifiers at their zero init: .* give a "
                                          r"positive scale$"):
        rule("local-ce", model, classifier_lr_scale=0)
    config = RunConfig().replace(**{
        "method.name": "local-ce", "method.classifier_lr_scale": 0.0, "data.n_train": 64,
        "data.n_test": 64, "data.in_dim": 8, "model.d": 8, "model.n_blocks": 2,
        "optim.epochs": 1, "run.out_dir": str(tmp_path / "runs")})
    with pytest.raises(ConfigError, match="method.classifier_lr_scale=0.0"):
        train(config)
    assert not (tmp_path / "runs").exists()
    rule("local-ce", model, classifier_lr_scale=1e-12)  # tiny but positive: accepted


def test_learned_classifiers_have_no_fresh_feedback_null_as_kolen_pollack():
    """The fresh-feedback null redraws fixed random feedback; local-ce's is learned, so it
    is left out of the end-of-run metrics and refused when asked for, as for kp."""
    ours, kp = make_rule(LocalCE), make_rule(rule_class("kp"))
    x, y = tiny_batch()
    for r in (ours, kp):
        assert r.feedback_kind == "learned" and not has_feedback(r)
        with pytest.raises(ConfigError):
            fresh_feedback_null(r, x, y, n=2)


def test_trains_a_batchnorm_leaky_relu_mlp_through_adapt_and_is_audited():
    generator = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(12, 16), nn.BatchNorm1d(16), nn.LeakyReLU(),
                            nn.Linear(16, 16), nn.BatchNorm1d(16), nn.LeakyReLU(),
                            nn.Linear(16, 3))
    model = adapt(net, ["2", "5"], input_shape=(12,))
    trained = rule("local-ce", model)
    assert [tuple(w.shape) for w in trained.weights] == [(3, 16), (3, 16)]
    optimizer = torch.optim.AdamW(trained.trainable_parameters(), lr=1e-2)
    teacher = torch.randn(12, 3, generator=generator)
    first = [p.detach().clone() for p in net[0].parameters()]
    losses = []
    for _ in range(30):
        x = torch.randn(32, 12, generator=generator)
        result = trained.train_step(x, (x @ teacher).argmax(dim=1), optimizer)
        assert result.finite
        losses.append(result.loss)
    assert sum(losses[-5:]) < sum(losses[:5])
    assert not any(torch.equal(a, b) for a, b in zip(first, net[0].parameters()))
    x = torch.randn(16, 12, generator=generator)
    report = diagnose(model, x, (x @ teacher).argmax(dim=1), credit=trained, metrics=True,
                      metric_options={"rho_samples": 4, "rho_directions": 4,
                                      "etas": (0.01,)})
    assert report.verdict and report.metadata["method"] == "local-ce"
    assert "fresh_b_null" not in report.metrics


def test_creditaudit_train_runs_local_ce_on_the_residual_mlp(tmp_path):
    from creditaudit.cli import main
    from creditaudit.records.files import load_records

    assert main(["train", "--method", "local-ce", "--dataset", "synthetic", "--epochs", "1",
                 "--set", "data.n_train=256", "--set", "data.n_test=1280",
                 "--set", "model.d=16", "--set", "model.n_blocks=2",
                 "--set", "diagnostics.eval_samples=64", "--set", "diagnostics.rho_samples=8",
                 "--set", "diagnostics.rho_directions=2", "--out", str(tmp_path), "-q"]) == 0
    (_, record), = load_records(tmp_path)[0]
    assert record.status == "completed" and record.config.method.name == "local-ce"
    assert record.protocol.verdict is not None
    assert record.diagnostics.fresh_b_null is None
    assert record.final is not None and 0.0 <= record.final.test_acc <= 1.0


def test_a_killed_local_ce_run_resumes_to_the_uninterrupted_run(tmp_path, kill_run_at):
    """The checkpoint holds the classifiers and their AdamW moments: killed after epoch 1
    and resumed, the run ends with the uninterrupted run's record, weights and classifiers
    (the cosine schedule sets both optimisers' lr in every epoch)."""
    from creditaudit.records import comparable, load_record
    from creditaudit.run.plan import run_id
    from creditaudit.run.trainer import train
    from test_training import assert_state_dicts_equal, checkpoint, tiny

    options = {"method.name": "local-ce", "optim.epochs": 3}
    straight = train(tiny(tmp_path / "a", **options))
    config = tiny(tmp_path / "b", **options)
    kill_run_at(config)
    run_dir = tmp_path / "b" / run_id(config)
    assert load_record(run_dir).status == "interrupted"
    resumed = train(config, resume=True)
    assert resumed.status == "completed"
    assert comparable(resumed.record) == comparable(straight.record)
    a, b = checkpoint(straight.run_dir), checkpoint(run_dir)
    assert_state_dicts_equal(a["model"], b["model"])
    rule_a, rule_b = (c["rule"] for c in (a, b))
    assert any(w.any() for w in rule_a["weights"])  # the classifiers trained
    for key in ("weights", "biases"):
        assert all(torch.equal(x, y) for x, y in zip(rule_a[key], rule_b[key], strict=True))
