"""The reference gradient is verified before any protocol number: diagnose() refuses a model
whose backward is not autograd's (BioTorch layers, a torch.autograd.Function with its own
backward) in one line naming the module, passes healthy models — a grown stream and a
saturated softmax included — and leaves the model, its gradients and every RNG untouched.
With verify_reference=False the report says the reference was not verified; a ρ whose BP
control is below 0.9 is shown as invalid, with the reason."""

from __future__ import annotations

import contextlib
import io
import math
import os
import warnings
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit import adapt, diagnose, rule
from creditaudit.errors import ModelContractError
from creditaudit.measures.reference_check import ReferenceGradientError, check_reference
from creditaudit.models import ResidualMLP
from creditaudit.report import metrics_lines, render
from creditaudit.testing import CLASSES, tiny_batch, tiny_model

pytestmark = pytest.mark.usefixtures("single_thread")

ARCHS = ("resmlp", "vit", "convmixer")


def gradient_credit(net: nn.Module):
    """A credit function: the gradient through the model's own backward (BioTorch's FA
    credit on a converted model)."""
    def credit(x: Tensor, y: Tensor) -> list[Tensor]:
        with torch.enable_grad():
            states, logits = net.forward_states(x)
            grads = torch.autograd.grad(F.cross_entropy(logits, y, reduction="sum"), states)
        return list(grads)
    return credit


def converted(mode: str, dtype: torch.dtype = torch.float64) -> nn.Module:
    """A tiny ResidualMLP with every Linear converted by BioTorch to ``mode``."""
    if os.environ.get("CI"):
        import biotorch.module.biomodule as biomodule  # CI must run these, never skip them
    else:
        biomodule = pytest.importorskip("biotorch.module.biomodule")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # BioTorch uses deprecated module backward hooks
        bio = biomodule.BioModule(tiny_model(dtype=dtype), mode=mode,
                                  output_dim=CLASSES if mode == "dfa" else None)
    return bio.to(dtype)


class FeedbackLinear(torch.autograd.Function):
    """h·Wᵀ + b forward; the input's gradient through a fixed B instead of W (FA's backward)."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, bias: Tensor, feedback: Tensor) -> Tensor:
        ctx.save_for_backward(h, feedback)
        return h @ weight.T + bias

    @staticmethod
    def backward(ctx, grad: Tensor):
        h, feedback = ctx.saved_tensors
        return grad @ feedback, grad.flatten(0, -2).T @ h.flatten(0, -2), grad.sum(0), None


class FALinear(nn.Linear):
    """A Linear whose forward is exact and whose backward is Feedback Alignment's."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear.in_features, linear.out_features, dtype=linear.weight.dtype)
        self.load_state_dict(linear.state_dict())
        generator = torch.Generator().manual_seed(3)
        self.register_buffer("feedback", torch.randn(self.weight.shape, generator=generator,
                                                     dtype=self.weight.dtype))

    def forward(self, h: Tensor) -> Tensor:
        return FeedbackLinear.apply(h, self.weight, self.bias, self.feedback)


class ScaledGradient(torch.autograd.Function):
    """Identity forward, gradient × 3: a custom backward outside any module."""

    @staticmethod
    def forward(ctx, h: Tensor) -> Tensor:
        return h.clone()

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return 3 * grad


class ScaledSkipMLP(ResidualMLP):
    """A ResidualMLP whose residual add runs the branch through ScaledGradient."""

    def next_state(self, h: Tensor, branch: Tensor) -> Tensor:
        return h + ScaledGradient.apply(branch)


def refused(model: nn.Module, x: Tensor, y: Tensor, **kwargs) -> str:
    with pytest.raises(ReferenceGradientError) as error:
        diagnose(model, x, y, **kwargs)
    message = str(error.value)
    assert "\n" not in message
    assert message.endswith("pass verify_reference=False to audit it unverified"), message
    return message


# --- refused ----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["fa", "usf"])
def test_a_biotorch_model_is_refused_naming_the_layer(mode):
    """The outside tester's case: the "BP" reference through BioTorch's backward is the FA
    credit itself (cos +1.000 everywhere). State by state, the first state from the top
    that disagrees is h_L: the head's backward is BioTorch's; module by module (closures on
    a float32 model, which cannot be run on a float64 copy), the first converted layer
    between the states."""
    net = converted(mode).module
    x, y = tiny_batch()
    message = refused(net, x, y, credit=gradient_credit(net), metrics=True,
                      metric_options={"rho_samples": 9, "rho_directions": 4})
    assert message.startswith(f"BioTorch {mode} layer `out_head` replaces the backward, so "
                              "∂CE/∂h_l would be its own credit"), message
    assert "load_state_dict(bio.module.state_dict(), strict=False)" in message
    net = converted(mode, torch.float32).module
    message = refused(net, x.float(), y, states_fn=lambda xb: net.forward_states(xb))
    assert message.startswith(f"BioTorch {mode} layer `blocks.0.w1` replaces the backward")


