"""A Recorder's record says how the user's network was held in training, asked of the
network and the rule, not assumed:

- parameters frozen outside the rule — ``requires_grad`` off in the user's code, or an
  earlier ``rule("frozen", model)`` on the same network — are listed in
  ``model.frozen_parameters`` (name → values) and join the run id and the recipe: a ``bp``
  run that trains 467 of 739 parameters is no plain ``bp`` run, and (d) judges it only
  against a frozen-blocks run of the same partly frozen network; what binding the rule
  froze itself (``frozen``, ``trainable_blocks``) is the rule's and is not listed;
- the parameters' dtype is ``model.dtype`` (``bfloat16`` for a network cast with
  ``.to(torch.bfloat16)``), and ``run.precision='fp32'`` for such a network is refused;
- parameters frozen (or unfrozen) after the Recorder was created, which its record and run
  id would not say, are refused by the next ``epoch()`` or ``finish()`` in one line naming
  them;
- a network changed after the Recorder was created — a module added or replaced, a
  parameter replaced by a new object (the optimiser steps the old one), resized or cast, a
  hook added or removed (a backward hook's gradients were taken for the reference the
  Recorder had checked without it), the network compiled — is refused by the next
  ``epoch()`` or ``finish()`` in one line naming it: the record's model, parameter count and
  run id are of the network as it was;
- records without these fields (written before them) load, and runs of float32 networks
  with nothing frozen keep the run ids and recipes they had.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from creditaudit import Recorder, adapt, rule
from creditaudit.errors import ConfigError, ModelContractError
from creditaudit.protocol.records import RecordSet
from creditaudit.records import RECORD_FILE, load_record, recipe_key
from creditaudit.records.compare import recipe_difference
from integrity_support import as_written

pytestmark = pytest.mark.usefixtures("single_thread")

OFF = {"diagnostics.end_of_run": False, "run.seed": 0}
BLOCK = {"1.0.weight": 256, "1.0.bias": 16}  # net[1]'s Linear(16, 16)


def network(dtype: torch.dtype = torch.float32) -> nn.Sequential:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.Sequential(nn.Linear(16, 16), nn.Tanh()),
                             nn.Sequential(nn.Linear(16, 16), nn.Tanh()),
                             nn.Linear(16, 3)).to(dtype)


class Float64Head(nn.Linear):
    """A float64 readout behind float32 layers (a network of mixed parameter dtypes)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.to(self.weight.dtype)).to(x.dtype)


