"""CUDA and bf16: every rule gives the same credits on the GPU as on the CPU, bf16 trains
under autocast while the diagnostics stay fp32, and a GPU run audits on either device.

The CUDA tests skip on machines without a GPU (CI); on a GPU box run
``pytest tests/test_cuda.py``. The fp16/bf16 range test runs everywhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from creditaudit.config import MethodConfig, RunConfig
from creditaudit.methods import build_rule
from creditaudit.models import ResidualMLP
from creditaudit.records import load_record
from creditaudit.run.plan import run_id
from creditaudit.run.trainer import Trainer

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
RULES = ("bp", "fa", "dfa", "state-bridge", "credit-bridge", "ep", "fa-linear", "usf", "brsf",
         "frsf", "kp", "drtp")
TINY = {
    "data.n_train": 512, "data.n_test": 256, "data.in_dim": 8, "data.teacher_width": 32,
    "model.d": 16, "model.n_blocks": 2, "optim.epochs": 2, "optim.batch_size": 64,
    "diagnostics.eval_samples": 256, "diagnostics.rho_samples": 64,
    "diagnostics.rho_directions": 4, "diagnostics.null_draws": 3, "run.progress": False,
}


def test_bf16_keeps_the_tiny_gradients_that_fp16_flushes() -> None:
    """Why bf16 and never fp16: diagnostic (b) must see ‖g_L‖ ~ 1e-9."""
    tiny = torch.tensor([1e-9, 1e-12, 3e-19])
    assert torch.all(tiny.to(torch.float16) == 0)
    assert torch.all(tiny.to(torch.bfloat16) != 0)
    relative = (tiny.to(torch.bfloat16).float() - tiny).abs() / tiny
    assert torch.all(relative < 2 ** -8)


@needs_cuda
@pytest.mark.parametrize("method", RULES)
def test_credits_on_cuda_match_cpu(method: str) -> None:
    torch.manual_seed(0)
    model = ResidualMLP(12, 32, 10, 3, out_ln=True).double()
    rule = build_rule(model, MethodConfig(name=method), n_classes=10, seed=0)
    x = torch.randn(64, 12, dtype=torch.float64)
    y = torch.randint(0, 10, (64,))
    on_cpu = rule.credits(x, y)
    model.cuda()
    rule.to(torch.device("cuda"))
    on_gpu = rule.credits(x.cuda(), y.cuda())
    assert len(on_cpu) == len(on_gpu)
    for layer, (a, b) in enumerate(zip(on_cpu, on_gpu)):
        assert b.device.type == "cuda"
        error = float((b.cpu() - a).norm() / a.norm().clamp_min(1e-300))
        assert error < 1e-9, f"{method} layer {layer}: relative difference {error:.2e}"


@needs_cuda
@pytest.mark.parametrize("method", ("bp", "fa-linear", "usf", "frsf", "kp", "dfa"))
def test_convmixer_credits_on_cuda_match_cpu(method: str) -> None:
    """The per-layer rules' convolution backward (and ConvMixer in eval mode) on cuDNN."""
    from creditaudit.methods import rule_class
    from creditaudit.testing import make_rule, tiny_batch

    rule = make_rule(rule_class(method), arch="convmixer")
    x, y = tiny_batch(arch="convmixer")
    on_cpu = rule.credits(x, y)
    rule.model.cuda()
    rule.to(torch.device("cuda"))
    on_gpu = rule.credits(x.cuda(), y.cuda())
    for layer, (a, b) in enumerate(zip(on_cpu, on_gpu, strict=True)):
        error = float((b.cpu() - a).norm() / a.norm().clamp_min(1e-300))
        assert error < 1e-9, f"{method} layer {layer}: relative difference {error:.2e}"
    optimizer = torch.optim.AdamW(rule.trainable_parameters(), lr=1e-3)
    rule.model.train()
    assert rule.train_step(x.cuda(), y.cuda(), optimizer).finite


