"""diagnose() on what a caller's own code does beyond its two-sample probe: a credit
function whose tensors change shape on the evaluation set is named in one line (not torch's
error deep in the cosines), and a plugin diagnostic that draws from the global RNG leaves
the caller's random stream as it was (diagnose promises every RNG state unchanged)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn

from creditaudit import diagnose
from creditaudit.config import opt
from creditaudit.errors import ConfigError, GuestError, ModelContractError
from creditaudit.protocol import Protocol, ProtocolDiagnostic

pytestmark = pytest.mark.usefixtures("single_thread")


class _Net(nn.Module):
    """A two-block residual MLP on 10 inputs, width 16, 3 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(10, 16)
        self.blocks = nn.ModuleList([nn.Linear(16, 16) for _ in range(2)])
        self.head = nn.Linear(16, 3)

    def states(self, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        h = self.inp(x)
        hs = [h]
        for block in self.blocks:
            h = h + torch.tanh(block(h))
            hs.append(h)
        return hs, self.head(h)


def _data(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(n, 10, generator=generator), torch.randint(0, 3, (n,),
                                                                  generator=generator)


def test_a_credit_shaped_right_on_the_probe_only_is_named_in_one_line():
    torch.manual_seed(0)
    net = _Net()
    x, y = _data()

    def credit(xb: torch.Tensor, yb: torch.Tensor) -> list[torch.Tensor]:
        width = 16 if xb.shape[0] <= 2 else 8  # right on the two-sample probe only
        return [torch.zeros(xb.shape[0], width) for _ in range(3)]

    with pytest.raises(ModelContractError) as caught:
        diagnose(net, x, y, states_fn=net.states, credit=credit)
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith("credit(x, y)[0] on a batch of 64 samples must have the shape of "
                           "h_0 (64, 16), got a tensor of shape (64, 8)")


def test_a_credit_returning_a_generator_after_the_probe_is_named():
    torch.manual_seed(0)
    net = _Net()
    x, y = _data()

    def credit(xb: torch.Tensor, yb: torch.Tensor):  # noqa: ANN202 - a generator, on purpose
        made = (torch.zeros(xb.shape[0], 16) for _ in range(3))
        return list(made) if xb.shape[0] <= 2 else made

    with pytest.raises(ModelContractError, match=r"credit\(x, y\) on a batch of 64 samples "
                                                 r"must return 3 tensors .* got generator"):
        diagnose(net, x, y, states_fn=net.states, credit=credit)


@dataclass
class _DrawOptions:
    cap: float = opt(2.0, "(r) fires above this", min=0.0)


class _Draws(ProtocolDiagnostic[_DrawOptions]):
    """A plugin diagnostic whose statistic draws from the global RNG."""

    name = "r"
    label = "random draw"
    statistic = "a uniform draw"
    operator, threshold = ">", "cap"
    hint = "never fires"

    def evaluate(self, evidence):  # noqa: ANN001, ANN201 - a plugin's evaluate
        return self.judge(float(torch.rand(())), "drew one number")


def test_a_plugin_diagnostic_drawing_from_the_rng_leaves_the_callers_stream():
    torch.manual_seed(0)
    net = _Net()
    x, y = _data()
    protocol = Protocol((*Protocol.default().diagnostics, _Draws()))
    before = torch.get_rng_state()
    report = diagnose(net, x, y, states_fn=net.states, protocol=protocol)
    assert report.diagnostic("r").status == "passed"
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("copy", [lambda h: h.clone(), lambda h: h.double()],
                         ids=["clone", "cast"])
def test_a_state_the_logits_are_not_computed_from_is_named_not_judged(copy):
    """A states_fn returning a copy of a state: no gradient reaches the copy, and (b) fired
    on its zero gradients as "zero or dead weights between h_L and the logits"."""
    torch.manual_seed(0)
    net = _Net()
    x, y = _data()

    def states(xb: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        hs, logits = net.states(xb)
        return [*hs[:-1], copy(hs[-1])], logits

    with pytest.raises(ModelContractError, match=r"^states_fn returned h_2, which the logits "
                                                 r"are not computed from \(a copy"):
        diagnose(net, x, y, states_fn=states)


def test_detached_logits_are_named():
    torch.manual_seed(0)
    net = _Net()
    x, y = _data()

    def states(xb: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        hs, logits = net.states(xb)
        return hs, logits.detach()

    with pytest.raises(ModelContractError, match=r"^states_fn returned logits without a graph"):
        diagnose(net, x, y, states_fn=states)


def test_diagnose_inside_inference_mode_says_so_not_that_the_states_are_detached():
    torch.manual_seed(0)
    net = _Net()
    x, y = _data()
    with torch.inference_mode(), pytest.raises(ConfigError, match=r"^diagnose\(\) takes "
                                                                  r"gradients of the loss, "
                                                                  r"which torch.inference_mode"):
        diagnose(net, x, y, states_fn=net.states)


@pytest.mark.parametrize("made_inside", ["eval_x", "eval_y"])
def test_evaluation_tensors_made_in_inference_mode_are_named(made_inside):
    """They failed in torch's own RuntimeError from the first backward."""
    torch.manual_seed(0)
    net = _Net()
    x, y = _data()
    with torch.inference_mode():
        inside = (x if made_inside == "eval_x" else y).clone()
    given = {"eval_x": x, "eval_y": y, made_inside: inside}
    with pytest.raises(ConfigError, match=rf"^{made_inside} was made inside "
                                          r"torch.inference_mode\(\).*\.clone\(\)"):
        diagnose(net, given["eval_x"], given["eval_y"], states_fn=net.states)


def test_metadata_naming_what_the_report_measures_is_refused():
    """metadata={"frozen_acc": 0.3} put 0.300 in the report's frozen-acc column while (d)
    said no frozen-blocks accuracy was given; n_samples named a count never evaluated."""
    torch.manual_seed(0)
    net = _Net()
    x, y = _data()
    for key, fix in (("frozen_acc", "pass frozen_acc="), ("n_samples", "the report measures")):
        with pytest.raises(ConfigError, match=rf"^metadata\['{key}'\] is what the report "
                                              rf"states itself \({fix}"):
            diagnose(net, x, y, states_fn=net.states, headline_acc=0.5,
                     metadata={"arch": "Net", key: 0.3})


@pytest.mark.parametrize("metadata", [{"epoch": torch.tensor(3)}, {"terminal_ln": "yes"},
                                      ["arch"]], ids=["tensor", "terminal_ln", "list"])
def test_metadata_a_report_cannot_hold_is_refused_before_the_work(metadata):
    """A tensor or numpy value made the report's JSON fail after the work was done, a
    non-bool terminal_ln its text; a list was a ValueError from dict.update."""
    torch.manual_seed(0)
    net = _Net()
    x, y = _data()
    with pytest.raises(ConfigError, match=r"^metadata"):
        diagnose(net, x, y, states_fn=net.states, metadata=metadata)


class _Switches(ProtocolDiagnostic[_DrawOptions]):
    """A caller's own diagnostic that switches torch's gradients off and leaves them so."""

    name = "s"
    label = "switch"
    statistic = "nothing"
    operator, threshold = ">", "cap"
    hint = "never fires"

    def evaluate(self, evidence):  # noqa: ANN001, ANN201 - a plugin's evaluate
        torch.set_grad_enabled(False)
        return self.judge(0.0, "switched gradients off")


def _settings() -> tuple:
    return (torch.is_grad_enabled(), torch.get_default_dtype(), torch.get_num_threads(),
            torch.are_deterministic_algorithms_enabled())


def test_a_diagnostic_that_changes_a_torch_setting_is_named_and_the_setting_put_back():
    net = _Net()
    x, y = _data()
    before = _settings()
    with pytest.raises(GuestError) as caught:
        diagnose(net, x, y, states_fn=net.states,
                 protocol=Protocol((*Protocol.default().diagnostics, _Switches())))
    text = str(caught.value)
    assert "\n" not in text and text.startswith("diagnostic 's' (") \
        and "_Switches) changed torch's grad mode from True to False" in text, text
    assert _settings() == before


def _threads(fn):  # noqa: ANN001, ANN202 - wraps any callable
    def changing(*args):  # noqa: ANN002, ANN202
        torch.set_num_threads(torch.get_num_threads() + 1)
        return fn(*args)
    return changing


def _deterministic(fn):  # noqa: ANN001, ANN202
    def changing(*args):  # noqa: ANN002, ANN202
        torch.use_deterministic_algorithms(True)
        return fn(*args)
    return changing


def _float64(fn):  # noqa: ANN001, ANN202
    def changing(*args):  # noqa: ANN002, ANN202
        torch.set_default_dtype(torch.float64)
        return fn(*args)
    return changing


@pytest.mark.parametrize("change", [_threads, _deterministic, _float64],
                         ids=["threads", "deterministic", "dtype"])
@pytest.mark.parametrize("where", ["credit", "states_fn", "forward_from"])
def test_a_caller_function_that_changes_a_torch_setting_leaves_the_callers_settings(
        where, change):
    """On return (refused, naming the suspects) and on an error alike, the caller's torch
    settings are as they were before diagnose()."""
    torch.manual_seed(0)
    net = _Net()
    x, y = _data()

    def forward_from(layer: int, h: torch.Tensor) -> torch.Tensor:
        for block in net.blocks[layer:]:
            h = h + torch.tanh(block(h))
        return net.head(h)

    functions = {"credit": lambda xb, yb: [h.detach() for h in net.states(xb)[0]],
                 "states_fn": net.states, "forward_from": forward_from}
    functions[where] = change(functions[where])
    before = _settings()
    with pytest.raises(GuestError) as caught:
        diagnose(net, x, y, metrics=True, metric_options={"rho_samples": 8,
                                                          "rho_directions": 2},
                 **functions)
    assert _settings() == before
    text = str(caught.value)
    assert "\n" not in text and "changed torch's" in text and where in text, text


def test_a_credit_that_changes_a_setting_and_raises_leaves_the_callers_settings():
    """Its own error stands (the caller's code, the caller's traceback); the setting is back."""
    torch.manual_seed(0)
    net = _Net()
    x, y = _data()

    def credit(xb: torch.Tensor, yb: torch.Tensor) -> list[torch.Tensor]:
        torch.set_default_dtype(torch.float64)
        if xb.shape[0] > 2:
            raise ValueError("the credit's own error")
        return [h.detach() for h in net.states(xb)[0]]

    before = _settings()
    with pytest.raises(ValueError, match="the credit's own error"):
        diagnose(net, x, y, states_fn=net.states, credit=credit)
    assert _settings() == before


def test_inputs_left_requiring_grad_are_measured_as_data_without_a_warning():
    # diagnose(x.requires_grad_()) printed torch's "Converting a tensor with
    # requires_grad=True to a scalar" warning from the reference check, and the report
    # equals the one on the same data not requiring grad
    import warnings

    torch.manual_seed(0)
    net = _Net()
    x, y = _data(128)
    plain = diagnose(net, x, y, states_fn=net.states)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        asked = diagnose(net, x.clone().requires_grad_(), y, states_fn=net.states)
    assert asked.to_dict() == plain.to_dict()
