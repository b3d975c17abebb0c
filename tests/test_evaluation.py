"""Test-split evaluation: predictions reused from the diagnostics count exactly once."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from creditaudit.config import RunConfig
from creditaudit.measures.epoch import rule_credits
from creditaudit.measures.gradients import state_gradients
from creditaudit.run.evaluation import KnownPredictions, evaluate
from creditaudit.run.results import epoch_record
from creditaudit.run.trainer import Trainer

pytestmark = pytest.mark.usefixtures("single_thread")

SMALL = {
    "data.n_train": 256, "data.n_test": 600, "data.in_dim": 8, "data.teacher_width": 32,
    "model.d": 16, "model.n_blocks": 2, "optim.epochs": 1, "optim.batch_size": 64,
    "diagnostics.eval_samples": 200, "diagnostics.end_of_run": False, "run.progress": False,
}


def trainer(tmp_path, method: str = "dfa") -> Trainer:
    config = RunConfig().replace(**{**SMALL, "method.name": method,
                                    "run.out_dir": str(tmp_path)})
    return Trainer(config)


def by_hand(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    with torch.no_grad():
        logits = model(x).double()
    return float(F.cross_entropy(logits, y)), float((logits.argmax(1) == y).double().mean())


def test_evaluate_matches_a_by_hand_pass_over_the_test_split(tmp_path):
    t = trainer(tmp_path)
    x, y = t.dataset.prepare(t.dataset.test_x, flatten=t.flatten), t.dataset.test_y
    loss, acc = evaluate(t.model, t.dataset, t.device, flatten=t.flatten)
    want_loss, want_acc = by_hand(t.model, x, y)
    assert loss == pytest.approx(want_loss, rel=1e-6)
    assert acc == want_acc


def test_known_predictions_are_not_forwarded_again_and_count_once(tmp_path):
    t = trainer(tmp_path)
    plain = evaluate(t.model, t.dataset, t.device, flatten=t.flatten)
    sg = state_gradients(t.model.forward_states, t.eval_x, t.eval_y)
    known = KnownPredictions.from_logits(t.eval_indices, sg.logits, t.eval_y)
    seen: list[int] = []
    original = t.model.forward

    def counting(x):
        seen.append(x.shape[0])
        return original(x)

    t.model.forward = counting
    loss, acc = evaluate(t.model, t.dataset, t.device, flatten=t.flatten, known=known)
    assert sum(seen) == 600 - 200  # only the samples outside the evaluation subset
    assert loss == pytest.approx(plain[0], rel=1e-6)
    assert acc == plain[1]


def test_all_samples_known_means_no_forward_at_all(tmp_path):
    t = trainer(tmp_path)
    everything = torch.arange(600)
    x = t.dataset.prepare(t.dataset.test_x, flatten=t.flatten)
    with torch.no_grad():
        logits = t.model(x)
    known = KnownPredictions.from_logits(everything, logits, t.dataset.test_y)

    def refuse(x):
        raise AssertionError("forwarded a known sample")

    t.model.forward = refuse
    loss, acc = evaluate(t.model, t.dataset, t.device, flatten=t.flatten, known=known)
    assert (loss, acc) == pytest.approx(by_hand(torch.nn.Identity(), logits, t.dataset.test_y))


def test_eval_indices_are_the_rows_of_the_eval_subset(tmp_path):
    t = trainer(tmp_path)
    rows = t.dataset.prepare(t.dataset.test_x[t.eval_indices], flatten=t.flatten)
    assert torch.equal(rows.to(t.eval_x.device), t.eval_x)
    assert torch.equal(t.dataset.test_y[t.eval_indices].to(t.eval_y.device), t.eval_y)
    assert len(set(t.eval_indices.tolist())) == 200


@pytest.mark.parametrize("method", ["bp", "dfa"])
def test_measured_epoch_reports_the_whole_test_split(tmp_path, method):
    t = trainer(tmp_path, method)
    entry = t.measure(1)  # the final epoch: diagnostics and protocol run
    assert entry.measures is not None
    x, y = t.dataset.prepare(t.dataset.test_x, flatten=t.flatten), t.dataset.test_y
    want_loss, want_acc = by_hand(t.model, x, y)
    assert entry.test_loss == pytest.approx(want_loss, rel=1e-6)
    assert entry.acc_eval == want_acc


def test_bp_credits_reused_from_the_reference_give_the_same_cosines(tmp_path):
    t = trainer(tmp_path, "bp")
    fields, sg = epoch_record(t.rule, t.eval_x, t.eval_y)
    recomputed = rule_credits(t.rule, t.eval_x, t.eval_y)
    for a, g in zip(recomputed, sg.grads):
        cos = F.cosine_similarity(a.double(), g.double(), dim=1)
        assert float(cos.min()) > 1 - 1e-6
    assert all(c == pytest.approx(1.0, abs=1e-12) for c in fields["cos_per_layer"])


def test_a_test_evaluation_refuses_predictions_for_other_samples(tmp_path):
    t = trainer(tmp_path)
    sg = state_gradients(t.model.forward_states, t.eval_x, t.eval_y)
    known = KnownPredictions.from_logits(t.eval_indices, sg.logits, t.eval_y)
    shifted = KnownPredictions(t.eval_indices.flip(0), known.losses, known.correct)
    with pytest.raises(ValueError, match="other test samples"):
        t.test_evaluation.run(t.model, t.device, shifted)
    with pytest.raises(ValueError, match="exactly the shared samples"):
        t.test_evaluation.run(t.model, t.device)
    assert t.test_evaluation.run(t.model, t.device, known) == pytest.approx(
        t.full_evaluation.run(t.model, t.device), rel=1e-6)