@needs_cuda
@pytest.mark.parametrize("method", ("bp", "dfa", "ep", "fa-linear", "kp"))
def test_bf16_trains_under_autocast_and_credits_stay_fp32(method: str) -> None:
    torch.manual_seed(0)
    model = ResidualMLP(12, 32, 10, 2, out_ln=True).cuda()
    rule = build_rule(model, MethodConfig(name=method), n_classes=10, seed=0)
    rule.to(torch.device("cuda"))
    rule.set_precision("bf16", "cuda")
    x, y = torch.randn(64, 12, device="cuda"), torch.randint(0, 10, (64,), device="cuda")
    with rule.autocast():
        assert model(x).dtype == torch.bfloat16
    optimizer = torch.optim.AdamW(rule.trainable_parameters(), lr=1e-3)
    assert rule.train_step(x, y, optimizer).finite
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(a.dtype == torch.float32 for a in rule.credits(x, y))


@needs_cuda
@pytest.mark.parametrize("precision", ("fp32", "bf16"))
def test_cuda_run_records_and_audits_on_both_devices(tmp_path: Path, precision: str) -> None:
    from creditaudit.audit import audit_run

    config = RunConfig().replace(**{**TINY, "method.name": "dfa", "run.out_dir": str(tmp_path),
                                    "run.device": "cuda", "run.precision": precision})
    result = Trainer(config).run()
    assert result.status == "completed"
    record = load_record(result.run_dir)
    assert record.environment["cuda_device"]
    last = record.log[-1]
    assert last.epoch == 2 and all(v > 0 for v in last.bp_grad_norms_per_sample_med)
    on_cpu = audit_run(str(result.run_dir), device="cpu", metrics=False)
    on_gpu = audit_run(str(result.run_dir), device="cuda", metrics=False)
    assert on_cpu.verdict_text == on_gpu.verdict_text
    g_cpu, g_gpu = on_cpu.grad_norms[-1], on_gpu.grad_norms[-1]
    assert abs(g_cpu - g_gpu) <= 1e-3 * g_cpu


@needs_cuda
def test_a_cuda_run_killed_mid_way_resumes_on_the_cpu(tmp_path: Path, kill_run_at) -> None:
    config = RunConfig().replace(**{**TINY, "method.name": "fa", "optim.epochs": 3,
                                    "run.out_dir": str(tmp_path), "run.device": "cuda"})
    kill_run_at(config)
    on_cpu = config.replace(**{"run.device": "cpu"})  # same run id: the device is not semantic
    assert run_id(on_cpu) == run_id(config)
    result = Trainer(on_cpu).run(resume=True)
    assert result.status == "completed"
    assert [e.epoch for e in result.record.log] == [0, 1, 2, 3]


@needs_cuda
def test_cuda_run_returns_its_gpu_model_and_reloads_it_on_the_cpu(tmp_path: Path) -> None:
    from creditaudit import train

    config = RunConfig().replace(**{**TINY, "method.name": "dfa", "run.out_dir": str(tmp_path),
                                    "run.device": "cuda", "run.tensorboard": str(tmp_path / "tb")})
    result = train(config)
    assert result.model.embed.weight.device.type == "cuda"
    again = train(config)  # finished: rebuilt from the checkpoint, on the CPU
    assert again.model.embed.weight.device.type == "cpu"
    for key, value in again.model.state_dict().items():
        assert torch.equal(value, result.model.state_dict()[key].cpu()), key