def samples(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return (torch.randn(64, 8, generator=generator).to(dtype),
            torch.randint(0, 3, (64,), generator=generator))


def record(net: nn.Module, rule_name: str, out, *, model=None, config=None, dtype=torch.float32):
    x, y = samples(dtype)
    model = adapt(net, states=["0", "1", "2"], example=x[:8]) if model is None else model
    rec = Recorder(rule(rule_name, model), x, y, out=out, data="mine", progress=False,
                   config={**OFF, **(config or {})})
    rec.epoch(0, test_acc=0.4 if rule_name == "frozen" else 0.5)
    return rec.finish()


def frozen_block() -> nn.Sequential:
    net = network()
    for p in net[1].parameters():
        p.requires_grad_(False)
    return net


def test_parameters_frozen_outside_the_rule_are_recorded_in_the_run_id_and_recipe(tmp_path):
    out = tmp_path / "runs"
    plain = record(network(), "bp", out)
    held = record(frozen_block(), "bp", out)  # the same run id as `plain` before
    assert plain.model.frozen_parameters == {}
    assert held.model.frozen_parameters == BLOCK
    assert held.run_id != plain.run_id and held.recipe_key != plain.recipe_key
    assert recipe_difference(held, plain) == "the parameters frozen outside the rule"
    # what `frozen` freezes itself is the rule's: the baseline of the plain network's runs
    baseline = record(network(), "frozen", out)
    assert baseline.model.frozen_parameters == {} and baseline.recipe_key == plain.recipe_key
    # the baseline of the partly frozen network: the same block frozen by the user
    held_baseline = record(frozen_block(), "frozen", out)
    assert held_baseline.model.frozen_parameters == BLOCK
    assert held_baseline.recipe_key == held.recipe_key != baseline.recipe_key
    runs = {r.run_id: r for r in RecordSet.from_folder(out)}
    records = RecordSet.from_folder(out)
    assert records.frozen_baseline(runs[plain.run_id]) == (0.4, 1)
    assert records.frozen_baseline(runs[held.run_id]) == (0.4, 1)
    assert len({plain.run_id, held.run_id, baseline.run_id, held_baseline.run_id}) == 4
    # written and read back
    assert load_record(out / held.run_id).model.frozen_parameters == BLOCK


def test_an_earlier_frozen_rule_on_the_network_is_recorded_by_a_later_rule(tmp_path):
    x, _ = samples()
    model = adapt(network(), states=["0", "1", "2"], example=x[:8])
    rule("frozen", model)  # freezes all but the readout on the network itself
    later = record(None, "bp", tmp_path, model=model)
    assert later.model.frozen_parameters == {
        "0.weight": 128, "0.bias": 16, **BLOCK, "2.0.weight": 256, "2.0.bias": 16}
    assert later.recipe_key != record(network(), "bp", tmp_path / "plain").recipe_key


def test_freezing_after_binding_is_the_callers_and_trainable_blocks_the_rules(tmp_path):
    x, _ = samples()
    model = adapt(network(), states=["0", "1", "2"], example=x[:8])
    bound = rule("bp", model, trainable_blocks=1)  # freezes block 0 (net[1]) itself
    assert bound.frozen_outside() == {}
    for p in model.net[3].parameters():  # the head, frozen by the caller after binding
        p.requires_grad_(False)
    assert bound.frozen_outside() == {"3.weight": 48, "3.bias": 3}


def recorder(net: nn.Module, out) -> Recorder:
    x, y = samples()
    model = adapt(net, states=["0", "1", "2"], example=x[:8])
    return Recorder(rule("dfa", model), x, y, out=out, data="mine", progress=False, config=OFF)


def test_parameters_frozen_after_the_recorder_was_created_are_refused(tmp_path):
    net = network()
    rec = recorder(net, tmp_path / "epoch")
    net[1][0].weight.requires_grad_(False)  # the record says nothing is frozen
    with pytest.raises(ConfigError) as refused:
        rec.epoch(0, test_acc=0.5)
    message = str(refused.value)
    assert "\n" not in message and "1.0.weight" in message and "1.0.bias" not in message
    assert "before creating the Recorder" in message
    assert rec.record.log == [] and rec.record.model.frozen_parameters == {}
    # frozen after an epoch: finish() refuses, nothing is marked completed
    net = network()
    rec = recorder(net, tmp_path / "finish")
    rec.epoch(0, test_acc=0.5)
    net[3].bias.requires_grad_(False)
    with pytest.raises(ConfigError, match="3.bias"):
        rec.finish()
    assert not rec.finished and load_record(rec.run_dir).status != "completed"
    # unfrozen after creation: the record's frozen_parameters would be wrong too
    net = frozen_block()
    rec = recorder(net, tmp_path / "unfrozen")
    assert rec.record.model.frozen_parameters == BLOCK
    for parameter in net[1].parameters():
        parameter.requires_grad_(True)
    with pytest.raises(ConfigError, match=r"1\.0\.weight.*no longer frozen"):
        rec.epoch(0, test_acc=0.5)
    # frozen and unfrozen again before the epoch: as recorded, recorded
    net = network()
    rec = recorder(net, tmp_path / "again")
    net[3].bias.requires_grad_(False)
    net[3].bias.requires_grad_(True)
    rec.epoch(0, test_acc=0.5)
    assert rec.finish().status == "completed"


def test_parameters_the_rule_froze_unfrozen_by_the_loop_are_refused(tmp_path):
    """Progressive unfreezing of what binding froze: a `frozen` run (the baseline of (d))
    whose loop unfroze its blocks trained them with an optimiser holding every parameter,
    and was recorded as a completed frozen-blocks run."""
    x, y = samples()
    for name, options, unfrozen in (("frozen", {}, "0.weight, 0.bias, 1.0.weight …"),
                                    ("bp", {"trainable_blocks": 1}, "1.0.weight, 1.0.bias")):
        model = adapt(network(), states=["0", "1", "2"], example=x[:8])
        bound = rule(name, model, **options)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        rec = Recorder(bound, x, y, out=tmp_path, name=name, data="mine", progress=False,
                       config=OFF)
        rec.epoch(0, test_acc=0.4)
        for parameter in model.parameters():
            parameter.requires_grad_(True)
        bound.train_step(x, y, optimizer)
        with pytest.raises(ConfigError) as refused:
            rec.epoch(1, test_acc=0.5)
        message = str(refused.value)
        assert "\n" not in message and message.startswith(unfrozen)
        assert f"frozen by binding {name!r}, no longer frozen" in message
        with pytest.raises(ConfigError, match="no longer frozen"):
            rec.finish()
        assert load_record(rec.run_dir).status != "completed"


CHANGES = {  # a change made to network() after its Recorder was created → what is named
    "layer added": (lambda net: net.add_module("4", nn.Linear(3, 3)), "module '4' added"),
    "parameter swapped": (lambda net: setattr(net[1][0], "weight", nn.Parameter(
        torch.zeros(16, 16))), "'1.0.weight' replaced"),
    "layer replaced": (lambda net: net[1].__setitem__(0, nn.Linear(16, 16, bias=False)),
                       "'1.0.bias' removed"),
    "activation swapped": (lambda net: net[2].__setitem__(1, nn.ReLU()),
                           "module '2.1' replaced by a ReLU"),
    "cast": (lambda net: net[3].double(), "'3.weight' resized or cast"),
    # the reference check ran without them: a backward hook's gradient was taken for the
    # reference (bp's cosines +1.000 of a backward that was no gradient), a forward hook
    # or a compiled graph is a network the run id does not name
    "backward hook": (lambda net: net[2].register_full_backward_hook(
        lambda module, grad_in, grad_out: (3 * grad_in[0],)),
        "a backward hook added to module '2'"),
    "backward pre-hook": (lambda net: net[1].register_full_backward_pre_hook(
        lambda module, grad_out: (grad_out[0].sign(),)),
        "a backward pre-hook added to module '1'"),
    "forward hook": (lambda net: net[1].register_forward_hook(
        lambda module, args, out: 2 * out), "a forward hook added to module '1'"),
    "compiled": (lambda net: net.compile(backend="eager"),
                 "the network (Sequential) compiled with torch.compile"),
}


@pytest.mark.parametrize("case", CHANGES)
def test_a_network_changed_after_the_recorder_was_created_is_refused(case, tmp_path):
    """The record said 739 float32 parameters of the network as created, and the epochs
    measured another one (a bias=False replacement crashed with KeyError '1.0.bias')."""
    change, named = CHANGES[case]
    net = network()
    rec = recorder(net, tmp_path / "run")
    rec.epoch(0, test_acc=0.5)
    change(net)
    for step in (lambda: rec.epoch(1, test_acc=0.5), rec.finish):
        with pytest.raises(ConfigError) as refused:
            step()
        message = str(refused.value)
        assert "\n" not in message and named in message
        assert "the network changed after the Recorder was created" in message
    assert not rec.finished and [e.epoch for e in load_record(rec.run_dir).log] == [0]


def test_a_backward_hook_for_every_module_added_since_is_refused(tmp_path):
    """A global module backward hook (register_module_full_backward_hook) added after the
    Recorder checked the reference: bp recorded cos +1.000 at every state against the
    hook's gradients, the record saying the reference was verified."""
    net = network()
    rec = recorder(net, tmp_path / "run")
    rec.epoch(0, test_acc=0.5)
    handle = nn.modules.module.register_module_full_backward_hook(
        lambda module, grad_in, grad_out: None)
    try:
        with pytest.raises(ConfigError, match=r"\(a backward hook added to every module "
                           r"\(torch\.nn\.modules\.module\.register_module_full_backward_hook"):
            rec.epoch(1, test_acc=0.5)
    finally:
        handle.remove()
    rec.epoch(1, test_acc=0.5)


def test_hooks_there_when_the_recorder_was_created_or_removed_since_are_kept(tmp_path):
    """A loop may hook a module while it evaluates and remove the hook after; one the
    network had from the start stays (the reference check ran with it)."""
    net = network()
    net[1].register_forward_hook(lambda module, args, out: None)
    rec = recorder(net, tmp_path / "run")
    rec.epoch(0, test_acc=0.5)
    seen = []
    handle = net[2].register_forward_hook(lambda module, args, out: seen.append(out.shape))
    net(samples()[0])
    handle.remove()
    rec.epoch(1, test_acc=0.5)
    assert seen and rec.finish().status == "completed"


def test_a_network_moved_to_another_device_is_named_so():
    """``.to(device)`` keeps the parameter objects, shapes and dtypes: the check saw no
    change and the epoch ran the moved network on evaluation arrays left where they were
    (torch's device error). On a machine with one device the move is written into the
    layout the Recorder took (tests/test_cuda.py moves a network for real)."""
    from creditaudit.run.recorder_inputs import check_network_unchanged, network_layout

    net = network()
    modules, tensors, hooks = network_layout(net)
    elsewhere = {name: (*entry[:3], "cuda:0") for name, entry in tensors.items()}
    with pytest.raises(ConfigError) as refused:
        check_network_unchanged((modules, elsewhere, hooks), net)
    assert "'0.weight' moved from cuda:0 to cpu" in str(refused.value)
    check_network_unchanged(network_layout(net), net)


def test_training_and_in_place_changes_keep_the_network_recorded(tmp_path):
    """Steps, load_state_dict and BatchNorm's running statistics change values in place."""
    net = network()
    rec = recorder(net, tmp_path / "run")
    rec.epoch(0, test_acc=0.5)
    optimizer = torch.optim.AdamW(rec.rule.trainable_parameters(), lr=1e-3)
    x, y = samples()
    rec.rule.train_step(x, y, optimizer)
    net.load_state_dict(network().state_dict())
    rec.epoch(1, test_acc=0.5)
    assert rec.finish().status == "completed"


def test_the_parameters_dtype_is_recorded_and_fp32_refused_for_other_weights(tmp_path):
    bf16 = record(network(torch.bfloat16), "bp", tmp_path, dtype=torch.bfloat16)
    assert bf16.model.dtype == "bfloat16"
    assert load_record(tmp_path / bf16.run_id).model.dtype == "bfloat16"
    assert '"dtype": "bfloat16"' in bf16.recipe_key
    f64 = record(network(torch.float64), "bp", tmp_path, dtype=torch.float64)
    assert f64.model.dtype == "float64" and '"dtype": "float64"' in f64.recipe_key
    f32 = record(network(), "bp", tmp_path)
    assert f32.model.dtype == "float32" and "dtype" not in f32.recipe_key
    for dtype in (torch.bfloat16, torch.float64):
        with pytest.raises(ConfigError) as error:
            record(network(dtype), "bp", tmp_path / "told", dtype=dtype,
                   config={"run.precision": "fp32"})
        name = str(dtype).removeprefix("torch.")
        assert str(error.value) == (
            f"config sets run.precision='fp32', but the network's parameters are {name}: "
            "leave run.precision out (the record keeps the parameters' dtype as model.dtype)")
    assert not (tmp_path / "told").exists()
    told = record(network(torch.bfloat16), "bp", tmp_path / "bf16", dtype=torch.bfloat16,
                  config={"run.precision": "bf16"})
    assert told.config.run.precision == "bf16" and told.model.dtype == "bfloat16"
    # bf16 autocast leaves float64 weights' arithmetic in float64: a record of bf16 would lie
    with pytest.raises(ConfigError, match=r"run.precision='bf16' trains under bf16 autocast"):
        record(network(torch.float64), "bp", tmp_path / "f64", dtype=torch.float64,
               config={"run.precision": "bf16"})
    # some float64 weights: theirs too (the record said bf16 beside float32+float64)
    mixed = network()
    mixed[3] = Float64Head(16, 3, dtype=torch.float64)
    with pytest.raises(ConfigError, match=r"parameters are float32\+float64: its float64 "):
        record(mixed, "bp", tmp_path / "mixed", config={"run.precision": "bf16"})
    assert not (tmp_path / "mixed").exists()
    assert not (tmp_path / "f64").exists()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_low_precision_network_is_measured_in_its_dtype_and_says_so(dtype, tmp_path,
                                                                     measured_dtypes):
    """A Recorder never casts the caller's network: one held in bf16 or fp16 is measured in
    that dtype, while run.precision's help said diagnostics never run in bf16 and the
    report's settings left the dtype out."""
    from creditaudit.config.sections import RunSettings
    from creditaudit.records import RunRecord
    from creditaudit.report.settings import differing_settings, setting_cells
    from creditaudit.report.tables import run_settings

    seen = measured_dtypes
    net = network(dtype)
    done = record(net, "bp", tmp_path, dtype=dtype)
    name = str(dtype).removeprefix("torch.")
    assert seen == {dtype} and {p.dtype for p in net.parameters()} == {dtype}
    assert done.model.dtype == name and "run.precision" in done.not_recorded
    low = load_record(tmp_path / done.run_id)
    assert run_settings(low)["model dtype"] == name
    # A float32 network beside it said "—" in the model dtype column, as if not recorded.
    full = record(network(), "bp", tmp_path)
    assert run_settings(full)["model dtype"] == "float32"
    assert "model dtype" in differing_settings([low, full])
    assert setting_cells(run_settings(full), ["model dtype"]) == {"model dtype": "float32"}
    # A record from before model.dtype was kept held float32: "—", and no column beside one.
    raw = full.to_dict()
    del raw["model"]["dtype"]
    legacy = RunRecord.from_dict(raw)
    assert setting_cells(run_settings(legacy), ["model dtype"]) == {"model dtype": "—"}
    assert "model dtype" not in differing_settings([legacy, full])
    help_text = RunSettings.__dataclass_fields__["precision"].metadata["help"]
    assert "Recorder's network held in bf16 or fp16: that dtype" in help_text, help_text


def test_records_without_the_fields_load_and_keep_their_recipe(tmp_path):
    held = record(frozen_block(), "bp", tmp_path)
    path = tmp_path / held.run_id / RECORD_FILE
    raw = json.loads(path.read_text())
    for key in ("dtype", "frozen_parameters"):
        del raw["model"][key]
    path.write_text(as_written(raw, digest=False))
    old = load_record(tmp_path / held.run_id)
    assert old.model.dtype is None and old.model.frozen_parameters is None
    assert old.recipe_key == recipe_key(old.config, old.data.source, old.not_recorded,
                                        old.model_code_digest)


class FloatInput(nn.Module):
    """A network fed uint8 images that casts them itself: x.float() / 255."""

    def __init__(self) -> None:
        super().__init__()
        self.body = network()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x.float() / 255)


