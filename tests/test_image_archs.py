"""ConvMixer and ViT-Mini on any image shape: the contract, exact per-sample gradients in
eval mode, BatchNorm statistics under training, diagnostics and resume, every rule on both.

Identities are checked in float64 so that "equal" means equal to rounding.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
from torch.nn import functional as F

from creditaudit.config import MethodConfig, ModelConfig, RunConfig, config_from_dict
from creditaudit.errors import ConfigError
from creditaudit.measures.gradients import state_gradients
from creditaudit.methods import build_rule, rule_class, rule_names
from creditaudit.methods.bp import bp_state_gradients
from creditaudit.models import ConvMixer, ViTMini, architecture, build_model, image_shape
from creditaudit.models.contract import (
    feature_rows,
    from_feature_rows,
    held_batch_statistics,
    measurement_mode,
    restored_buffers,
    summary_vectors,
)
from creditaudit.records import CHECKPOINT_FILE, comparable, load_checkpoint, load_record
from creditaudit.run.plan import plan_run, run_id
from creditaudit.run.trainer import Trainer, train

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
C = 4


def convmixer(seed: int = 0, **kwargs) -> ConvMixer:
    torch.manual_seed(seed)
    args = {"n_classes": C, "d": 8, "n_blocks": 3, "patch": 2, "kernel": 3,
            "image_shape": (2, 8, 8), "w2_std": 0.3}
    args.update(kwargs)
    return ConvMixer(**args).double()


def images(n: int = 6, shape=(2, 8, 8), seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, *shape, generator=gen, dtype=F64),
            torch.randint(0, C, (n,), generator=gen))


def trained_statistics(model: ConvMixer, steps: int = 3) -> ConvMixer:
    """Move every BatchNorm's running statistics and affine parameters off their init, so
    eval mode is a non-trivial per-channel affine map."""
    with torch.no_grad():
        for step in range(steps):
            model.forward_states(images(16, seed=10 + step)[0] * (1 + step))
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.weight.normal_(1.0, 0.3)
                module.bias.normal_(0.0, 0.3)
    return model


# --- ConvMixer: the contract --------------------------------------------------------------
def test_convmixer_parameter_names_and_shapes():
    model = convmixer()
    names = {name for name, _ in model.named_parameters()}
    expected = {"embed.proj.weight", "embed.proj.bias", "embed.bn.weight", "embed.bn.bias",
                "out_ln.weight", "out_ln.bias", "out_head.weight", "out_head.bias"}
    for l in range(3):
        expected |= {f"blocks.{l}.{m}.{p}" for m in ("dw", "bn", "pw") for p in ("weight",
                                                                               "bias")}
    assert names == expected
    assert not any("ln" in n for n in names if n.startswith(("embed", "blocks")))  # BN only
    assert {n for n, _ in model.named_buffers()} >= {"embed.bn.running_mean",
                                                     "blocks.2.bn.running_var"}
    assert model.blocks[0].dw.groups == 8 and model.blocks[0].dw.kernel_size == (3, 3)
    assert model.blocks[0].pw.kernel_size == (1, 1)
    assert not any(n.startswith("out_ln") for n, _ in convmixer(out_ln=False).named_parameters())
    x, _ = images()
    states, logits = model.forward_states(x)
    assert all(h.shape == (6, 8, 4, 4) for h in states) and logits.shape == (6, C)


def manual_convmixer(model: ConvMixer, x):
    """The definition written out with plain (contiguous) tensors and functional ops."""
    def bn(module, z):
        return F.batch_norm(z, module.running_mean, module.running_var, module.weight,
                            module.bias, training=False, eps=module.eps)

    stem = model.embed
    h = bn(stem.bn, F.gelu(F.conv2d(x, stem.proj.weight, stem.proj.bias, stride=2)))
    states = [h]
    for block in model.blocks:
        z = F.conv2d(h, block.dw.weight, block.dw.bias, padding=1, groups=h.shape[1])
        f = F.conv2d(bn(block.bn, F.gelu(z)), block.pw.weight, block.pw.bias)
        h = h + f
        states.append(h)
    pooled = F.layer_norm(h.mean(dim=(2, 3)), (h.shape[1],), model.out_ln.weight,
                          model.out_ln.bias)
    return states, pooled @ model.out_head.weight.T + model.out_head.bias


def test_convmixer_forward_matches_its_definition_in_eval_mode():
    model = trained_statistics(convmixer()).eval()
    x, _ = images()
    states, logits = model.forward_states(x)
    ref_states, ref_logits = manual_convmixer(model, x)
    for h, ref in zip(states, ref_states):
        torch.testing.assert_close(h, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-12)
    for l, h in enumerate(states):
        torch.testing.assert_close(model.forward_from(l, h), logits, rtol=0, atol=1e-12)
    # ``residual=False``: each state is its block's branch of the previous one
    model.residual = False
    states, _ = model.forward_states(x)
    for l, block in enumerate(model.blocks):
        torch.testing.assert_close(states[l + 1], block(states[l]), rtol=0, atol=0)


def test_convmixer_starts_near_the_identity():
    model = ConvMixer(C, 16, 4, patch=4, kernel=5, image_shape=(1, 28, 28)).double()
    with torch.no_grad():
        states, _ = model.forward_states(images(32, (1, 28, 28))[0])
    norms = [float(summary_vectors(h).norm(dim=1).median()) for h in states]
    assert max(b / a for a, b in zip(norms, norms[1:])) < 1.05  # pw init N(0, 0.01)


def test_batchnorm_mixes_samples_in_training_mode_only():
    """Why diagnostics run in eval mode: in training mode a sample's state depends on the
    other samples of its batch; in eval mode it does not."""
    model = trained_statistics(convmixer())
    x, _ = images()
    x2 = x.clone()
    x2[1:] = 10.0 * torch.randn_like(x2[1:])
    for training in (True, False):
        model.train(training)
        with torch.no_grad():
            a, _ = model.forward_states(x)
            b, _ = model.forward_states(x2)
            single, _ = model.forward_states(x[:2])
        gap = max(float((h - h2)[0].abs().max()) for h, h2 in zip(a, b))
        if training:
            assert gap > 1e-2
        else:
            assert gap < 1e-13
            for h, h1 in zip(a, single):
                torch.testing.assert_close(h1[0], h[0], rtol=0, atol=1e-13)


def test_convmixer_per_sample_gradients_in_eval_mode_equal_one_sample_backward_passes():
    model = trained_statistics(convmixer()).eval()
    x, y = images(7)
    sg = state_gradients(model.forward_states, x, y, chunk=3)
    assert sg.layout == "maps" and sg.n_layers == 4
    for i in range(x.shape[0]):
        states, logits = model.forward_states(x[i:i + 1])
        grads = torch.autograd.grad(F.cross_entropy(logits, y[i:i + 1]), states)
        for l, (h, g) in enumerate(zip(states, grads)):
            torch.testing.assert_close(sg.states[l][i], h.detach()[0].mean(dim=(1, 2)),
                                       rtol=1e-12, atol=1e-14)
            want = g[0].mean(dim=(1, 2)) / 128
            assert float(want.abs().max()) > 1e-8
            torch.testing.assert_close(sg.grads[l][i], want, rtol=1e-10, atol=1e-16)
    assert all(p.grad is None for p in model.parameters())


def test_feature_rows_round_trip_every_layout():
    maps = torch.randn(3, 5, 2, 4).contiguous(memory_format=torch.channels_last)
    rows = feature_rows(maps)
    assert rows.shape == (3, 8, 5)
    assert torch.equal(rows[1, 1 * 4 + 3], maps[1, :, 1, 3])  # position (1, 3) of sample 1
    assert torch.equal(from_feature_rows(rows, maps), maps)
    for other in (torch.randn(3, 5), torch.randn(3, 7, 5)):
        assert feature_rows(other) is other and from_feature_rows(other, other) is other


def test_eval_mode_restores_the_training_flag():
    model = convmixer()
    for training in (True, False):
        model.train(training)
        with measurement_mode(model):
            assert not model.training and not model.blocks[0].bn.training
        assert model.training == training and model.blocks[0].bn.training == training


def test_restored_buffers_keeps_statistics_and_a_graph_usable():
    model = convmixer()
    before = {n: b.clone() for n, b in model.named_buffers()}
    x, y = images()
    with restored_buffers(model):
        loss = F.cross_entropy(model(x), y)
        assert not torch.equal(model.embed.bn.running_mean, before["embed.bn.running_mean"])
    for name, buffer in model.named_buffers():
        assert torch.equal(buffer, before[name]), name
    loss.backward()  # the graph built inside is still valid
    assert model.blocks[0].dw.weight.grad is not None


# --- ViT-Mini on other image shapes -----------------------------------------------------------
@pytest.mark.parametrize("shape,patch,tokens", [((1, 28, 28), 4, 50), ((1, 28, 28), 7, 17),
                                                ((3, 32, 32), 4, 65), ((2, 8, 12), 4, 7)])
def test_vit_tokens_for_any_image_shape(shape, patch, tokens):
    model = ViTMini(C, 16, 2, heads=2, mlp_ratio=2, patch=patch, image_shape=shape).double()
    x, y = images(3, shape)
    states, logits = model.forward_states(x)
    assert all(h.shape == (3, tokens, 16) for h in states) and logits.shape == (3, C)
    # the position embedding has one row per token
    assert model.embed.pos.shape == (1, tokens, 16)


@pytest.mark.parametrize("make", [
    lambda: ViTMini(C, 16, 2, heads=2, mlp_ratio=2, image_shape=(3, 32, 32)),
    lambda: ConvMixer(C, 8, 2, patch=4, kernel=3, image_shape=(3, 32, 32)),
])
def test_flat_inputs_are_viewed_as_3x32x32_images(make):
    torch.manual_seed(0)
    model = make().double().eval()
    x, _ = images(3, (3, 32, 32))
    torch.testing.assert_close(model(x.flatten(1)), model(x), rtol=0, atol=0)


def test_image_shape_of_inputs():
    assert image_shape((1, 28, 28), "vit", 7) == (1, 28, 28)
    assert image_shape((3072,), "convmixer", 4) == (3, 32, 32)
    with pytest.raises(ConfigError, match="needs images, and the data holds feature vectors"):
        image_shape((40,), "vit", 4)
    with pytest.raises(ConfigError, match="model.patch=5 does not divide the 28×28"):
        image_shape((1, 28, 28), "convmixer", 5)


def test_build_model_image_architectures():
    vit = build_model(ModelConfig(arch="vit", d=16, n_blocks=2, heads=2, patch=7),
                      input_shape=(1, 28, 28), n_classes=10)
    assert isinstance(vit, ViTMini) and vit.embed.pos.shape == (1, 17, 16)
    mixer = build_model(ModelConfig(arch="convmixer", d=8, n_blocks=3, kernel=3, out_ln=False),
                        input_shape=(3072,), n_classes=10)
    assert isinstance(mixer, ConvMixer) and mixer.n_blocks == 3 and mixer.out_ln is None
    assert mixer.embed.image_shape == (3, 32, 32) and mixer.blocks[0].dw.kernel_size == (3, 3)
    with pytest.raises(ConfigError, match="not divisible by model.heads"):
        build_model(ModelConfig(arch="vit", d=10, heads=4), input_shape=(1, 28, 28),
                    n_classes=10)


# --- configs ------------------------------------------------------------------------------
@pytest.mark.parametrize("raw,message", [
    ({"model": {"arch": "convmixer"}, "data": {"name": "mnist1d"}}, "holds feature vectors"),
    ({"model": {"arch": "vit"}}, "set data.in_dim=3072"),
    ({"model": {"arch": "vit", "patch": 5},
      "data": {"name": "fashion-mnist", "data_dir": "x"}},
     "model.patch=5 does not divide the 28×28 images: use one of 1, 2, 4, 7, 14, 28"),
    ({"model": {"arch": "convmixer", "patch": 3}, "data": {"in_dim": 3072}}, "1, 2, 4, 8"),
    ({"model": {"arch": "vit", "d": 30, "heads": 4}, "data": {"in_dim": 3072}},
     "model.d=30 is not divisible by model.heads=4"),
])
def test_plan_refuses_images_archs_on_what_they_cannot_read(raw, message):
    with pytest.raises(ConfigError) as err:
        plan_run(config_from_dict(raw))
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("arch", ["vit", "convmixer"])
@pytest.mark.parametrize("data", [{"name": "mnist", "data_dir": "x"},
                                  {"name": "cifar10", "data_dir": "x"},
                                  {"name": "synthetic", "in_dim": 3072}])
def test_config_accepts_image_archs_on_image_data(arch, data):
    config = config_from_dict({"model": {"arch": arch}, "data": data})
    assert config.model.arch == arch
    if data["name"] == "synthetic":  # the file datasets' folder "x" does not exist
        assert plan_run(config).architecture.input_kind == "image"


# --- every rule on both image architectures, through the training loop ---------------------
TINY = {"data.n_train": 256, "data.n_test": 128, "data.in_dim": 3072,
        "data.teacher_width": 32, "model.d": 8, "model.n_blocks": 2, "model.patch": 8,
        "optim.epochs": 1, "optim.batch_size": 64, "diagnostics.eval_samples": 128,
        "diagnostics.rho_samples": 16, "diagnostics.rho_directions": 2,
        "diagnostics.null_draws": 2, "run.progress": False}
# Options only some architectures and rules read: given to those that do.
OWN = {"model.heads": 2, "model.mlp_ratio": 2, "model.kernel": 3, "method.bridge_hidden": 16}


def tiny(out_dir, arch: str, **overrides) -> RunConfig:
    method = overrides.get("method.name", "bp")
    reads = {*architecture(arch).option_names(), *rule_class(method).option_names()}
    own = {k: v for k, v in OWN.items() if k.split(".")[1] in reads}
    return RunConfig().replace(**{**TINY, **own, "model.arch": arch,
                                  "run.out_dir": str(out_dir), **overrides})


@pytest.mark.parametrize("arch", ["convmixer", "vit"])
@pytest.mark.parametrize("method", rule_names())
def test_every_rule_trains_and_is_audited_on_image_architectures(tmp_path, arch, method):
    result = train(tiny(tmp_path, arch, **{"method.name": method}))
    record = result.record
    assert result.status == "completed", record.error
    assert [e.epoch for e in record.log] == [0, 1]
    last = record.log[-1].measures
    assert last is not None and len(last.hidden_norms) == 3
    assert all(v > 0 for v in last.hidden_norms)
    assert len(last.cos_per_layer) == 3 and record.log[-1].protocol is not None
    if method == "bp":
        assert all(c == pytest.approx(1.0, abs=1e-5) for c in last.cos_per_layer)
    assert record.diagnostics.bp_cosine is not None and "credit_quality_error" not in \
        record.diagnostics.to_dict()


def test_measuring_never_moves_batchnorm_statistics(tmp_path):
    trainer = Trainer(tiny(tmp_path, "convmixer", **{"method.name": "dfa"}))
    trainer.train_epoch(1)
    before = {n: b.clone() for n, b in trainer.model.named_buffers()}
    assert trainer.model.training
    trainer.measure(1)
    assert trainer.model.training  # restored
    for name, buffer in trainer.model.named_buffers():
        assert torch.equal(buffer, before[name]), name


def test_diagnostics_do_not_change_convmixer_training(tmp_path):
    base = {"method.name": "dfa", "optim.epochs": 3, "diagnostics.end_of_run": False}
    every = train(tiny(tmp_path, "convmixer", **base, **{"diagnostics.every": 1}))
    rarely = train(tiny(tmp_path, "convmixer", **base, **{"diagnostics.every": 100,
                                                          "diagnostics.protocol_every": 0}))
    a = load_checkpoint(every.run_dir / CHECKPOINT_FILE)["model"]
    b = load_checkpoint(rarely.run_dir / CHECKPOINT_FILE)["model"]
    assert a.keys() == b.keys() and "blocks.0.bn.running_var" in a
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("method", ["dfa", "ep"])
def test_kill_and_resume_keeps_batchnorm_statistics(tmp_path, kill_run_at, method):
    options = {"method.name": method, "optim.epochs": 3}
    if method == "ep":
        options["method.ep_steps"] = 3
    straight = train(tiny(tmp_path / "a", "convmixer", **options))
    config = tiny(tmp_path / "b", "convmixer", **options)
    kill_run_at(config)
    resumed = train(config, resume=True)
    assert comparable(resumed.record) == comparable(straight.record)
    assert comparable(load_record(tmp_path / "b" / run_id(config))) == \
        comparable(straight.record)
    a = load_checkpoint(straight.run_dir / CHECKPOINT_FILE)["model"]
    b = load_checkpoint(resumed.run_dir / CHECKPOINT_FILE)["model"]
    for key in a:
        assert torch.equal(a[key], b[key]), key


# --- the rules' credits on feature maps -----------------------------------------------------
def rule_for(model, name: str):
    return build_rule(model, MethodConfig(name=name), n_classes=C, seed=7)


def test_dfa_credit_is_broadcast_over_positions():
    model = convmixer().eval()
    rule = rule_for(model, "dfa")
    x, y = images()
    credits = rule.credits(x, y)
    with torch.no_grad():
        e = torch.softmax(model(x), 1) - F.one_hot(y, C).to(F64)
    for a, b in zip(credits, rule.feedback):
        assert a.shape == (6, 8, 4, 4)
        assert torch.equal(a, a[:, :, :1, :1].expand_as(a))
        torch.testing.assert_close(a[:, :, 0, 0], e @ b.to(F64), rtol=1e-12, atol=0)


def test_fa_credit_is_exact_on_top_and_fed_back_along_channels():
    model = trained_statistics(convmixer()).eval()
    rule = rule_for(model, "fa")
    x, y = images()
    credits = rule.credits(x, y)
    g = bp_state_gradients(model, x, y)
    torch.testing.assert_close(credits[-1], g[-1], rtol=1e-12, atol=0)
    for l, b in enumerate(rule.feedback):
        # a_l = B_l a_{l+1} at every pixel
        want = torch.einsum("bchw,dc->bdhw", credits[l + 1], b.to(F64))
        torch.testing.assert_close(credits[l], want, rtol=1e-12, atol=1e-18)


def test_held_batch_statistics_make_later_passes_per_sample_functions():
    """The first pass inside the block is an ordinary training forward; later passes
    normalise with its batch statistics, so they reproduce it on its inputs, a sample's
    states no longer depend on the rest of the batch, and no buffer moves."""
    model = trained_statistics(convmixer()).train()
    reference = copy.deepcopy(model)
    x, _ = images(8)
    moved = x.clone()
    moved[1:] = 10.0 * torch.randn_like(moved[1:])
    with torch.no_grad():
        want, _ = reference.forward_states(x)
        with held_batch_statistics(model):
            first, _ = model.forward_states(x)
            buffers = [b.clone() for b in model.buffers()]
            again, _ = model.forward_states(x)
            other, _ = model.forward_states(moved)
            assert all(torch.equal(a, b) for a, b in zip(buffers, model.buffers()))
    for a, b, c, d in zip(want, first, again, other):
        assert torch.equal(a, b)  # the first pass is the class's own forward
        torch.testing.assert_close(c, b, rtol=0, atol=1e-12)
        torch.testing.assert_close(d[0], b[0], rtol=0, atol=1e-12)
    for a, b in zip(model.buffers(), reference.buffers()):
        assert torch.equal(a, b)
    assert "forward" not in vars(model.blocks[0].bn)  # the class's forward is back
    with torch.no_grad():
        gap = float((model.forward_states(moved)[0][-1][0] - first[-1][0]).abs().max())
    assert gap > 1e-2  # and batch statistics mix the samples again


def test_ep_on_convmixer_in_training_mode_converges_to_the_held_statistics_gradient():
    """With the free phase's batch statistics held, the nudged energy is a sum of per-sample
    energies and EP's weight update tends to the gradient of the network that holds them
    (without holding them the relaxation of this model diverged: ‖∇F‖ end/start 1e5)."""
    model = trained_statistics(convmixer()).train()
    reference = copy.deepcopy(model)
    rule = build_rule(model, MethodConfig(name="ep", ep_steps=150, ep_beta=1e-3), n_classes=C,
                      seed=7)
    x, y = images(8)
    rule.train_step(x, y, torch.optim.SGD(rule.trainable_parameters(), lr=0.0))
    assert rule.end_epoch(0, 1)["ep_relax_grad_ratio"] < 0.02
    with held_batch_statistics(reference):
        with torch.no_grad():
            reference.forward_states(x)
        F.cross_entropy(reference(x), y).backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        cos = F.cosine_similarity(p.grad.flatten(), q.grad.flatten(), dim=0)
        assert float(cos) > 0.9995, name
        assert 0.98 < float(p.grad.norm() / q.grad.norm()) < 1.02, name


def test_ep_moves_batchnorm_statistics_once_per_step():
    model = convmixer()
    rule = build_rule(model, MethodConfig(name="ep", ep_steps=4), n_classes=C, seed=7)
    reference = copy.deepcopy(model)
    x, y = images(8)
    with torch.no_grad():
        reference.forward_states(x)  # one training forward: what BatchNorm should see
    rule.train_step(x, y, torch.optim.SGD(rule.trainable_parameters(), lr=0.0))
    for (name, a), b in zip(model.named_buffers(), reference.buffers()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("name", ["state-bridge", "credit-bridge"])
def test_bridges_score_feature_maps_per_position(name):
    """The bridges' nets see one row per position: moving one position of one sample changes
    that sample's value/prediction at that position's rows only."""
    model = convmixer().eval()
    extra = {"warmup_fraction": 0.0} if name == "credit-bridge" else {}
    rule = build_rule(model, MethodConfig(name=name, bridge_hidden=16, **extra),
                      n_classes=C, seed=7)
    x, y = images()
    with torch.no_grad():
        states, logits = model.forward_states(x)
    h = states[1]
    e = torch.softmax(logits, 1) - F.one_hot(y, C).to(F64)
    moved = h.clone()
    moved[2, :, 1, 3] += torch.arange(8, dtype=F64)  # not a shift LN(h) would remove
    if name == "state-bridge":
        net = rule.predictor
        a, b = net(h, 1, e), net(moved, 1, e)
        changed = (a - b).abs().sum(dim=1)  # (B, H, W)
        assert changed[2, 1, 3] > 0 and changed.sum() == changed[2, 1, 3]
    else:
        a, b = rule.value(h, 1, e), rule.value(moved, 1, e)
        assert a.shape == (6,) and (a != b).tolist() == [False, False, True, False, False,
                                                         False]


def test_the_synthetic_hint_to_view_inputs_as_images_is_given_only_until_followed():
    """in_dim=256 gets the hint to set data.in_dim=3072; at 3072 the inputs are images
    already, and a patch that does not divide them is refused without it."""
    from creditaudit.run.plan import plan_run

    hint = "set data.in_dim=3072 to view its inputs as 3×32×32 images"
    base = {"model.arch": "convmixer", "model.d": 16, "model.n_blocks": 2}
    with pytest.raises(ConfigError, match=re.escape(hint)):
        plan_run(RunConfig().replace(**base))
    with pytest.raises(ConfigError) as error:
        plan_run(RunConfig().replace(**base, **{"data.in_dim": 3072, "model.patch": 5}))
    assert str(error.value).startswith("model.patch=5 does not divide the 32×32 images")
    assert hint not in str(error.value)


def test_w2_std_starts_the_layers_its_help_names():
    """model.w2_std sets ViT-Mini's MLP output *and* attention output projection (both end
    the branch's two summands) and ConvMixer's pointwise convolution, as its help says."""
    import dataclasses

    from creditaudit.models.registry import ViTOptions
    help_text = {f.name: f.metadata["help"] for f in dataclasses.fields(ViTOptions)}["w2_std"]
    assert "attention" in help_text and "pointwise" in help_text
    vit = ViTMini(n_classes=C, d=8, n_blocks=2, heads=2, mlp_ratio=2, patch=2,
                  image_shape=(2, 8, 8), w2_std=0.0)
    zero = {name for name, p in vit.named_parameters() if p.dim() > 1 and not p.any()}
    assert zero - {"embed.cls_token"} == {f"blocks.{l}.{m}.weight" for l in range(2)
                                          for m in ("proj", "w2")}
    mixer = convmixer(w2_std=0.0)
    zero = {name for name, p in mixer.named_parameters() if p.dim() > 1 and not p.any()}
    assert zero == {f"blocks.{l}.pw.weight" for l in range(3)}


def test_an_image_architecture_is_given_the_shape_the_dataset_declares():
    """docs/extending.md: build (and check) get the declared shape, flat features too."""
    from pathlib import Path

    from creditaudit.models.registry import (
        Architecture,
        ResidualOptions,
        ResMLPArchitecture,
        build_architecture,
    )

    seen: list[tuple[int, ...]] = []

    class Probe(Architecture[ResidualOptions]):
        name, input_kind = "image-probe", "image"

        def build(self, *, input_shape, n_classes):
            seen.append(tuple(input_shape))
            return ResMLPArchitecture(self.options).build(input_shape=input_shape,
                                                          n_classes=n_classes)

    options = RunConfig().replace(**{"model.d": 4, "model.n_blocks": 1}).model
    for shape in [(3072,), (1, 8, 8)]:
        model = build_architecture(Probe(options), input_shape=shape, n_classes=C)
        assert model.input_shape == shape
    assert seen == [(3072,), (1, 8, 8)]
    text = (Path(__file__).parents[1] / "docs" / "extending.md").read_text()
    assert "`(3072,)` for the synthetic task's features" in " ".join(text.split())
