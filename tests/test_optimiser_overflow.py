"""A huge finite setting that overflows AdamW's second moment to inf stops training silently
(every update m/(√inf + ε) is 0 while each step's loss stays finite): the run is recorded
as diverged with a reason naming the optimiser's state, never as completed at chance."""

from __future__ import annotations

import pytest
import torch

from creditaudit import RunConfig
from creditaudit.report import format_run_summary
from creditaudit.run.results import training_state_fault
from creditaudit.run.trainer import train

TINY = {"data.n_train": 128, "data.n_test": 128, "data.in_dim": 16, "model.d": 16,
        "model.n_blocks": 2, "optim.epochs": 2, "diagnostics.end_of_run": False,
        "diagnostics.eval_samples": 128, "run.progress": False}


def _train(tmp_path, **values):
    return train(RunConfig().replace(**{**TINY, "run.out_dir": str(tmp_path), **values}))


@pytest.mark.parametrize("settings", [
    {"method.name": "bp", "method.penalty": 1e30},
    {"method.name": "dfa", "method.feedback_scale": 1e30, "method.normalise_credit": False},
    {"method.name": "local-ce", "method.classifier_lr_scale": 1e30}],
    ids=["bp-penalty", "dfa-feedback-scale", "local-ce-classifier-lr-scale"])
def test_an_overflowed_optimiser_state_is_a_divergence_naming_it(tmp_path, settings):
    result = _train(tmp_path, **settings)
    record = result.record
    assert record.status == "diverged", record.status
    reason = record.divergence["reason"]
    assert "the optimiser's exp_avg_sq of" in reason and "overflowed to NaN/Inf" in reason
    epoch = record.divergence["epoch"]
    assert f"diverged in epoch {epoch}" in format_run_summary([record])
    assert record.final is not None and record.final.test_loss is not None  # finite, marked ‡


def test_a_healthy_run_has_no_fault_and_completes(tmp_path):
    result = _train(tmp_path, **{"method.name": "dfa"})
    assert result.record.status == "completed" and result.record.divergence is None
    optimizer = torch.optim.AdamW(result.rule.trainable_parameters())
    assert training_state_fault(result.rule.model, optimizer) is None


def test_a_non_finite_parameter_or_moment_is_named():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    assert training_state_fault(model, optimizer) is None
    optimizer.state[model[0].bias]["exp_avg_sq"].fill_(float("inf"))
    assert "exp_avg_sq of 0.bias" in training_state_fault(model, optimizer)
    with torch.no_grad():
        model[0].weight[0, 0] = float("nan")
    assert training_state_fault(model, optimizer) == "non-finite parameter 0.weight"


def test_a_frozen_parameter_holding_inf_by_design_is_no_fault():
    """A parameter that does not train may hold ±inf on purpose (a -inf attention or input
    mask): only trained parameters and their moments are checked."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    model.mask = torch.nn.Parameter(torch.tensor([0.0, -float("inf")]), requires_grad=False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    assert training_state_fault(model, optimizer) is None
    model.mask.requires_grad_(True)  # the same value in a parameter that trains is a fault
    assert training_state_fault(model, optimizer) == "non-finite parameter mask"
