"""A user's full backward hook meets adapt()'s probe: the probe reads each state detached to
find the segments (as the local rules train), so a hook on the module reading a state is
given None for its input's gradient, which end-to-end training never gives it. A hook
written ``grad_input[0] * 0.5`` then raises: the line names the hook and its module, says
the probe gave it None, and how to make it safe — not "the network raised TypeError"."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from creditaudit import adapt, rule
from creditaudit.errors import ModelContractError

pytestmark = pytest.mark.usefixtures("single_thread")


def hooked_net(safe: bool) -> nn.Sequential:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))

    def scaled(module: nn.Module, grad_input, grad_output):
        if safe and grad_input[0] is None:
            return None
        return (grad_input[0] * 0.5,)

    net[2].register_full_backward_hook(scaled)
    return net


def test_a_backward_hook_that_cannot_take_none_is_named_with_the_probe_as_the_cause():
    with pytest.raises(ModelContractError) as error:
        adapt(hooked_net(safe=False), ["1", "3"], example=torch.randn(8, 6))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("the backward hook 'scaled' on '2' of Sequential raised "
                              "TypeError while adapt() probed it ("), message
    assert ("the probe reads each state detached, as the local rules (dfa, drtp, local-ce) "
            "do in training, so a hook on a module reading a state may be given None for its "
            "input's gradient (end-to-end training never gives it one); make the hook pass "
            "None through (if grad_input[0] is None: return None)") in message


def test_a_hook_that_passes_none_through_is_adapted_and_trains():
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    bp = rule("bp", adapt(hooked_net(safe=True), ["1", "3"], example=x))
    bp.train_step(x, y, torch.optim.SGD(bp.trainable_parameters(), lr=0.1))


def test_other_errors_of_the_network_are_still_its_own():
    class Broken(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 3)

        def forward(self, x):
            return self.c(self.b(self.a(x))) + None

    with pytest.raises(ModelContractError, match="^adapt\\(\\) ran Broken on example"):
        adapt(Broken(), ["a", "b"], example=torch.randn(8, 6))