class _Wrapped(torch.nn.Module):
    """A user's module (no ResidualNet) around a ResidualMLP."""

    def __init__(self, inner: ResidualMLP) -> None:
        super().__init__()
        self.inner = inner

    def states(self, x: torch.Tensor):
        return self.inner.forward_states(x)

    def run_from(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        return self.inner.forward_from(layer, h)


@needs_cuda
def test_own_module_metrics_on_cuda_match_cpu() -> None:
    from creditaudit import diagnose

    torch.manual_seed(0)
    inner = ResidualMLP(12, 32, 10, 3, out_ln=True)
    rule = build_rule(inner, MethodConfig(name="dfa"), n_classes=10, seed=0)
    net = _Wrapped(inner)
    x, y = torch.randn(256, 12), torch.randint(0, 10, (256,))
    options = {"rho_samples": 64, "rho_directions": 8}

    def report(device: str):
        net.to(device)
        rule.to(torch.device(device))
        return diagnose(net, x.to(device), y.to(device), states_fn=net.states,
                        forward_from=net.run_from, credit=lambda a, b: rule.credits(a, b),
                        metrics=True, metric_options=options)

    on_cpu = report("cpu")
    torch.cuda.manual_seed(7)
    cuda_rng = torch.cuda.get_rng_state()
    on_gpu = report("cuda")
    assert torch.equal(torch.cuda.get_rng_state(), cuda_rng)  # forked, not advanced
    assert on_gpu.metadata["metrics_precision"] == "float64"
    for key in ("perturbation_rho", "bp_cosine"):
        assert on_gpu.metrics[key] == pytest.approx(on_cpu.metrics[key], rel=1e-4, abs=1e-6), key
    for eta, deltas in on_cpu.metrics["nudging"].items():
        assert on_gpu.metrics["nudging"][eta] == pytest.approx(deltas, rel=1e-3, abs=1e-9)


# --- captured steps, stacked runs and data on the GPU (run.steps.capture, .stepping) ----
# Run by scripts/gpu_checks.sh (first on an H200, torch 2.11, 2026-11-30: all passed). The
# captured step replays the kernels of the eager stacked step, so on the same
# optimiser (CapturableAdamW) the two should agree bit for bit; the tolerance only allows
# for a cuBLAS algorithm chosen differently under capture.
CAPTURED_RULES = ("bp", "frozen", "fa", "dfa", "drtp")


def _cuda_trainers(tmp_path: Path, method: str, seeds=(1, 2), **extra) -> list[Trainer]:
    return [Trainer(RunConfig().replace(**{
        **TINY, "method.name": method, "run.out_dir": str(tmp_path), "run.device": "cuda",
        "run.seed": seed, "run.cuda_graphs": "off", **extra})) for seed in seeds]


@needs_cuda
@pytest.mark.parametrize("method", CAPTURED_RULES)
def test_captured_epochs_replay_the_eager_stacked_step(tmp_path: Path, method: str) -> None:
    from creditaudit.run.steps.capture import CapturedEpochs, make_capturable
    from creditaudit.run.steps.epochs import StackedEpochs

    captured = _cuda_trainers(tmp_path / "a", method)
    eager = _cuda_trainers(tmp_path / "b", method)
    for trainer in eager:
        make_capturable(trainer)
    graph_runner = CapturedEpochs(captured)
    eager_runner = StackedEpochs(eager, check="epoch")
    for epoch in (1, 2):
        a, b = graph_runner.train_epoch(epoch), eager_runner.train_epoch(epoch)
        assert a == pytest.approx(b, rel=1e-6)
    assert graph_runner.graph is not None  # full batches were replayed
    for x, y in zip(captured, eager, strict=True):
        for p, q in zip(x.model.parameters(), y.model.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)
        assert x.optimizer.param_groups[0]["lr"].item() == pytest.approx(
            y.optimizer.param_groups[0]["lr"].item(), rel=1e-7)


@needs_cuda
@pytest.mark.parametrize("method", ("bp", "dfa"))
def test_a_captured_run_records_resumes_and_agrees_with_eager(tmp_path: Path, method: str,
                                                                kill_run_at) -> None:
    from creditaudit import train
    from creditaudit.records import comparable

    options = {**TINY, "method.name": method, "optim.epochs": 3, "run.device": "cuda"}
    eager = train(RunConfig().replace(**{**options, "run.out_dir": str(tmp_path / "e"),
                                         "run.cuda_graphs": "off"}))
    captured = train(RunConfig().replace(**{**options, "run.out_dir": str(tmp_path / "c")}))
    assert captured.record.environment["execution"]["cuda_graphs"] == "on"
    assert captured.record.environment["execution"]["device_data"] is True
    assert captured.status == eager.status == "completed"
    assert captured.record.final.test_acc == pytest.approx(eager.record.final.test_acc,
                                                           abs=0.02)
    assert all(isinstance(e.lr, float) for e in captured.record.log)
    killed = RunConfig().replace(**{**options, "run.out_dir": str(tmp_path / "k")})
    kill_run_at(killed)
    resumed = train(killed, resume=True)
    assert comparable(resumed.record)["log"][-1]["acc_eval"] == pytest.approx(
        comparable(captured.record)["log"][-1]["acc_eval"], abs=1e-6)
    on_cpu = train(killed.replace(**{"run.device": "cpu",
                                     "run.out_dir": str(tmp_path / "k2")}))
    assert on_cpu.status == "completed"


@needs_cuda
def test_capturable_adamw_checkpoints_as_the_eager_optimiser() -> None:
    from creditaudit.optim import make_adamw
    from creditaudit.run.steps.capture import CapturableAdamW

    weights = torch.nn.Parameter(torch.randn(4, 3, device="cuda"))
    optimizer = CapturableAdamW([weights], lr=1e-3, weight_decay=0.01,
                                device=torch.device("cuda"))
    weights.grad = torch.randn_like(weights)
    optimizer.step()
    state = optimizer.state_dict()
    group = state["param_groups"][0]
    assert isinstance(group["lr"], float) and group["capturable"] is False
    eager = make_adamw([torch.nn.Parameter(weights.detach().clone())], lr=1.0,
                       weight_decay=0.01)
    eager.load_state_dict(state)
    assert eager.param_groups[0]["lr"] == pytest.approx(1e-3)
    again = CapturableAdamW([weights], lr=5.0, weight_decay=0.01, device=torch.device("cuda"))
    again.load_state_dict(eager.state_dict())
    assert isinstance(again.param_groups[0]["lr"], torch.Tensor)
    assert again.param_groups[0]["lr"].item() == pytest.approx(1e-3)


@needs_cuda
@pytest.mark.parametrize("per_epoch", [None, False], ids=["per-epoch", "batch-by-batch"])
def test_data_on_the_gpu_gives_the_host_batches(per_epoch: bool | None) -> None:
    """Both ways of drawing: up front (the default for data on a GPU) and batch by batch
    (``draw_per_epoch=False``, whose draws a CPU generator made on the GPU: refused)."""
    from creditaudit.data.loader import InMemoryLoader

    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (300, 3, 8, 8), dtype=torch.uint8, generator=gen)
    y = torch.randint(0, 10, (300,), generator=gen)

    def batches(device: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
        loader = InMemoryLoader(x.to(device), y.to(device), 64, shuffle=True, augment=True,
                                generator=torch.Generator().manual_seed(3),
                                mean=(0.5, 0.5, 0.5), std=(0.2, 0.2, 0.2),
                                random_targets=10, draw_per_epoch=per_epoch)
        return [(a.cpu(), b.cpu()) for a, b in loader]

    for (a, b), (c, d) in zip(batches("cpu"), batches("cuda"), strict=True):
        assert torch.equal(a, c) and torch.equal(b, d)


@needs_cuda
@pytest.mark.parametrize("graphs", ("off", "auto"))
def test_stacked_runs_on_the_gpu_match_their_cpu_runs(tmp_path: Path, graphs: str) -> None:
    from creditaudit.run.stacked import train_stacked

    def runs(device: str) -> list[RunConfig]:
        return [RunConfig().replace(**{
            **TINY, "method.name": "dfa", "run.seed": seed, "optim.lr": lr,
            "run.device": device, "run.cuda_graphs": graphs,
            "run.out_dir": str(tmp_path / device)}) for seed, lr in ((1, 1e-3), (2, 3e-3))]

    on_gpu, on_cpu = train_stacked(runs("cuda")), train_stacked(runs("cpu"))
    for g, c in zip(on_gpu, on_cpu, strict=True):
        assert g.status == c.status == "completed"
        assert g.record.environment["execution"]["stacked_runs"] == 2
        assert g.record.final.test_acc == pytest.approx(c.record.final.test_acc, abs=0.02)


@needs_cuda
def test_a_captured_run_that_diverges_stops_where_the_eager_one_does(tmp_path: Path) -> None:
    from creditaudit import train

    options = {**TINY, "method.name": "bp", "optim.lr": 1e30, "run.device": "cuda"}
    eager = train(RunConfig().replace(**{**options, "run.out_dir": str(tmp_path / "e"),
                                         "run.cuda_graphs": "off"}))
    captured = train(RunConfig().replace(**{**options, "run.out_dir": str(tmp_path / "c")}))
    assert eager.status == captured.status == "diverged"
    assert captured.record.divergence == eager.record.divergence


DROPOUT_NET = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.head = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 10)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.head(self.drop(torch.relu(self.l2(torch.relu(self.l1(x))))))
'''


@needs_cuda
def test_a_cuda_run_with_dropout_resumed_is_the_uninterrupted_run(tmp_path: Path, kill_run_at,
                                                                   monkeypatch) -> None:
    """The device's random stream (dropout's masks) is saved with the checkpoint: a resume
    reseeded it, so the resumed epochs drew the first epochs' masks again."""
    (tmp_path / "dropout_net.py").write_text(DROPOUT_NET)
    monkeypatch.syspath_prepend(str(tmp_path))
    base = {k: v for k, v in TINY.items() if not k.startswith("model.")}
    configs = [RunConfig().replace(**{
        **base, "optim.epochs": 3, "run.out_dir": str(tmp_path / out),
        "run.device": "cuda", "model.arch": "module", "model.factory": "dropout_net:Net",
        "model.states": ["l1", "l2"], "method.name": "dfa"}) for out in ("whole", "killed")]
    whole = Trainer(configs[0]).run()
    kill_run_at(configs[1])
    resumed = Trainer(configs[1]).run(resume=True)
    a, b = whole.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


def test_the_device_stream_is_saved_and_restored_for_a_model_on_cuda(monkeypatch) -> None:
    """Runs everywhere: the checkpoint's ``cuda`` stream is read from and given back to the
    model's device, and only for a model on one (the CUDA calls stand in on a CPU box)."""
    from creditaudit.run import rng

    calls: list[tuple[str, object]] = []
    state = torch.arange(4, dtype=torch.uint8)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: calls.append(
        ("get", device)) or state)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, device: calls.append(
        ("set", device)))
    model, generator = torch.nn.Linear(2, 2), torch.Generator().manual_seed(0)
    on_cpu = rng.rng_states(model, generator)
    assert set(on_cpu) == {"torch", "data"} and not calls  # a CPU run's checkpoint as before
    monkeypatch.setattr(rng, "cuda_device", lambda m: torch.device("cuda", 1))
    saved = rng.rng_states(model, generator)
    assert saved["cuda"] is state and calls == [("get", torch.device("cuda", 1))]
    rng.restore_rng_states(saved, model, generator)
    assert calls[-1] == ("set", torch.device("cuda", 1))
    rng.restore_rng_states(on_cpu, model, generator)  # a checkpoint without one: left seeded
    assert len(calls) == 2


@needs_cuda
def test_the_batch_class_mix_of_labels_on_the_gpu() -> None:
    """(c)'s class-sorting check drew its shuffles on the CPU and counted the labels where
    they lay: every CUDA run failed at its protocol evaluation ("Expected all tensors to be
    on the same device"). Found by the first run of scripts/gpu_checks.sh."""
    from creditaudit.protocol.checks import batch_class_mix

    labels = torch.arange(10).repeat_interleave(64)
    assert batch_class_mix(labels.cuda(), 64, 10) == batch_class_mix(labels, 64, 10)


@needs_cuda
@pytest.mark.parametrize("stacked", [False, True], ids=["alone", "stacked"])
def test_a_rate_beyond_float32_diverges_eagerly_on_the_gpu(tmp_path: Path, stacked: bool
                                                          ) -> None:
    """lr 1e300 cannot sit in the captured optimiser's float32 rate: the run (and a stack
    holding it) trains eagerly, diverges as on the CPU, and its record says why."""
    from creditaudit.run.stacked import train_stacked

    configs = [RunConfig().replace(**{**TINY, "run.device": "cuda", "run.seed": seed,
                                      "run.out_dir": str(tmp_path), "optim.lr": lr})
               for seed, lr in ((1, 1e-3), (2, 1e300))]
    results = (train_stacked(configs) if stacked
               else [Trainer(c).run() for c in configs])
    records = [load_record(r.run_dir) for r in results]
    assert records[1].status == "diverged"
    graphs = [r.environment["execution"]["cuda_graphs"] for r in records]
    assert graphs[1].startswith("off (learning rate 1e+300 is beyond float32")
    assert graphs[0] == ("off (stacked with a run whose step cannot be captured)"
                         if stacked else "on")


# --- a user's own loop with a model already on the GPU --------------------------------------
# Reviewed for CPU tensors meeting GPU ones after the class-mix defect: a rule bound to a
# model on the GPU kept what binding drew (fa-linear's B, the bridges' nets) on the CPU.
BOUND_RULES = (*RULES, "local-ce", "frozen")


def _bound_on(device: str, method: str) -> tuple[object, torch.Tensor, torch.Tensor]:
    """``method`` bound (no ``rule.to``) to a float64 ResidualMLP built on ``device``, and a
    batch there."""
    torch.manual_seed(0)
    model = ResidualMLP(12, 32, 10, 3, out_ln=True).double().to(device)
    rule = build_rule(model, MethodConfig(name=method), n_classes=10, seed=0)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 12, dtype=torch.float64, generator=gen)
    y = torch.randint(0, 10, (64,), generator=gen)
    return rule, x.to(device), y.to(device)


@needs_cuda
@pytest.mark.parametrize("method", BOUND_RULES)
def test_a_rule_bound_to_a_gpu_model_credits_and_steps_there(method: str) -> None:
    """``rule(name, model.cuda())``, the own-loop order: fa-linear's backward met its CPU
    feedback, credit-bridge's and state-bridge's nets stayed on the CPU."""
    from creditaudit.methods.footprint import _tensors

    on_cpu, x, y = _bound_on("cpu", method)
    on_gpu, xg, yg = _bound_on("cuda", method)
    held = [t for t in _tensors(on_gpu.state_dict()) if t.is_floating_point()]
    assert all(t.device.type == "cuda" for t in held), method
    for layer, (a, b) in enumerate(zip(on_cpu.credits(x, y), on_gpu.credits(xg, yg),
                                       strict=True)):
        error = float((b.cpu() - a).norm() / a.norm().clamp_min(1e-300))
        assert error < 1e-9, f"{method} layer {layer}: relative difference {error:.2e}"
    optimizer = torch.optim.AdamW(on_gpu.trainable_parameters(), lr=1e-3)
    on_gpu.model.train()
    assert on_gpu.train_step(xg, yg, optimizer).finite


OWN_NET = '''
from torch import nn