def test_a_biotorch_backward_that_raises_names_the_layer():
    """BioTorch's DFA layers read a loss gradient that only a training forward sets: their
    backward raises in eval mode, and that is named too."""
    net = converted("dfa").module
    x, y = tiny_batch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        message = refused(net, x, y)
    assert message.startswith("BioTorch dfa layer `blocks.0.w1` replaces the backward (its "
                              "backward raised AttributeError"), message


@pytest.mark.parametrize("path", ["states", "modules"])
@pytest.mark.parametrize("arch", ARCHS)
def test_a_custom_function_with_its_own_backward_is_refused_naming_the_module(arch, path):
    """An exact forward with FA's backward in one Linear (block 1's last; ConvMixer's head):
    state by state the highest state that disagrees places it (h_1 below block 1, h_L below
    the head) and the module scan of that segment names the Linear; module by module
    (closures on a float32 model) it is named directly."""
    dtype = torch.float64 if path == "states" else torch.float32
    model = tiny_model(arch=arch, dtype=dtype)
    if arch == "convmixer":
        model.out_head = FALinear(model.out_head)  # ConvMixer's blocks are convolutions
        name = "out_head"
    else:
        model.blocks[1].w2 = FALinear(model.blocks[1].w2)
        name = "blocks.1.w2"
    x, y = tiny_batch(arch=arch, dtype=dtype)
    with torch.no_grad():  # the forward is exact: the same logits as the plain model
        assert torch.allclose(model(x), tiny_model(arch=arch, dtype=dtype)(x), rtol=0,
                              atol=1e-6)
    kwargs = {} if path == "states" else {"states_fn": lambda xb: model.forward_states(xb)}
    message = refused(model, x, y, **kwargs)
    assert message.startswith(f"the backward of module `{name}` (FALinear) is not the "
                              "gradient of its forward"), message


def test_a_custom_backward_outside_any_module_is_placed_between_two_states():
    torch.manual_seed(0)
    model = ScaledSkipMLP(6, 8, 4, 3).double()
    x, y = tiny_batch()
    message = refused(model, x, y)
    assert message.startswith("the backward between h_2 and h_3 is not the gradient of the "
                              "forward (no single module's backward differs"), message


