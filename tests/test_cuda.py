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
from creditaudit.run_ids import run_id
from creditaudit.training import Trainer

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
    """Why bf16 and never fp16: diagnostic (b) must see ‖g_L‖ ~ 1e-9 (SPEC §6)."""
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