def net():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                         nn.Linear(16, 10))
'''


def _own_loop_record(tmp_path: Path, device: str, method: str):
    """A user's loop (docs/your_model.md) on ``device``: adapt() of a network there, the rule
    bound to it, a Recorder with the evaluation set there, two epochs and the end-of-run
    block. Returns the finished record."""
    from torch import nn

    from creditaudit import Recorder, adapt, rule

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                        nn.Linear(16, 10)).to(device)
    model = adapt(net, states=["1", "3"], input_shape=(8,))
    bound = rule(method, model)
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randn(256, 8, generator=gen), torch.randint(0, 10, (256,), generator=gen)
    x, y = x.to(device), y.to(device)
    optimizer = torch.optim.AdamW(bound.trainable_parameters(), lr=1e-3)
    options = {"diagnostics.rho_samples": 32, "diagnostics.rho_directions": 4,
               "diagnostics.null_draws": 3, "optim.epochs": 2}
    with Recorder(bound, x, y, out=tmp_path, config=options, progress=False) as rec:
        rec.epoch(0)
        for epoch in (1, 2):
            net.train()
            for start in range(0, 256, 64):
                bound.train_step(x[start:start + 64], y[start:start + 64], optimizer)
            rec.epoch(epoch, test_acc=0.5)
    return rec.record


@needs_cuda
@pytest.mark.parametrize("method", ("dfa", "fa-linear", "kp", "local-ce"))
def test_own_loop_recorder_on_the_gpu(tmp_path: Path, method: str) -> None:
    """adapt() of a GPU network, a rule bound to it, Recorder epochs with the protocol and
    the end-of-run block, all on the GPU (nothing tested the own loop there)."""
    record = _own_loop_record(tmp_path, "cuda", method)
    assert record.status == "completed", record.error
    assert record.environment["device"].startswith("cuda")
    assert record.log[-1].verdict is not None
    assert record.diagnostics.cosine_table


@needs_cuda
def test_a_recorder_network_moved_to_the_gpu_mid_run_is_refused(tmp_path: Path) -> None:
    """.to('cuda') keeps the parameter objects, so the Recorder's check saw no change, and
    the epoch ran the GPU network on the CPU evaluation set: torch's device error."""
    from torch import nn

    from creditaudit import Recorder, adapt, rule
    from creditaudit.errors import ConfigError

    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                        nn.Linear(16, 10))
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randn(64, 8, generator=gen), torch.randint(0, 10, (64,), generator=gen)
    rec = Recorder(rule("dfa", adapt(net, states=["1", "3"], input_shape=(8,))), x, y,
                   out=tmp_path, progress=False, config={"diagnostics.end_of_run": False})
    rec.epoch(0)
    net.to("cuda")
    with pytest.raises(ConfigError, match=r"'0.weight' moved from cpu to cuda:0"):
        rec.epoch(1)


@needs_cuda
def test_a_cuda_run_audits_with_its_metrics_on_the_gpu(tmp_path: Path) -> None:
    """`creditaudit audit RUN --device cuda` with the credit-quality block (ρ, nudging, the
    fresh-feedback null) and the CLI's own path, on a run trained on the GPU."""
    from creditaudit.audit import audit_run
    from creditaudit.cli import main

    config = RunConfig().replace(**{**TINY, "method.name": "fa", "run.out_dir": str(tmp_path),
                                    "run.device": "cuda"})
    result = Trainer(config).run()
    report = audit_run(str(result.run_dir), device="cuda", metrics=True)
    assert report.metrics and report.metrics["fresh_b_null"]["n"] == 3
    assert main(["audit", str(result.run_dir), "--device", "cuda", "--no-metrics", "-q"]) == 0


def test_a_rule_bound_to_a_model_off_the_cpu_is_moved_there(monkeypatch) -> None:
    """Runs everywhere: binding moves the rule to its model's device (the CUDA device stands
    in here), as a run's ``rule.to(device)`` does; on the CPU (and the meta device a run
    plan sizes on) nothing moves."""
    import creditaudit.methods as methods
    from creditaudit.methods import CreditBridge

    moved: list[torch.device] = []
    monkeypatch.setattr(CreditBridge, "to", lambda self, device: moved.append(device) or self)
    methods.rule("credit-bridge", ResidualMLP(12, 16, 10, 2, out_ln=True))
    assert not moved
    monkeypatch.setattr(methods, "accelerator_device", lambda model: torch.device("cuda", 1))
    methods.rule("credit-bridge", ResidualMLP(12, 16, 10, 2, out_ln=True))
    assert moved == [torch.device("cuda", 1)]
    monkeypatch.undo()
    assert methods.accelerator_device(ResidualMLP(12, 16, 10, 2)) is None
    assert methods.accelerator_device(ResidualMLP(12, 16, 10, 2).to("meta")) is None


def test_a_credit_function_on_another_device_than_the_states_is_refused() -> None:
    """Runs everywhere (the meta device stands in for the CPU copy of a GPU model's
    credit): one line naming the credit and both devices, not torch's device error from
    inside the cosines."""
    from creditaudit import diagnose
    from creditaudit.errors import ModelContractError

    torch.manual_seed(0)
    model = ResidualMLP(12, 16, 10, 2, out_ln=True)
    x, y = torch.randn(64, 12), torch.randint(0, 10, (64,))

    def elsewhere(xb: torch.Tensor, yb: torch.Tensor) -> list[torch.Tensor]:
        states, _ = model.forward_states(xb)
        return [torch.zeros_like(h, device="meta") for h in states]

    with pytest.raises(ModelContractError, match=r"credit\(x, y\)\[0\] is on meta but h_0 "
                                                 r"is on cpu"):
        diagnose(model, x, y, credit=elsewhere, metrics=False)


@pytest.mark.parametrize("images", [False, True], ids=["features", "images"])
def test_batch_by_batch_draws_for_data_off_the_host_are_made_on_the_host(
        monkeypatch, images: bool) -> None:
    """Runs everywhere: a loader over data on another device (meta stands in for a GPU)
    drawing batch by batch (``draw_per_epoch=False``) draws from its CPU generator on the
    CPU — torch refuses a CPU generator's draw on a GPU, which the stand-in enforces."""
    from creditaudit.data.loader import InMemoryLoader

    def strict(real):  # noqa: ANN001, ANN202 - a torch factory, wrapped
        def draw(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            generator, device = kwargs.get("generator"), kwargs.get("device")
            if generator is not None and device is not None \
                    and torch.device(device).type != generator.device.type:
                raise RuntimeError(f"Expected a '{torch.device(device).type}' device type "
                                   f"for generator but found '{generator.device.type}'")
            return real(*args, **kwargs)
        return draw

    for name in ("randperm", "randint", "rand"):
        monkeypatch.setattr(torch, name, strict(getattr(torch, name)))
    x = (torch.zeros(10, 3, 8, 8, dtype=torch.uint8) if images else torch.zeros(10, 4))
    loader = InMemoryLoader(x.to("meta"), torch.zeros(10, dtype=torch.int64, device="meta"),
                            4, shuffle=True, augment=images,
                            generator=torch.Generator().manual_seed(0), random_targets=10,
                            draw_per_epoch=False)
    batches = list(loader)
    assert len(batches) == 3
    assert all(a.device.type == b.device.type == "meta" for a, b in batches)


def test_diagnose_refuses_an_evaluation_set_on_another_device_than_the_model() -> None:
    """Runs everywhere (the meta device stands in for a GPU model given CPU data): one
    line, as Recorder says it, not torch's device error from inside the first forward."""
    from creditaudit import diagnose
    from creditaudit.errors import ConfigError

    model = ResidualMLP(12, 16, 10, 2, out_ln=True).to("meta")
    x, y = torch.randn(64, 12), torch.randint(0, 10, (64,))
    with pytest.raises(ConfigError, match=r"eval_x and eval_y are on cpu and cpu but the model "
                                          r"is on meta: move them with \.to\('meta'\)"):
        diagnose(model, x, y, metrics=False)


@needs_cuda
def test_a_plugin_diagnostic_reads_a_cuda_runs_evidence_on_the_cpu(tmp_path: Path,
                                                                   monkeypatch) -> None:
    """A plugin that works on CPU tensors only, as the conformance suite gave them (it adds a
    CPU tensor to the losses and reads the logits through NumPy), in a CUDA run's protocol
    and its audit on the GPU: it was handed the GPU evidence and failed mid-run."""
    from creditaudit.audit import audit_run
    from creditaudit.registry import DIAGNOSTICS, Origin
    from test_protocol_evidence import HostOnly

    DIAGNOSTICS.names()
    monkeypatch.setitem(DIAGNOSTICS._plugins, HostOnly.name,
                        DIAGNOSTICS.validate(HostOnly, "test"))
    monkeypatch.setitem(DIAGNOSTICS._origins, HostOnly.name,
                        Origin(builtin=False, distribution="tests"))
    config = RunConfig().replace(**{
        **TINY, "method.name": "dfa", "optim.epochs": 1, "run.out_dir": str(tmp_path),
        "run.device": "cuda", "diagnostics.end_of_run": False,
        "diagnostics.protocol": ["a", "b", "c", "d", HostOnly.name]})
    result = Trainer(config).run()
    assert result.status == "completed", result.record.error
    seen = result.record.protocol.report["diagnostics"][HostOnly.name]
    assert seen["status"] == "passed" and seen["details"]["devices"] == ["cpu"]
    audited = audit_run(str(result.run_dir), device="cuda", metrics=False)
    assert audited.diagnostic(HostOnly.name).details["devices"] == ["cpu"]
    assert audited.diagnostic(HostOnly.name).value == pytest.approx(seen["value"], rel=1e-4)