@pytest.mark.parametrize("hook", ["register_full_backward_pre_hook", "global"])
def test_a_backward_hook_that_rescales_a_gradient_is_named(hook):
    """A module backward hook returning 3× the gradient: the module scan replays each
    module's forward without its hooks, so the refusal asked "a torch.autograd.Function
    with its own backward?"; it names the module holding the hook (or the global hook)."""
    model = tiny_model(arch="resmlp", dtype=torch.float64)
    x, y = tiny_batch()

    def tripled(module: nn.Module, grad_output: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        return tuple(None if g is None else 3 * g for g in grad_output)

    if hook == "global":
        handle = torch.nn.modules.module.register_module_full_backward_pre_hook(tripled)
    else:
        handle = model.blocks[1].register_full_backward_pre_hook(tripled)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # hooks firing on outputs whose inputs need no grad
            message = refused(model, x, y)
    finally:
        handle.remove()
    expected = ("a backward hook is registered for every module" if hook == "global"
                else "module `blocks.1` (MLPBlock) is not the gradient of its forward: it has "
                "a backward hook")
    assert "is not the gradient of " in message and expected in message, message
    assert "remove the hook" in message


class KernelGradient(torch.autograd.Function):
    """Identity forward; a backward right only where ``exact(grad)`` says so and 3× the
    gradient elsewhere: a hand-written kernel's bug on the inputs the float64 probes never
    give it."""

    @staticmethod
    def forward(ctx, h: Tensor, exact) -> Tensor:  # noqa: ANN001
        ctx.exact = exact
        return h.clone()

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return (grad if ctx.exact(grad) else 3 * grad), None


class KernelSkipMLP(ResidualMLP):
    """A ResidualMLP whose residual add runs the branch through :class:`KernelGradient`."""

    def next_state(self, h: Tensor, branch: Tensor) -> Tensor:
        return h + KernelGradient.apply(branch, self.exact)


def kernel_model(exact, dtype: torch.dtype = torch.float32) -> KernelSkipMLP:  # noqa: ANN001
    torch.manual_seed(0)
    model = KernelSkipMLP(6, 8, 4, 3).to(dtype)
    model.exact = exact
    return model


def everywhere(grad: Tensor) -> bool:
    return True


@pytest.mark.parametrize(("exact", "dtype"), [
    (lambda grad: grad.dtype == torch.float64, torch.float32),
    (lambda grad: grad.shape[0] <= 8, torch.float32),
    (lambda grad: grad.shape[0] <= 8, torch.float64),
], ids=["float64 only", "batches of 8 at most", "batches of 8 at most, float64 model"])
def test_a_backward_wrong_only_in_the_models_dtype_or_batch_is_refused(exact, dtype):
    """The float64 probes (four samples on a float64 copy) meet a right backward; the
    diagnostics, on the model's own dtype and batches of up to 512, would meet the wrong
    one. The backward as the diagnostics use it is compared with the verified one."""
    x, y = tiny_batch(dtype=dtype)
    assert x.shape[0] > 8
    message = refused(kernel_model(exact, dtype), x, y)
    kind = str(dtype).removeprefix("torch.")
    assert message.startswith(f"the model's own {kind} backward on a batch of {x.shape[0]} "
                              "samples, which the diagnostics use, differs at h_0 by"), message
    assert "depends on the dtype or the batch size" in message
    # the same kernel where it is right everywhere: verified, and the detail says how far
    report = diagnose(kernel_model(everywhere, dtype), x, y)
    check = report.metadata["reference_check"]
    assert check["verified"] and check["how"] == "states", check
    assert f"its own {kind} backward on a batch of {x.shape[0]} samples gives the same" \
        in check["detail"], check


class LoudSkipMLP(ResidualMLP):
    """A ResidualMLP whose residual adds 1e25 × the branch: its states pass float32's
    largest value by the third, where float64 holds them."""

    def next_state(self, h: Tensor, branch: Tensor) -> Tensor:
        return h + 1e25 * branch


def test_a_float32_backward_that_is_not_finite_is_not_said_to_agree():
    """Every comparison with NaN is False: a NaN float32 forward and backward was recorded
    as giving "the same gradients" as the verified float64 one."""
    torch.manual_seed(0)
    model = LoudSkipMLP(6, 8, 4, 3)
    x, y = tiny_batch(dtype=torch.float32)
    assert not bool(model.forward_states(x)[1].isfinite().all())
    check = check_reference(model, model.forward_states, x, y, forward_from=model.forward_from)
    assert check.how == "states", check
    assert "gives the same gradients" not in check.detail, check
    assert (f"its own float32 forward on a batch of {x.shape[0]} samples is not finite (it "
            "overflows), so its backward, which the diagnostics use, was not compared"
            ) in check.detail, check


class BatchMeanShift(nn.Module):
    """Subtracts half the batch mean in eval mode too: samples interact, so the model
    computes another function on another batch (its backward is autograd's)."""

    def forward(self, h: Tensor) -> Tensor:
        return h - 0.5 * h.mean(dim=0, keepdim=True)


def test_a_model_whose_samples_interact_is_verified_by_the_probes_alone():
    torch.manual_seed(0)
    model = ResidualMLP(6, 8, 4, 3).double()
    model.embed = nn.Sequential(model.embed, BatchMeanShift())
    x, y = tiny_batch()
    check = diagnose(model, x, y).metadata["reference_check"]
    assert check["verified"] and check["how"] == "states", check
    assert "backward on a batch" not in check["detail"], check


# --- passed -----------------------------------------------------------------------------------
@pytest.mark.parametrize("closure", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("arch", ARCHS)
def test_healthy_models_pass(arch, dtype, closure):
    """Bound methods give the float64 state-by-state check (on a copy when the model is
    float32), as do closures on a float64 model; closures on a float32 model, which a copy
    cannot run, the module-by-module check on a float64 copy of the modules."""
    model = tiny_model(arch=arch, dtype=dtype)
    x, y = tiny_batch(arch=arch, dtype=dtype)
    kwargs = {"states_fn": lambda xb: model.forward_states(xb)} if closure else {}
    report = diagnose(model, x, y, **kwargs)
    check = report.metadata["reference_check"]
    how = "modules" if closure and dtype == torch.float32 else "states"
    assert check["verified"] and check["how"] == how, check
    assert "not verified" not in report.diagnostic("b").reason


def extreme_model(margin: float) -> tuple[ResidualMLP, Tensor, Tensor]:
    """A float32 ResidualMLP whose stream has grown to ~1e7 behind its terminal LN (as a
    DFA run's does) and whose head is large enough that every kept sample is classified
    with a logit margin above ``margin``: a saturated softmax."""
    torch.manual_seed(2)
    model = ResidualMLP(6, 8, 4, 3).eval()
    with torch.no_grad():
        model.embed.weight.mul_(1e7)
        model.embed.bias.mul_(1e7)
        model.out_head.weight.mul_(30 if margin < 20 else 100)
        x = torch.randn(4096, 6)
        top = model(x).topk(2, dim=1)
        keep = (top.values[:, 0] - top.values[:, 1]) > margin
    return model, x[keep][:256], top.indices[keep][:256, 0]


@pytest.mark.parametrize(("margin", "how"), [(16.0, "states"), (40.0, "modules")])
def test_a_grown_stream_and_a_saturated_softmax_pass(margin, how):
    """‖h‖ ~ 1e7 and losses of 1e-7 down to 0: relative steps see the stream at unit scale,
    and where even float64 cannot resolve the loss (margin 40) the modules are compared."""
    model, x, y = extreme_model(margin)
    with torch.no_grad():
        losses = F.cross_entropy(model(x).double(), y, reduction="none")
    assert float(losses.max()) < 2e-7 and (margin < 20 or float(losses.max()) == 0.0)
    report = diagnose(model, x, y)
    assert report.hidden_norms[-1] > 1e6
    assert report.diagnostic("b").fired  # the reference sits at the numerical floor
    check = report.metadata["reference_check"]
    assert check["verified"] and check["how"] == how, check


def test_nothing_to_compare_is_reported_as_not_verified():
    """States computed without modules and no forward_from: nothing can be compared, and
    the report says so instead of claiming a verified reference."""
    torch.manual_seed(0)
    weights = nn.ParameterList([nn.Parameter(torch.randn(8, 5)), nn.Parameter(torch.randn(3, 8))])

    def states_fn(x: Tensor):
        h0 = F.linear(x, weights[0])
        h1 = h0 + torch.tanh(h0)
        return [h0, h1], F.linear(h1, weights[1])

    x, y = torch.randn(64, 5), torch.randint(0, 3, (64,))
    report = diagnose(weights, x, y, states_fn=states_fn)
    check = report.metadata["reference_check"]
    assert not check["verified"] and check["detail"].startswith("not verified: no module")
    assert "; reference gradient not verified: no module" in report.diagnostic("b").reason


# --- the opt-out and the report ---------------------------------------------------------------
def test_a_plain_copy_of_a_biotorch_model_is_audited_and_the_opt_out_says_unverified():
    """The fix the error names: the same weights in plain modules give the true reference
    (FA's credit no longer scores cos +1); the opt-out reproduces the tester's report, now
    saying the reference was not verified and that ρ is invalid where its BP control is."""
    bio = converted("fa").module
    plain = tiny_model()
    plain.load_state_dict(bio.state_dict(), strict=False)  # BioTorch's extra B is left out
    x, y = tiny_batch()
    with torch.no_grad():
        assert torch.equal(plain(x), bio(x))
    credit = gradient_credit(bio)
    options = {"rho_samples": 9, "rho_directions": 8}
    audited = diagnose(plain, x, y, credit=credit, metrics=True, metric_options=options)
    assert audited.metadata["reference_check"]["verified"]
    assert min(row["cos"] for row in audited.layer_cosines) < 0.9
    assert all(rho > 0.9 for rho in audited.metrics["rho_controls"]["bp"])

    unverified = diagnose(bio, x, y, credit=credit, metrics=True, metric_options=options,
                          verify_reference=False)
    assert unverified.metadata["reference_check"] == {
        "verified": False, "how": "skipped", "detail": "not verified (verify_reference=False)",
        "where": None}
    assert all(row["cos"] == pytest.approx(1.0) for row in unverified.layer_cosines)
    text = render(unverified, "text")
    assert "; reference gradient not verified (verify_reference=False)" in text
    assert not all(unverified.metrics["rho_measurable"])
    assert "ρ invalid at layer" in text and "[False" not in text


def test_rho_below_its_bp_control_is_shown_invalid_with_the_reason():
    metrics = {"bp_cosine": [1.0, 1.0, 1.0], "cosine_controls": {"random": [0.0, 0.0, 0.0]},
               "perturbation_rho": [0.512, 0.3, -0.2],
               "rho_controls": {"bp": [0.99, 0.4, 0.1], "random": [0.0, 0.0, 0.0]},
               "rho_measurable": [True, False, False]}
    lines = metrics_lines(metrics)
    assert "  ρ per layer     [+0.512, invalid, invalid]  BP [+0.990, +0.400, +0.100]" in lines[2]
    assert lines[3].startswith("  ρ invalid at layer 1, 2: there even the reference gradient "
                               "as credit (the BP control) scores ρ < 0.9")
    metrics["rho_measurable"] = [True, True, True]
    assert len(metrics_lines(metrics)) == 3
    assert "[+0.512, +0.300, -0.200]" in metrics_lines(metrics)[2]


@pytest.mark.parametrize("measurable", [[True, False, True], [True, True, True]])
def test_rho_of_a_credit_without_a_direction_is_shown_invalid_with_its_own_reason(measurable):
    """ρ NaN at a layer whose credit is zero at every sample (its BP control passes) was
    shown as a bare "—" with nothing saying why; a record from before rho_measurable said
    so (all True) too. Both now read invalid there, with that reason, not the BP control's."""
    metrics = {"bp_cosine": [1.0, 1.0, 1.0], "cosine_controls": {"random": [0.0, 0.0, 0.0]},
               "perturbation_rho": [0.512, math.nan, 0.3],
               "rho_controls": {"bp": [0.99, 0.99, 0.99], "random": [0.0, 0.0, 0.0]},
               "rho_measurable": measurable}
    lines = metrics_lines(metrics)
    assert "  ρ per layer     [+0.512, invalid, +0.300]  BP [+0.990, +0.990, +0.990]" in lines[2]
    assert lines[3].startswith("  ρ invalid at layer 1: the credit there predicts no loss "
                               "change (it is zero at every sample")
    assert len(lines) == 4 and "BP control" not in lines[3]


def test_nudging_not_measurable_is_shown_with_the_reason():
    """Nudging NaN where even the BP step is below the precision's resolution (it read 0.0,
    a measured no-change, before) is named as not measurable, per η and layer."""
    metrics = {"bp_cosine": [1.0, 1.0, 1.0], "cosine_controls": {"random": [0.0, 0.0, 0.0]},
               "nudging": {"0.01": [math.nan, -1e-3], "0.1": [-2e-2, -1e-2]},
               "nudging_controls": {"bp": {"0.01": [math.nan, -2e-3], "0.1": [-3e-2, -2e-2]}}}
    lines = metrics_lines(metrics)
    assert lines[2] == "  nudging η=0.01  Δ [—, -1.00e-03]  BP [—, -2.00e-03]"
    assert lines[3].startswith("  nudging η=0.01 not measurable at layer 1: there even the "
                               "BP step changes the loss by less than the working precision "
                               "resolves")
    assert lines[4].startswith("  nudging η=0.1  Δ") and len(lines) == 5


def test_nudging_rows_read_as_numbers_not_as_a_python_list_of_strings():
    """The nudging line shows its Δ and BP rows as the other rows do ([+1.00e-03, …]); it
    printed Python's repr of a list of strings (['+1.00e-03', …]) before."""
    metrics = {"bp_cosine": [1.0, 1.0], "cosine_controls": {"random": [0.0, 0.0]},
               "nudging": {"0.1": [0.001, -0.0025]},
               "nudging_controls": {"bp": {"0.1": [-0.25, -0.125]}}}
    line = next(line for line in metrics_lines(metrics) if "nudging" in line)
    assert line == "  nudging η=0.1  Δ [+1.00e-03, -2.50e-03]  BP [-2.50e-01, -1.25e-01]"


# --- untouched --------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["states", "modules"])
def test_the_check_leaves_parameters_buffers_grads_hooks_and_rng_untouched(path):
    """On a float32 ConvMixer (BatchNorm buffers) in training mode, with .grad set: the
    check alone draws nothing from the global RNG, and diagnose() leaves everything as it
    was, the training flag and the (empty) hooks included."""
    model = tiny_model(arch="convmixer", dtype=torch.float32)
    x, y = tiny_batch(arch="convmixer", dtype=torch.float32)
    for index, p in enumerate(model.parameters()):
        p.grad = torch.full_like(p, float(index))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    grads = [p.grad.clone() for p in model.parameters()]
    kwargs = {} if path == "states" else {"states_fn": lambda xb: model.forward_states(xb)}
    forward_from = model.forward_from if path == "states" else None
    torch.manual_seed(1234)
    rng = torch.get_rng_state()
    model.eval()
    check = check_reference(model, kwargs.get("states_fn", model.forward_states), x, y,
                            forward_from=forward_from)
    assert check.verified and check.how == path
    assert torch.equal(torch.get_rng_state(), rng)
    model.train()
    diagnose(model, x, y, **kwargs)
    assert torch.equal(torch.get_rng_state(), rng) and model.training
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    for p, g in zip(model.parameters(), grads):
        assert torch.equal(p.grad, g)
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


class _PooledConvNet(nn.Module):
    """conv → relu (h_0) → conv (positive bias) → relu → 2×2 max-pool (h_1) → linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.relu1 = nn.Conv2d(1, 3, 3, padding=1), nn.ReLU()
        self.conv2, self.relu2 = nn.Conv2d(3, 4, 3, padding=1), nn.ReLU()
        self.pool, self.flat, self.head = nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 4 * 4, 10)
        with torch.no_grad():
            self.conv2.bias.fill_(1.0)  # tied windows sit at a positive value: a kink of max

    def forward(self, x: Tensor) -> Tensor:
        h = self.relu1(self.conv1(x))
        return self.head(self.flat(self.pool(self.relu2(self.conv2(h)))))


@pytest.mark.parametrize("jitter", [None, 0.0])
def test_a_correct_backward_on_real_images_with_a_constant_background_is_verified(
        monkeypatch, jitter):
    """A constant background (MNIST's) ties every max-pool window over it, where the forward
    has no gradient; the check probes just beside the data, so a plain network passes
    (LeNet-5 on MNIST was refused before: "between h_0 and h_1 … no single module")."""
    from creditaudit import adapt
    from creditaudit.measures import reference_check

    if jitter is not None:
        monkeypatch.setattr(reference_check, "PROBE_JITTER", jitter)
    torch.manual_seed(0)
    x = torch.full((8, 1, 8, 8), -0.42)
    x[:, :, :3, :3] += torch.rand(8, 1, 3, 3)  # a stroke in one corner, background elsewhere
    y = torch.randint(0, 10, (8,))
    model = adapt(_PooledConvNet().double(), ["relu1", "pool"], example=x.double())
    if jitter == 0.0:  # on the data itself the ties refuse a correct backward
        with pytest.raises(ReferenceGradientError):
            check_reference(model, model.forward_states, x.double(), y,
                            forward_from=model.forward_from)
    else:
        assert check_reference(model, model.forward_states, x.double(), y,
                               forward_from=model.forward_from).verified


class _LeNet(nn.Module):
    """conv → relu → 2×2 max-pool (h_0) → conv → relu → 2×2 max-pool (h_1) → linear, with
    ``states`` and no ``forward_from``: the reference is checked module by module."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.c2 = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(4 * 2 * 2, 3)

    def states(self, x: Tensor) -> tuple[list[Tensor], Tensor]:
        h0 = self.c1(x)
        h1 = self.c2(h0)
        return [h0, h1], self.head(h1.flatten(1))


def test_a_max_pool_after_a_relu_is_verified_module_by_module():
    """A ReLU's zeros tie the max-pool windows after it whatever the input (moving the
    probes off ties moved the network's input only): a plain conv → ReLU → max-pool net
    given with states_fn alone was refused as "the backward of module c2.2 (MaxPool2d) is
    not the gradient of its forward"."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = _LeNet().eval()
        x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 3, (16,))
    check = check_reference(model, model.states, x, y)
    assert check.verified and check.how == "modules", check


def kinked(kink: nn.Module, side: int) -> tuple[nn.Module, Tensor, Tensor]:
    """(conv → ReLU → ``kink`` → conv → ReLU → linear adapted with the ReLUs as states, x, y):
    ``side`` is the width of ``kink``'s output (4 ×4 inputs)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), kink,
                            nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                            nn.Linear(8 * side * side, CLASSES))
        x, y = torch.randn(16, 3, 4, 4), torch.randint(0, CLASSES, (16,))
    return adapt(net, ["1", "4"], example=x[:4]), x, y


@pytest.mark.parametrize("after", ["max-pool", "relu"])
def test_a_state_at_a_relus_zeros_before_a_kink_is_verified_state_by_state(after):
    """States at ReLU outputs (VGG's conv → ReLU → max-pool, adapted with the ReLUs as
    states) hold exact zeros whatever the input, so the next max-pool's windows or ReLU sit
    on a kink at the data: a plain autograd network was refused as "the backward between
    h_0 and … is not the gradient of the forward (… a torch.autograd.Function with its own
    backward …?)". The states are checked just beside the data too, as the inputs are."""
    model, x, y = kinked(nn.MaxPool2d(2) if after == "max-pool" else nn.ReLU(),
                         2 if after == "max-pool" else 4)
    check = check_reference(model, model.forward_states, x, y,
                            forward_from=model.forward_from)
    assert check.verified and check.how == "states", check


class TiedMaxPool(torch.autograd.Function):
    """2×2 max-pool whose backward gives each window's gradient to every input equal to its
    max (``dx = (x == max) * dy``, as code written from scratch does): the gradient where no
    window is tied, 4× it in a window of zeros."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        out = F.max_pool2d(x, 2)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        x, out = ctx.saved_tensors
        spread = {"scale_factor": 2, "mode": "nearest"}
        return (x == F.interpolate(out, **spread)).to(x.dtype) * F.interpolate(grad, **spread)


class ReluAtZero(torch.autograd.Function):
    """ReLU whose backward at an input exactly 0 is ``slope`` × the output's gradient."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, slope: float) -> Tensor:
        ctx.save_for_backward(x)
        ctx.slope = slope
        return x.clamp_min(0)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (x,) = ctx.saved_tensors
        return grad * ((x > 0).to(x.dtype) + ctx.slope * (x == 0).to(x.dtype)), None


class Applied(nn.Module):
    def __init__(self, function: type[torch.autograd.Function], *args: float) -> None:
        super().__init__()
        self.function, self.args = function, args

    def forward(self, x: Tensor) -> Tensor:
        return self.function.apply(x, *self.args)


@pytest.mark.parametrize(("kink", "side", "gradient"), [
    (Applied(TiedMaxPool), 2, False), (Applied(ReluAtZero, 6.0), 4, False),
    (Applied(ReluAtZero, -2.0), 4, False), (Applied(ReluAtZero, 1.0), 4, True)],
    ids=["tied-max-pool", "relu-6x-at-0", "relu-minus-2x-at-0", "relu-1-at-0"])
def test_a_backward_wrong_only_at_a_states_zeros_is_refused(kink, side, gradient):
    """The second look beside a state at a ReLU's zeros verified a backward that is the
    gradient everywhere but on those zeros — where the data puts every one of them: a
    hand-written max-pool giving every tied 0 its window's gradient (∂CE/∂h_0 at cos 0.92
    with torch's), a ReLU Function whose backward at 0 is 6× or −2× the output's. At the
    zeros a backward must be one side's slope along them; a ReLU's backward of 1 at 0 (the
    upper side's, a subgradient as torch's 0 is) is verified."""
    model, x, y = kinked(kink, side)
    if gradient:
        check = check_reference(model, model.forward_states, x, y,
                                forward_from=model.forward_from)
        assert check.verified and check.how == "states", check
        return
    with pytest.raises(ReferenceGradientError, match="the backward between h_0 and h_1 is "
                       "not the gradient of the forward"):
        check_reference(model, model.forward_states, x, y, forward_from=model.forward_from)


def test_a_hook_on_the_states_path_only_is_still_refused_beside_a_kink():
    """The second look beside a kinked state runs the network on from it: it is taken only
    where that backward is the states' own at the data, so a gradient hook that
    forward_states applies and forward_from does not is still placed between its states
    (not blamed on training mode by the later check of ∂CE/∂x)."""

    class HookedStates(ResidualMLP):
        def forward_states(self, x: Tensor) -> tuple[list[Tensor], Tensor]:
            states, logits = super().forward_states(x)
            if states[1].requires_grad:
                states[1].register_hook(lambda g: 3 * g)
            return states, logits

    torch.manual_seed(0)
    model = HookedStates(6, 8, CLASSES, 3).double()
    x, y = tiny_batch()
    with pytest.raises(ReferenceGradientError, match="the backward between h_0 and h_1 is "
                       "not the gradient of the forward"):
        check_reference(model, model.forward_states, x, y, forward_from=model.forward_from)


def old_style_normed(kind: str) -> nn.Sequential:
    """A network with torch.nn.utils.weight_norm or spectral_norm on its middle Linear: its
    ``weight`` is a plain attribute the pre-hook recomputes before every forward."""
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.nn.utils.weight_norm is deprecated
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(8, 16), nn.Sequential(nn.Linear(16, 16), nn.Tanh()),
                            nn.Sequential(nn.Linear(16, 16), nn.Tanh()), nn.Linear(16, 3))
        getattr(torch.nn.utils, kind)(net[1][0])
    return net


@pytest.mark.parametrize("kind", ["weight_norm", "spectral_norm"])
def test_an_old_style_normed_network_after_a_training_step_is_audited_with_metrics(kind):
    """After a forward with gradients its ``weight`` is a graph's output, which deepcopy
    refuses: the float64 copy of the metrics (diagnose(metrics=True), Recorder.finish())
    raised torch's RuntimeError with a traceback after the whole run."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(32, 8, generator=generator)
    y = torch.randint(0, 3, (32,), generator=generator)
    net = old_style_normed(kind)
    model = adapt(net, ["0", "1", "2"], example=x[:8])
    fa = rule("fa-linear", model)
    fa.train_step(x, y, torch.optim.SGD(fa.trainable_parameters(), lr=0.1))
    assert not net[1][0].weight.is_leaf  # what deepcopy refused
    report = diagnose(model, x, y, credit=fa, metrics=True,
                      metric_options={"rho_samples": 4, "rho_directions": 2, "etas": [0.01],
                                      "null_draws": 2})
    assert report.metadata["metrics_precision"] == "float64"
    assert not net[1][0].weight.is_leaf  # the model's own attribute is left as it was


def test_a_backward_hook_on_a_state_module_of_an_adapted_network_is_named():
    """A state module's backward pre-hook tripling its gradient: state by state the
    segment above it disagrees and no module replayed alone does; the refusal named no
    module ("a torch.autograd.Function with its own backward?") and now names the hook's."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.Sequential(nn.Linear(8, 8), nn.Tanh()),
                        nn.Sequential(nn.Linear(8, 8), nn.Tanh()), nn.Linear(8, CLASSES))
    net.double()
    net[2].register_full_backward_pre_hook(lambda module, grad: (3 * grad[0],))
    x, y = tiny_batch()
    model = adapt(net, ["0", "1", "2"], example=x[:4])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the hook fires on outputs whose inputs need no grad
        message = refused(model, x, y)
    assert "module `net.2` (Sequential) has a backward hook" in message, message