def test_a_forward_that_casts_its_input_is_said_before_training_not_at_finish(tmp_path):
    """Recorder(…) raised torch's RuntimeError ('mat1 and mat2 must have the same dtype')
    from the reference check's float64 copy; allowed unverified, the same error came from
    finish(), after the loop had trained (the end-of-run block's float64 copy)."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randint(0, 256, (64, 8), generator=generator, dtype=torch.uint8)
    y = torch.randint(0, 3, (64,), generator=generator)
    model = adapt(FloatInput(), states=["body.0", "body.1", "body.2"], example=x[:8])
    bound = rule("dfa", model)
    with pytest.raises(ModelContractError, match="^cannot verify the reference gradient: the "
                       "check runs a float64 copy of FloatInput, whose forward fails there"):
        Recorder(bound, x, y, out=tmp_path, name="checked", progress=False)
    with pytest.raises(ModelContractError, match=r"^the end-of-run metrics \(ρ, nudging\) run "
                       "a float64 copy of FloatInput"):
        Recorder(bound, x, y, out=tmp_path, name="unverified", progress=False,
                 allow_unverified_reference=True)
    rec = Recorder(bound, x, y, out=tmp_path, name="without", progress=False,
                   allow_unverified_reference=True, config={"diagnostics.end_of_run": False})
    rec.epoch(0, test_acc=0.5)
    record = rec.finish()
    assert record.status == "completed" and not record.reference.verified


class _Squeezed(nn.Module):
    """A network whose forward ``.squeeze()``s its logits: (1, 3) → (3,) for one sample."""

    def __init__(self) -> None:
        super().__init__()
        self.net = network()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze()


def test_a_network_that_squeezes_one_samples_logits_is_told_so(tmp_path):
    # the Recorder's check of the end-of-run block's float64 copy runs one sample, and the
    # line said "got a float64 tensor of shape (3,)": the dtype was named, the batch of one
    # that the squeeze() broke was not
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    model = adapt(_Squeezed(), states=["net.0", "net.1"], example=x[:8])
    with pytest.raises(ModelContractError) as raised:
        Recorder(rule("dfa", model), x, y, out=tmp_path, data="mine",
                 config={"run.seed": 0})
    text = str(raised.value)
    assert "\n" not in text
    assert "got a float64 tensor of shape (3,) for a batch of 1 (a squeeze() that drops " \
           "the batch dimension of a one-sample batch? squeeze only the dimension you mean" \
           in text, text
