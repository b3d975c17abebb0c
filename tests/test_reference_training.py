"""The reference check goes on in training mode: a model that alters its gradient only while
training (``if self.training: h.register_hook(lambda g: 3 * g)``) passes the eval-mode
check, yet bp and every rule would train with that gradient while the record says bp. On a
float64 copy, every forward from the same RNG state (dropout masks held fixed), ∂ΣCE/∂x is
compared with central differences of the loss; Dropout and BatchNorm in training mode are
no reason to refuse, and the caller's model and RNG stay as they were."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from creditaudit import adapt
from creditaudit.measures.reference_check import (
    ReferenceCheck,
    check_reference,
    checked_reference,
)
from creditaudit.measures.reference_modules import ReferenceGradientError

pytestmark = pytest.mark.usefixtures("single_thread")

IN_TRAINING = "in training mode (dropout masks held fixed) ∂CE/∂x agrees with them"


class Block(nn.Module):
    def __init__(self, hook: bool) -> None:
        super().__init__()
        self.linear, self.norm, self.drop = nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Dropout(0.3)
        self.hook = hook

    def forward(self, x: Tensor) -> Tensor:
        h = self.drop(torch.tanh(self.norm(self.linear(x))))
        if self.hook and self.training and h.requires_grad:
            h.register_hook(lambda g: 3 * g)  # the gradient altered in training only
        return h


class Net(nn.Module):
    def __init__(self, hook: bool = False) -> None:
        super().__init__()
        self.inp, self.b1, self.b2 = nn.Linear(6, 8), Block(hook), Block(False)
        self.head = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.b2(self.b1(self.inp(x))))


def adapted(hook: bool):
    torch.manual_seed(0)
    x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
    model = adapt(Net(hook), ["inp", "b1", "b2"], example=x[:8])
    model.eval()  # as the diagnostics run it
    return model, x, y


def test_a_gradient_altered_only_in_training_is_refused():
    model, x, y = adapted(hook=True)
    with pytest.raises(ReferenceGradientError) as error:
        check_reference(model, model.forward_states, x, y, forward_from=model.forward_from)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("the model's backward in training mode is not the gradient of "
                              "its forward"), message
    assert "if self.training: h.register_hook(…)" in message
    found = checked_reference(model, model.forward_states, x, y,
                              forward_from=model.forward_from, allow=True)
    assert (found.verified, found.how, found.where) == (False, "failed", "training mode")


def test_dropout_and_batchnorm_in_training_mode_pass_and_nothing_changes():
    model, x, y = adapted(hook=False)
    buffers = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    check = check_reference(model, model.forward_states, x, y, forward_from=model.forward_from)
    assert check.verified and check.how == "states"
    assert check.detail.endswith(IN_TRAINING + " at the probes' inputs"), check.detail
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(v, buffers[k]) for k, v in model.state_dict().items())
    assert not any(m.training for m in model.modules())


class Growing(nn.Module):
    """A scale that grows with every training-mode forward (a buffer updated in place)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.b1, self.head = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 3)
        self.register_buffer("gain", torch.ones(()))

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            self.gain.mul_(1.5)
        return self.head(torch.tanh(self.b1(self.inp(x) * self.gain)))


def test_a_forward_that_updates_its_buffers_in_training_is_one_function_per_pass():
    """Each central difference's forward grew the scale again, so the passes computed other
    functions and a plain backward was refused as not the gradient (the GrowingStem runs of
    test_stream_growth)."""
    torch.manual_seed(0)
    x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
    model = adapt(Growing(), ["inp", "b1"], example=x[:8])
    model.eval()
    gain = dict(model.named_buffers())["net.gain"].clone()
    check = check_reference(model, model.forward_states, x, y, forward_from=model.forward_from)
    assert check.verified and check.detail.endswith(IN_TRAINING + " at the probes' inputs")
    assert torch.equal(dict(model.named_buffers())["net.gain"], gain)  # the caller's model


class _Rounded(torch.autograd.Function):
    """A straight-through estimator: rounds in the forward, passes the gradient on as is."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # noqa: ANN001 - autograd's context
        return torch.round(x * 4) / 4

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:  # noqa: ANN001
        return g


class _TanhNoSlope(torch.autograd.Function):
    """tanh whose backward forgets tanh's slope."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # noqa: ANN001
        return torch.tanh(x)

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:  # noqa: ANN001
        return g


class Applied(nn.Module):
    def __init__(self, function: type[torch.autograd.Function]) -> None:
        super().__init__()
        self.function = function

    def forward(self, x: Tensor) -> Tensor:
        return self.function.apply(x)


def _wrong_before_first_state(function: type[torch.autograd.Function]) -> ReferenceGradientError:
    """The refusal of a network whose first state ('1') is a Function with its own backward."""
    torch.manual_seed(0)
    x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
    net = nn.Sequential(nn.Linear(6, 8), Applied(function), nn.Linear(8, 8), nn.Tanh(),
                        nn.Linear(8, 3))
    model = adapt(net, ["1", "3"], example=x[:8])
    model.eval()
    with pytest.raises(ReferenceGradientError) as error:
        check_reference(model, model.forward_states, x, y, forward_from=model.forward_from)
    return error.value


def test_a_backward_wrong_before_the_first_state_in_both_modes_is_not_blamed_on_training():
    """The eval-mode check compares at the states, after the wrong backward; the
    training-mode one, at the inputs, found it and said 'though in eval mode it is: a hook
    active only in training?' — sending the user after a self.training branch the model
    does not have. Now the module is named, or the place before h_0 when none can be."""
    named = _wrong_before_first_state(_TanhNoSlope)
    assert str(named).startswith("the backward of module `net.1` (Applied) is not the "
                                 "gradient"), named
    assert named.where == "net.1"
    placed = _wrong_before_first_state(_Rounded)  # round's slope is 0: no module to judge
    message = str(placed)
    assert "\n" not in message and "training mode" not in message
    assert message.startswith("the model's backward before h_0 is not the gradient of its "
                              "forward"), message
    assert "in eval mode as in training" in message
    assert placed.where == "before h_0"