class CastsItsInput(nn.Module):
    """A float32 network whose forward casts its input (uint8 images: x.float() / 255)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Linear(6, 8), nn.Linear(8, CLASSES)
        self.block = nn.Sequential(nn.Linear(8, 8), nn.Tanh())

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.block(self.embed(x.float())))


class CastsItsLogits(CastsItsInput):
    """A float32 network that hands back float32 logits, as mixed-precision code does."""

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.block(self.embed(x))).float()


@pytest.mark.parametrize("net,found", [
    (CastsItsInput, "whose forward fails there (RuntimeError: mat1 and mat2 must have the "
                    "same dtype"),
    (CastsItsLogits, "whose forward computes its logits in float32")])
def test_a_forward_that_casts_to_its_own_dtype_cannot_be_verified_and_says_so(net, found):
    """The check runs a float64 copy. A forward casting its input raised torch's
    RuntimeError from deep inside diagnose() (and a Recorder); one casting its logits
    left float32 roundings the central differences read as a wrong backward: "the backward
    between h_1 and the logits is not the gradient of the forward" of a plain network.
    Checking module by module instead would pass a torch.autograd.Function the forward
    applies between two modules, so neither is verified: one line says why and the fix."""
    torch.manual_seed(0)
    x, y = tiny_batch(dtype=torch.float32)
    model = adapt(net(), ["embed", "block"], example=x[:4])
    message = refused(model, x, y)
    assert message.startswith("cannot verify the reference gradient: the check runs a float64 "
                              f"copy of {net.__name__}, {found}"), message
    assert "make the forward keep the dtype of its parameters" in message
    report = diagnose(model, x, y, verify_reference=False)  # unverified, as it says
    assert report.metadata["reference_check"]["verified"] is False
    if net is CastsItsInput:  # the end-of-run metrics' float64 copy fails the same way
        with pytest.raises(ModelContractError, match=r"^the end-of-run metrics \(ρ, nudging\) "
                           r"run a float64 copy of CastsItsInput, and its forward fails there"):
            diagnose(model, x, y, credit=rule("dfa", model), verify_reference=False,
                     metrics=True, metric_options={"rho_samples": 4, "null_draws": 2})
