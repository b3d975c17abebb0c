"""Model contract tests: ResidualMLP, ViT-Mini, the contract helpers and the synthetic task.

Identities are checked in float64 so that "equal" means equal to rounding, not to fp32 noise.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from creditaudit.config import ModelConfig, RunConfig
from creditaudit.data.synthetic import Teacher, make_teacher_student, phi_alpha
from creditaudit.errors import ConfigError, ModelContractError
from creditaudit.models import (
    ResidualMLP,
    ViTMini,
    build_model,
    check_contract,
    set_trainable_blocks,
    summary_vectors,
)

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64


def tiny_mlp(**kwargs) -> ResidualMLP:
    torch.manual_seed(0)
    args = {"in_dim": 7, "d": 12, "n_classes": 5, "n_blocks": 3}
    args.update(kwargs)
    return ResidualMLP(**args).double()


def tiny_vit(**kwargs) -> ViTMini:
    torch.manual_seed(0)
    args = {"n_classes": 5, "d": 16, "n_blocks": 2, "heads": 2, "mlp_ratio": 2}
    args.update(kwargs)
    return ViTMini(**args).double()


# --- ResidualMLP ------------------------------------------------------------------------------
def expected_mlp_names(n_blocks: int, out_ln: bool) -> set[str]:
    names = {"embed.weight", "embed.bias", "out_head.weight", "out_head.bias"}
    for l in range(n_blocks):
        for sub in ("ln", "w1", "w2"):
            names |= {f"blocks.{l}.{sub}.weight", f"blocks.{l}.{sub}.bias"}
    if out_ln:
        names |= {"out_ln.weight", "out_ln.bias"}
    return names


@pytest.mark.parametrize("out_ln", [True, False])
def test_resmlp_parameter_names(out_ln):
    model = tiny_mlp(out_ln=out_ln)
    names = {name for name, _ in model.named_parameters()}
    assert names == expected_mlp_names(3, out_ln)
    if not out_ln:
        assert not any(name.startswith("out_ln") for name in names)
        assert model.out_ln is None


@pytest.mark.parametrize("w2_std", [0.01, 0.05])
def test_resmlp_w2_init(w2_std):
    torch.manual_seed(1)
    model = ResidualMLP(in_dim=4, d=256, n_classes=3, n_blocks=2, w2_std=w2_std)
    for block in model.blocks:
        w = block.w2.weight.detach().double()
        # 65536 i.i.d. normal entries: the sample std is within ~0.3% of the true one.
        assert abs(float(w.std()) / w2_std - 1.0) < 0.02
        assert abs(float(w.mean())) < 5 * w2_std / 256
        assert torch.count_nonzero(block.w2.bias) == 0


def manual_mlp_forward(model: ResidualMLP, x: torch.Tensor, residual: bool = True):
    h = x @ model.embed.weight.T + model.embed.bias
    states = [h]
    for block in model.blocks:
        z = F.layer_norm(h, (model.d,), block.ln.weight, block.ln.bias, eps=block.ln.eps)
        u = F.gelu(z @ block.w1.weight.T + block.w1.bias)
        f = u @ block.w2.weight.T + block.w2.bias
        h = h + f if residual else f
        states.append(h)
    if model.out_ln is not None:
        h = F.layer_norm(h, (model.d,), model.out_ln.weight, model.out_ln.bias,
                         eps=model.out_ln.eps)
    return states, h @ model.out_head.weight.T + model.out_head.bias


@pytest.mark.parametrize("out_ln", [True, False])
@pytest.mark.parametrize("residual", [True, False])
def test_resmlp_forward_states_matches_manual(out_ln, residual):
    model = tiny_mlp(out_ln=out_ln, residual=residual, w2_std=0.3)
    x = torch.randn(6, 7, dtype=F64)
    states, logits = model.forward_states(x)
    ref_states, ref_logits = manual_mlp_forward(model, x, residual=residual)
    assert len(states) == model.n_blocks + 1 == 4
    for h, ref in zip(states, ref_states):
        assert h.shape == (6, 12)
        torch.testing.assert_close(h, ref, rtol=0, atol=1e-12)
    assert logits.shape == (6, 5)
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-12)
    torch.testing.assert_close(model(x), logits, rtol=0, atol=0)


def test_resmlp_no_residual_state_is_branch():
    model = tiny_mlp(residual=False, w2_std=0.3)
    x = torch.randn(5, 7, dtype=F64)
    states, _ = model.forward_states(x)
    for l, block in enumerate(model.blocks):
        torch.testing.assert_close(states[l + 1], block(states[l]), rtol=0, atol=0)
    # …and with the skip it is h + f
    model.residual = True
    states, _ = model.forward_states(x)
    for l, block in enumerate(model.blocks):
        torch.testing.assert_close(states[l + 1], states[l] + block(states[l]), rtol=0, atol=0)


@pytest.mark.parametrize("model_fn,x_shape", [
    (lambda: tiny_mlp(w2_std=0.3), (4, 7)),
    (lambda: tiny_mlp(w2_std=0.3, out_ln=False, residual=False), (4, 7)),
    (lambda: tiny_vit(w2_std=0.3), (3, 3, 32, 32)),
])
def test_forward_from_every_layer(model_fn, x_shape):
    model = model_fn()
    x = torch.randn(*x_shape, dtype=F64)
    states, logits = model.forward_states(x)
    for l, h in enumerate(states):
        torch.testing.assert_close(model.forward_from(l, h), logits, rtol=0, atol=1e-12)
    torch.testing.assert_close(model.readout(states[-1]), logits, rtol=0, atol=0)


# --- ViT-Mini -----------------------------------------------------------------------------------
def test_vit_default_shapes():
    torch.manual_seed(0)
    model = ViTMini()
    assert model.d == 128 and model.n_blocks == 4
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        states, logits = model.forward_states(x)
    assert len(states) == 5
    for h in states:
        assert h.shape == (2, 65, 128)
    assert logits.shape == (2, 10)


def test_vit_logits_depend_only_on_cls_token():
    model = tiny_vit()
    x = torch.randn(3, 3, 32, 32, dtype=F64)
    states, logits = model.forward_states(x)
    h_last = states[-1].detach().clone()
    perturbed = h_last.clone()
    perturbed[:, 1:] += 100.0 * torch.randn_like(perturbed[:, 1:])
    torch.testing.assert_close(model.readout(perturbed), logits, rtol=0, atol=0)
    # …but the CLS token does matter
    moved = h_last.clone()
    moved[:, 0] += torch.randn_like(moved[:, 0])
    assert (model.readout(moved) - logits).abs().max() > 1e-3


def manual_vit_forward(model: ViTMini, x: torch.Tensor):
    emb = model.embed
    tokens = F.conv2d(x, emb.proj.weight, emb.proj.bias, stride=emb.proj.stride)
    tokens = tokens.flatten(2).transpose(1, 2)
    cls = emb.cls_token.expand(x.shape[0], 1, model.d)
    h = torch.cat([cls, tokens], dim=1) + emb.pos
    states = [h]
    for block in model.blocks:
        b, t, d = h.shape
        nh = block.heads
        z = block.ln1(h)
        q, k, v = (z @ block.qkv.weight.T + block.qkv.bias).split(d, dim=-1)
        q, k, v = (m.reshape(b, t, nh, d // nh).transpose(1, 2) for m in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // nh) ** 0.5, dim=-1)
        a = (att @ v).transpose(1, 2).reshape(b, t, d)
        a = a @ block.proj.weight.T + block.proj.bias
        m = block.ln2(h + a)
        m = F.gelu(m @ block.w1.weight.T + block.w1.bias) @ block.w2.weight.T + block.w2.bias
        h = h + a + m
        states.append(h)
    cls_out = model.out_ln(h[:, 0])
    return states, cls_out @ model.out_head.weight.T + model.out_head.bias


def test_vit_forward_states_matches_manual_loop():
    model = tiny_vit(w2_std=0.3)
    x = torch.randn(2, 3, 32, 32, dtype=F64)
    states, logits = model.forward_states(x)
    ref_states, ref_logits = manual_vit_forward(model, x)
    assert len(states) == len(ref_states) == 3
    for h, ref in zip(states, ref_states):
        assert h.shape == (2, 65, 16)
        torch.testing.assert_close(h, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-12)


@pytest.mark.parametrize("model_fn,x_shape", [
    (lambda: tiny_mlp(w2_std=0.3), (4, 7)),
    (lambda: tiny_vit(w2_std=0.3), (4, 3, 32, 32)),
])
def test_no_op_mixes_samples(model_fn, x_shape):
    model = model_fn()
    x = torch.randn(*x_shape, dtype=F64)
    states, logits = model.forward_states(x)
    x2 = x.clone()
    x2[1:] = 10.0 * torch.randn_like(x2[1:])
    states2, logits2 = model.forward_states(x2)
    for h, h2 in zip(states, states2):
        torch.testing.assert_close(h2[0], h[0], rtol=0, atol=1e-13)
        assert (h2[1] - h[1]).abs().max() > 1e-3
    torch.testing.assert_close(logits2[0], logits[0], rtol=0, atol=1e-13)
    # a batch of one gives the same sample outputs
    single, single_logits = model.forward_states(x[:1])
    for h, h1 in zip(states, single):
        torch.testing.assert_close(h1[0], h[0], rtol=0, atol=1e-13)
    torch.testing.assert_close(single_logits[0], logits[0], rtol=0, atol=1e-13)


# --- contract helpers ---------------------------------------------------------------------------
def test_student_is_a_preset_that_refuses_sizes_and_says_what_it_builds():
    # The preset fixes width, depth and the terminal LN: asking for others is an error, not
    # a config that claims d=64 beside a model of d=128.
    for key, value in (("model.d", 64), ("model.n_blocks", 2), ("model.out_ln", False)):
        with pytest.raises(ConfigError, match=rf"{key} is not read by student"):
            RunConfig().replace(**{"model.arch": "student", key: value})
    model = build_model(ModelConfig(arch="student"), input_shape=(20,), n_classes=10)
    assert isinstance(model, ResidualMLP)
    assert model.d == 128 and model.n_blocks == 4 and model.out_ln is None
    assert model.embed.in_features == 20 and model.out_head.out_features == 10
    assert not any(name.startswith("out_ln") for name, _ in model.named_parameters())
    facts = model.describe()
    assert (facts.arch, facts.d, facts.n_blocks, facts.terminal_ln) == ("student", 128, 4, False)
    assert facts.label == "StudentNet d=128 L=4 no out_LN"


def test_build_model_resmlp_flattens_input_shape():
    model = build_model(ModelConfig(arch="resmlp", d=8, n_blocks=3), input_shape=(3, 4, 5),
                        n_classes=7)
    assert model.embed.in_features == 60 and model.d == 8 and model.n_blocks == 3
    assert model.out_ln is not None


def test_summary_vectors_layouts():
    v = torch.randn(4, 6)
    assert summary_vectors(v) is v
    tokens = torch.randn(4, 9, 6)
    assert torch.equal(summary_vectors(tokens), tokens[:, 0])
    maps = torch.randn(4, 6, 3, 5)
    torch.testing.assert_close(summary_vectors(maps), maps.sum(dim=(2, 3)) / 15)
    assert summary_vectors(maps).shape == (4, 6)
    with pytest.raises(ModelContractError, match="not supported"):
        summary_vectors(torch.randn(4))
    with pytest.raises(ModelContractError):
        summary_vectors(torch.randn(2, 3, 4, 5, 6))


def test_check_contract():
    with pytest.raises(ModelContractError, match="embed"):
        check_contract(nn.Sequential(nn.Linear(3, 3), nn.ReLU()))
    model = tiny_mlp()
    assert check_contract(model) is model


@pytest.mark.parametrize("k", [0, 1, 2, 3, 4, None])
def test_set_trainable_blocks(k):
    model = tiny_mlp(n_blocks=4)
    set_trainable_blocks(model, k)
    n_frozen = 0 if k is None else 4 - k
    for index, block in enumerate(model.blocks):
        for p in block.parameters():
            assert p.requires_grad == (index >= n_frozen)
    for name, p in model.named_parameters():
        if not name.startswith("blocks."):
            assert p.requires_grad, name


def test_set_trainable_blocks_out_of_range():
    model = tiny_mlp(n_blocks=2)
    for bad in (-1, 3):
        with pytest.raises(ModelContractError, match="outside"):
            set_trainable_blocks(model, bad)


# --- teacher–student task -----------------------------------------------------------------------
def synth(**kw):
    args = {"n_train": 300, "n_test": 100, "in_dim": 16, "alpha": 1.0, "seed": 3,
            "teacher_width": 32, "teacher_depth": 2}
    args.update(kw)
    return make_teacher_student(**args)


def test_teacher_student_deterministic_per_seed():
    a, b = synth(), synth()
    for t1, t2 in zip(a, b):
        assert torch.equal(t1, t2)
    train_x, train_y, test_x, test_y = a
    assert train_x.shape == (300, 16) and test_x.shape == (100, 16)
    assert train_x.dtype == torch.float32 and train_y.dtype == torch.int64
    assert int(train_y.min()) >= 0 and int(train_y.max()) <= 9
    assert len(torch.unique(train_y)) > 3


def test_teacher_student_does_not_touch_global_rng():
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    synth()
    assert torch.equal(torch.rand(3), expected)


def test_teacher_student_seeds_differ():
    a, b = synth(seed=3), synth(seed=4)
    assert not torch.equal(a[0], b[0])
    assert not torch.equal(a[1], b[1])


def test_teacher_independent_of_n_train():
    small, large = synth(n_train=100), synth(n_train=300)
    assert torch.equal(small[0], large[0][:100])
    assert torch.equal(small[1], large[1][:100])


def test_alpha_changes_labels():
    y0, y1 = synth(alpha=0.0)[1], synth(alpha=1.0)[1]
    x0, x1 = synth(alpha=0.0)[0], synth(alpha=1.0)[0]
    assert torch.equal(x0, x1)  # same inputs, different teacher nonlinearity
    assert (y0 != y1).double().mean() > 0.05


def test_phi_alpha():
    z = torch.linspace(-3, 3, 13, dtype=F64)
    torch.testing.assert_close(phi_alpha(z, 0.0), z, rtol=0, atol=0)
    torch.testing.assert_close(phi_alpha(z, 1.0), torch.tanh(z), rtol=0, atol=0)
    torch.testing.assert_close(phi_alpha(z, 0.25), 0.75 * z + 0.25 * torch.tanh(z))


def double_teacher(alpha: float) -> Teacher:
    teacher = Teacher(12, 10, width=20, depth=2, alpha=alpha,
                      generator=torch.Generator().manual_seed(5))
    teacher.weights = [w.double() for w in teacher.weights]
    return teacher


def test_linear_teacher_at_alpha_zero():
    teacher = double_teacher(0.0)
    a, b = torch.randn(8, 12, dtype=F64), torch.randn(8, 12, dtype=F64)
    torch.testing.assert_close(teacher.logits(a + b), teacher.logits(a) + teacher.logits(b),
                               rtol=0, atol=1e-12)
    torch.testing.assert_close(teacher.logits(3.0 * a), 3.0 * teacher.logits(a),
                               rtol=0, atol=1e-12)
    # the teacher is one matrix: argmax labels are those of a linear map
    w_eff = teacher.weights[0] @ teacher.weights[1] @ teacher.weights[2]
    torch.testing.assert_close(teacher.logits(a), a @ w_eff, rtol=0, atol=1e-12)


def test_nonlinear_teacher_at_alpha_one():
    teacher = double_teacher(1.0)
    a, b = torch.randn(8, 12, dtype=F64), torch.randn(8, 12, dtype=F64)
    gap = (teacher.logits(a + b) - teacher.logits(a) - teacher.logits(b)).abs().max()
    assert gap > 0.1
