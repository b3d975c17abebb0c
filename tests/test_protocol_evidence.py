"""The protocol says no more than its evidence: (b) names LN cancellation only for a stream
that grew and says in words when every gradient is 0."""

from __future__ import annotations

import json

import pytest
import torch

from creditaudit.audit.diagnose import diagnose
from creditaudit.models import ResidualMLP
from creditaudit.protocol import CAUSE_FLOOR, CAUSE_LN, evaluate_protocol
from test_protocol import make_sg


# --- (b): the cause the evidence supports ----------------------------------------------------
@pytest.mark.parametrize(("h_last", "cause", "grew"), [(5.0, CAUSE_FLOOR, False),
                                                        (5e4, CAUSE_LN, True)])
def test_b_names_ln_cancellation_only_when_the_stream_grew(h_last, cause, grew):
    """A model with a terminal LN whose ‖g_L‖ is below the floor although its stream did not
    grow read "LN cancellation of a grown residual stream"."""
    sg = make_sg(h_norms=(5.0, 5.0, 5.0, 5.0, h_last), g_norms=(1e-3,) * 4 + (1e-9,))
    b = evaluate_protocol(sg, headline_acc=None, frozen_acc=None,
                          terminal_ln=True).diagnostic("b")
    assert b.status == "fired" and b.details["stream_grew"] is grew
    assert b.details["cause"] == cause
    assert ("LN cancellation of a grown" in b.reason) is grew
    if not grew:
        assert "did not grow by more than 50×: not LN cancellation" in b.reason


def test_b_on_a_live_ln_model_with_tiny_head_weights_is_no_ln_cancellation():
    torch.manual_seed(0)
    model = ResidualMLP(in_dim=8, d=8, n_classes=4, n_blocks=2)
    with torch.no_grad():
        model.out_head.weight.mul_(1e-6)
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    report = diagnose(model, x, y)
    b = report.diagnostic("b")
    assert report.diagnostic("a").status == "passed"
    assert b.status == "fired" and b.details["cause"] == CAUSE_FLOOR


def test_b_says_in_words_that_every_gradient_is_zero():
    model = ResidualMLP(in_dim=8, d=8, n_classes=4, n_blocks=2)
    with torch.no_grad():
        model.out_head.weight.zero_()
    report = diagnose(model, torch.randn(16, 8), torch.randint(0, 4, (16,)))
    b = report.diagnostic("b")
    assert b.details["zero_fraction"] == 1.0
    assert "nan" not in b.reason.lower()
    assert "every per-sample gradient is exactly 0" in b.reason
    assert "nan" not in json.loads(report.to_json())["diagnostics"]["b"]["reason"].lower()