class _CentredInputs(nn.Module):
    """A parameterless normalisation of the inputs under torch.no_grad(), then a stem."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 8)

    def forward(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            x = x - x.mean(dim=1, keepdim=True)
        return self.lin(x)


class _FrozenStem(nn.Module):
    """A frozen feature extractor run under torch.no_grad(), before the first state."""

    def __init__(self, detach_in_training_only: bool = False) -> None:
        super().__init__()
        self.lin, self.only_in_training = nn.Linear(6, 8), detach_in_training_only

    def forward(self, x: Tensor) -> Tensor:
        if self.only_in_training and not self.training:
            return self.lin(x)
        with torch.no_grad():
            return self.lin(x)


def _stem_check(stem: nn.Module) -> ReferenceCheck:
    """The check of a network whose first state ('1') follows ``stem``."""
    torch.manual_seed(0)
    x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
    net = nn.Sequential(stem, nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
    model = adapt(net, ["1", "3"], example=x[:8])
    model.eval()
    return check_reference(model, model.forward_states, x, y, forward_from=model.forward_from)


def test_a_stem_without_gradients_before_the_first_state_is_not_blamed_on_training():
    """A backbone run under torch.no_grad() before h_0: the training-mode check's own
    gradient at the inputs failed, and the model was refused with 'the reference gradient
    cannot be computed in training mode: the backward raised RuntimeError: The
    differentiated Tensor at index 0 appears to not have been used in the graph' — a
    training-mode fault the model does not have, and no way out. Now the layers before h_0
    are named, with the fix adapt gives a state computed so (freeze the parameters instead,
    which then passes); a stop of the gradient active only in training is still refused as
    training mode's."""
    with pytest.raises(ReferenceGradientError) as error:
        _stem_check(_FrozenStem())
    message = str(error.value)
    assert error.value.where == "before h_0" and "\n" not in message
    assert message.startswith("the loss does not reach the model's inputs through autograd, "
                              "in eval mode as in training, and parameter 'net.0.lin.weight' gets "
                              "no gradient though it counts as trained"), message
    assert "freeze its parameters (p.requires_grad_(False)) instead, which the record then " \
        "lists, or pass verify_reference=False" in message
    frozen = nn.Linear(6, 8).requires_grad_(False)
    assert _stem_check(frozen).verified  # the fix it names
    with pytest.raises(ReferenceGradientError) as error:
        _stem_check(_FrozenStem(detach_in_training_only=True))
    message = str(error.value)
    assert error.value.where == "training mode" and "\n" not in message
    assert message.startswith("in training mode the loss does not reach the model's inputs "
                              "through autograd, though in eval mode it does"), message
    assert "not been used in the graph" not in message


def test_a_parameterless_step_under_no_grad_before_the_stem_is_verified():
    """Inputs centred under torch.no_grad() before a trained stem: the loss reaches no input,
    but every parameter gets its gradient and the states' gradients are right. It was
    refused ('the reference gradient cannot be computed in training mode …', then 'the layers
    before the first state get no gradient'); training mode is now not checked at the inputs,
    and the eval-mode check at the states verifies the reference."""
    check = _stem_check(_CentredInputs())
    assert check.verified
    assert check.detail.endswith("in training mode (dropout masks held fixed) ∂CE/∂h_0 agrees "
                                 "with them at the probes' h_0 (the loss reaches no input)"), \
        check.detail


class _HookedInTraining(nn.Module):
    """A layer whose gradient is tripled in training mode only."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.lin(x))
        if self.training and h.requires_grad:
            h.register_hook(lambda g: 3 * g)
        return h


@pytest.mark.parametrize("detached", [False, True])
def test_a_training_only_hook_is_found_where_the_loss_reaches_no_input(detached: bool):
    """Inputs centred under torch.no_grad() (or x.detach()) before a trained stem, and a
    gradient tripled in training mode only above h_0: with nothing to compare at the inputs
    training mode went unchecked, and the model was recorded verified while bp trained with
    the tripled gradient. Training mode is now compared at h_0."""

    class Stem(_CentredInputs):
        def forward(self, x: Tensor) -> Tensor:
            return self.lin(x.detach()) if detached else super().forward(x)

    torch.manual_seed(0)
    x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
    net = nn.Sequential(Stem(), nn.Tanh(), _HookedInTraining(), nn.Linear(8, 3))
    model = adapt(net, ["1", "2"], example=x[:8])
    model.eval()
    with pytest.raises(ReferenceGradientError) as error:
        check_reference(model, model.forward_states, x, y, forward_from=model.forward_from)
    assert error.value.where == "training mode"
    assert str(error.value).startswith("the model's backward in training mode is not the "
                                       "gradient of its forward (along h_0 it disagrees")


def test_a_spare_head_is_no_stem_under_no_grad():
    """A parameter the forward never uses (a spare head) gets no gradient wherever the
    inputs are: with inputs centred under torch.no_grad() the model was refused, the spare
    head named as a stem before h_0 run under torch.no_grad() — the same model with plain
    inputs passes. Only parameters of modules the forward calls are asked about."""

    class SpareHead(_CentredInputs):
        def __init__(self) -> None:
            super().__init__()
            self.spare = nn.Linear(8, 3)

    assert _stem_check(SpareHead()).verified
