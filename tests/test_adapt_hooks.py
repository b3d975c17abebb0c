"""A user's full backward hook meets adapt()'s probe: the probe reads each state detached to
find the segments, and must not hand a hook on the module reading a state a None gradient
it never sees when the network trains end to end (a hook written ``grad_input[0] * 0.5``
would crash there and adapt would blame the network)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from creditaudit import adapt, rule

pytestmark = pytest.mark.usefixtures("single_thread")


def hooked_net(seen: list[bool]) -> nn.Sequential:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))

    def scaled(module: nn.Module, grad_input, grad_output):
        seen.append(grad_input[0] is None)
        return (grad_input[0] * 0.5,)  # assumes, as training shows, a gradient is given

    for reads_a_state in (net[2], net[4]):
        reads_a_state.register_full_backward_hook(scaled)
    return net


def test_the_probe_gives_no_backward_hook_a_none_gradient_input():
    seen: list[bool] = []
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    model = adapt(hooked_net(seen), ["1", "3"], example=x)
    assert seen and not any(seen)
    assert model.segment_parameters(0) and model.segment_parameters(1)  # segments found
    seen.clear()
    bp = rule("bp", model)
    bp.train_step(x, y, torch.optim.SGD(bp.trainable_parameters(), lr=0.1))
    assert seen and not any(seen)  # nor does training end to end
