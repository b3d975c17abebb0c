"""Stacked runs: K runs trained as one stacked model give each run the record, checkpoint and
resume it gets trained alone (float64: to rounding; the measured bound is stated below);
the data path that keeps data on the device gives the same batches as the host path.
"""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from creditaudit.config import MethodConfig, RunConfig
from creditaudit.data import Dataset
from creditaudit.data.loader import InMemoryLoader
from creditaudit.errors import ConfigError
from creditaudit.methods.stacked import stack_refusal, stacked_rule_names
from creditaudit.records import CHECKPOINT_FILE, comparable, load_checkpoint, load_record
from creditaudit.run.plan import run_id
from creditaudit.run.stacked import stack_groups, stack_key, train_stacked
from creditaudit.run.steps.epochs import StackedEpochs
from creditaudit.run.trainer import Trainer, train
from creditaudit.testing import make_rule

pytestmark = pytest.mark.usefixtures("single_thread")

# Stacked vs alone in float64, after 2 epochs of these tiny runs, over every number in the
# record and every checkpointed tensor: measured at most 2.0e-15 relative (BP 5e-16, FA
# 6e-16, DFA and DRTP 2e-15: vmap batches the matmuls and layer norms, and DFA takes the
# dense route instead of the projected one). In float32: at most 1.1e-5 (DRTP's record).
TOLERANCE = 1e-13
# The end-of-run block's nudging and ρ are finite differences of losses, which amplify those
# differences: measured at most 8.4e-12 relative (a nudging control at η = 0.01).
END_OF_RUN_TOLERANCE = 1e-10
TINY = {
    "data.n_train": 256, "data.n_test": 128, "data.in_dim": 6, "data.teacher_width": 16,
    "model.d": 8, "model.n_blocks": 2, "optim.epochs": 2, "optim.batch_size": 64,
    "diagnostics.eval_samples": 64, "diagnostics.end_of_run": False, "run.progress": False,
}
# What the runs of one stack differ in: seed, learning rate, λ, feedback seed.
VARIANTS = ({"run.seed": 1}, {"run.seed": 2, "optim.lr": 3e-3, "method.penalty": 0.01},
            {"run.seed": 3, "optim.lr": 1e-2, "method.feedback_seed": 9})


def configs(out: Path, method: str, **extra: Any) -> list[RunConfig]:
    """The three :data:`VARIANTS` of a tiny run (the feedback seed only where the rule has
    one, the penalty only where a block trains)."""
    from creditaudit.methods import rule_class

    cls = rule_class(method)
    # the feedback seed only where the rule has one; no penalty where no block trains
    left_out = {*(() if cls.draws_feedback() else ("method.feedback_seed",)),
                *(("method.penalty",) if cls.baseline else ())}
    return [RunConfig().replace(**{**TINY, "method.name": method, "run.out_dir": str(out),
                                   **{k: v for k, v in variant.items() if k not in left_out},
                                   **extra})
            for variant in VARIANTS]


def relative_gap(a: Any, b: Any, path: str = "") -> float:
    """The largest relative difference between two JSON-like values; AssertionError when
    anything but a finite float differs."""
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            assert math.isnan(a) and math.isnan(b), path
            return 0.0
        return abs(a - b) / max(abs(a), abs(b), 1e-300)
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        return max([relative_gap(a[k], b[k], f"{path}.{k}") for k in a], default=0.0)
    if isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        return max([relative_gap(x, y, f"{path}[{i}]") for i, (x, y) in
                    enumerate(zip(a, b))], default=0.0)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        if not a.is_floating_point():
            assert torch.equal(a, b), path
            return 0.0
        return float((a - b).norm() / a.norm().clamp_min(1e-300))
    assert a == b, f"{path}: {a!r} != {b!r}"
    return 0.0


def checkpoint_gap(a: Path, b: Path) -> float:
    """Largest relative gap between two checkpoints; the RNG states must be equal."""
    sa, sb = load_checkpoint(a / CHECKPOINT_FILE), load_checkpoint(b / CHECKPOINT_FILE)
    assert sa["epoch"] == sb["epoch"]
    assert torch.equal(sa["rng"]["data"], sb["rng"]["data"])
    assert torch.equal(sa["rng"]["torch"], sb["rng"]["torch"])
    return max(relative_gap(comparable(sa["record"]), comparable(sb["record"]), "record"),
               *(relative_gap(sa[key], sb[key], key)
                 for key in ("model", "optimizer", "scheduler", "rule")))


# --- stacked equals alone -----------------------------------------------------------------
@pytest.mark.parametrize("method", sorted(stacked_rule_names()))
def test_stacked_runs_equal_the_runs_trained_alone(tmp_path, float64, method):
    alone = [train(c) for c in configs(tmp_path / "alone", method)]
    stacked = train_stacked(configs(tmp_path / "stacked", method))
    for a, s in zip(alone, stacked, strict=True):
        assert s.status == a.status == "completed"
        assert s.run_dir.name == a.run_dir.name
        assert relative_gap(comparable(a.record), comparable(s.record)) < TOLERANCE
        assert relative_gap(comparable(a.record), comparable(load_record(s.run_dir))) \
            < TOLERANCE
        assert checkpoint_gap(a.run_dir, s.run_dir) < TOLERANCE
        assert s.record.environment["execution"]["stacked_runs"] == len(VARIANTS)
        assert a.record.environment["execution"]["stacked_runs"] == 1


def test_end_of_run_metrics_of_stacked_runs(tmp_path, float64):
    extra = {"diagnostics.end_of_run": True, "diagnostics.rho_samples": 16,
             "diagnostics.rho_directions": 2, "diagnostics.null_draws": 2,
             "optim.epochs": 1}
    alone = [train(c) for c in configs(tmp_path / "a", "dfa", **extra)]
    stacked = train_stacked(configs(tmp_path / "s", "dfa", **extra))
    for a, s in zip(alone, stacked, strict=True):
        assert s.record.diagnostics.drift is not None
        ra, rs = comparable(a.record), comparable(s.record)
        assert relative_gap(ra.pop("diagnostics"), rs.pop("diagnostics")) < END_OF_RUN_TOLERANCE
        assert relative_gap(ra, rs) < TOLERANCE


def test_fp32_stacked_runs_agree_to_float32_rounding(tmp_path):
    alone = [train(c) for c in configs(tmp_path / "a", "bp")]
    stacked = train_stacked(configs(tmp_path / "s", "bp"))
    for a, s in zip(alone, stacked, strict=True):
        assert checkpoint_gap(a.run_dir, s.run_dir) < 1e-4


def test_a_run_that_diverges_in_a_stack_stops_where_it_stops_alone(tmp_path, float64):
    runs = configs(tmp_path / "a", "dfa")
    runs[1] = runs[1].replace(**{"optim.lr": 1e300})
    alone = [train(c) for c in runs]
    assert alone[1].status == "diverged" and alone[1].record.divergence["step"] >= 0
    stacked = train_stacked([c.replace(**{"run.out_dir": str(tmp_path / "s")}) for c in runs])
    for a, s in zip(alone, stacked, strict=True):
        assert s.status == a.status
        assert s.record.divergence == a.record.divergence
        assert relative_gap(comparable(a.record), comparable(s.record)) < TOLERANCE
        assert checkpoint_gap(a.run_dir, s.run_dir) < TOLERANCE


def test_a_stack_a_run_left_records_the_smaller_stack_it_trained_in(tmp_path):
    """A stack of 3 whose second run diverges in epoch 1: the others' epoch 2 trained in a
    stack of 2, while their records said stacked_runs = 3 and nothing more."""
    runs = configs(tmp_path, "dfa")
    runs[1] = runs[1].replace(**{"optim.lr": 1e300})
    results = train_stacked(runs)
    assert [r.status for r in results] == ["completed", "diverged", "completed"]
    for result, later in zip(results, ([{"epoch": 2, "stacked_runs": 2}], None,
                                       [{"epoch": 2, "stacked_runs": 2}]), strict=True):
        for record in (result.record, load_record(result.run_dir)):
            execution = record.environment["execution"]
            assert execution["stacked_runs"] == 3
            assert execution.get("stacked_runs_from") == later


def test_the_once_per_epoch_check_trains_a_diverged_epoch_again_bit_for_bit(tmp_path,
                                                                             float64):
    """check="epoch" reads the device buffers once per epoch; an epoch in which a run turned
    non-finite is trained again with per-step checks, giving exactly the per-step result."""
    runs = configs(tmp_path, "bp")
    runs[0] = runs[0].replace(**{"optim.lr": 1e300})

    def epochs(check: str) -> tuple[list[Any], list[Trainer]]:
        trainers = [Trainer(c) for c in runs]
        runner = StackedEpochs(trainers, check=check)
        return [runner.train_epoch(e) for e in (1, 2)], trainers

    (per_step, a), (per_epoch, b) = epochs("step"), epochs("epoch")
    assert per_step[0][0] is None and a[0].record.divergence is not None
    assert per_step == per_epoch
    assert b[0].record.divergence == a[0].record.divergence
    for x, y in zip(a, b, strict=True):
        for p, q in zip(x.model.parameters(), y.model.parameters(), strict=True):
            assert torch.equal(p, q)
        assert torch.equal(x.data_generator.get_state(), y.data_generator.get_state())


def interrupt_in_epoch_2(runs, monkeypatch) -> None:
    """Train the stack of ``runs`` with a Ctrl-C as its epoch 2 starts (epoch 1 saved)."""
    original = StackedEpochs.train_epoch

    def kill(self, epoch):
        if epoch == 2:
            raise KeyboardInterrupt
        return original(self, epoch)

    monkeypatch.setattr(StackedEpochs, "train_epoch", kill)
    with pytest.raises(KeyboardInterrupt):
        train_stacked(runs)
    monkeypatch.setattr(StackedEpochs, "train_epoch", original)


def test_a_killed_stack_resumes_to_the_uninterrupted_result(tmp_path, float64, monkeypatch):
    straight = train_stacked(configs(tmp_path / "a", "fa", **{"optim.epochs": 3}))
    killed = configs(tmp_path / "b", "fa", **{"optim.epochs": 3})
    interrupt_in_epoch_2(killed, monkeypatch)
    assert {load_record(Path(c.run.out_dir) / run_id(c)).status for c in killed} == {
        "interrupted"}
    resumed = train_stacked(killed, resume=True)
    for a, r in zip(straight, resumed, strict=True):
        assert r.status == "completed"
        assert comparable(a.record) == comparable(r.record)
        assert checkpoint_gap(a.run_dir, r.run_dir) == 0.0
    again = train_stacked(killed)  # finished: returned, not trained
    assert [comparable(r.record) for r in again] == [comparable(r.record) for r in resumed]


def test_a_stack_killed_while_it_measures_resumes_as_one_stack(tmp_path, monkeypatch):
    # Ctrl-C (or a kill) while the second run of the stack measured its epoch 2: the stack
    # closed its runs one after the other, so the first was checkpointed at epoch 2 and the
    # second at epoch 1; resumed, each trained on in a stack of its own, whose step differs
    # in the last bits from the stacked one (float32: the weights and the records differed
    # from the uninterrupted stack's at ~1e-8). Now every run is measured before any is
    # checkpointed: both resume from epoch 1, as one stack, bit for bit.
    options = {"optim.epochs": 3, "diagnostics.end_of_run": True,
               "diagnostics.rho_samples": 8, "diagnostics.rho_directions": 2,
               "diagnostics.null_draws": 2}
    straight = train_stacked(configs(tmp_path / "a", "dfa", **options)[:2])
    killed = configs(tmp_path / "b", "dfa", **options)[:2]
    second = run_id(killed[1])
    original = Trainer.measure

    def interrupted(self, epoch):  # noqa: ANN001, ANN202
        if epoch == 2 and self.run_id == second:
            raise KeyboardInterrupt
        return original(self, epoch)

    monkeypatch.setattr(Trainer, "measure", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_stacked(killed)
    monkeypatch.setattr(Trainer, "measure", original)
    dirs = [Path(c.run.out_dir) / run_id(c) for c in killed]
    assert [load_checkpoint(d / CHECKPOINT_FILE)["epoch"] for d in dirs] == [1, 1]
    assert [[e.epoch for e in load_record(d).log] for d in dirs] == [[0, 1], [0, 1]]
    # and each record says what its checkpoint holds: the first run, measured before the
    # interrupt, kept in its record the protocol state of its epoch 2, which neither its
    # log nor its checkpoint holds (protocol.epoch 2 beside a log ending at epoch 1)
    assert [load_record(d).protocol.epoch for d in dirs] == [1, 1]
    resumed = train_stacked(killed, resume=True)
    for a, r in zip(straight, resumed, strict=True):
        assert r.record.resumed[0].environment["execution"]["stacked_runs"] == 2
        assert comparable(a.record) == comparable(r.record)
        assert checkpoint_gap(a.run_dir, r.run_dir) == 0.0


# A stack SIGKILLed right after the first of its runs wrote its checkpoint of epoch 2.
KILLED_BETWEEN_CHECKPOINTS = """
import json, os, signal, sys
from creditaudit.config import RunConfig
from creditaudit.run.stacked import train_stacked
from creditaudit.run.trainer import Trainer
original = Trainer.checkpoint
def checkpoint(self, epoch):
    original(self, epoch)
    if epoch == 2:
        os.kill(os.getpid(), signal.SIGKILL)
Trainer.checkpoint = checkpoint
train_stacked([RunConfig().replace(**o) for o in json.loads(sys.argv[1])])
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_stack_killed_between_its_checkpoint_writes_resumes_as_one_stack(tmp_path):
    """A stack killed (-9) between two of its runs' checkpoint writes of epoch 2 left the
    first checkpointed at epoch 2, the second at epoch 1: resumed, each trained on in a stack
    of its own (the second from epoch 2, the first from 3), and both ended other than the
    uninterrupted stack (the records' losses and norms, the weights: in the last bits). Now
    the stack's checkpoints are one commit: both resume from epoch 1, as one stack, bit for
    bit, and no kept checkpoint is left in their folders."""
    def overrides(out: Path) -> list[dict[str, Any]]:
        return [{**TINY, "method.name": "dfa", "optim.epochs": 3, "run.out_dir": str(out),
                 **variant} for variant in VARIANTS[:2]]

    straight = train_stacked([RunConfig().replace(**o) for o in overrides(tmp_path / "a")])
    killed = subprocess.run([sys.executable, "-c", KILLED_BETWEEN_CHECKPOINTS,
                             json.dumps(overrides(tmp_path / "b"))],
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    runs = [RunConfig().replace(**o) for o in overrides(tmp_path / "b")]
    dirs = [tmp_path / "b" / run_id(c) for c in runs]
    assert [load_checkpoint(d / CHECKPOINT_FILE)["epoch"] for d in dirs] == [2, 1]
    resumed = train_stacked(runs, resume=True)
    for a, r in zip(straight, resumed, strict=True):
        assert r.status == "completed"
        assert [(p.epoch, p.environment["execution"]["stacked_runs"])
                for p in r.record.resumed] == [(2, 2)]
        assert comparable(a.record) == comparable(r.record)
        assert checkpoint_gap(a.run_dir, r.run_dir) == 0.0
        assert sorted(p.name for p in r.run_dir.iterdir()) == sorted(
            p.name for p in a.run_dir.iterdir())


def test_a_run_whose_resume_fails_fails_alone_and_the_stack_trains_on(tmp_path, monkeypatch):
    """One run's damaged checkpoint fails that run, as alone; the others of its stack resume
    and finish instead of failing with it (in a sweep, on every rerun)."""
    runs = configs(tmp_path, "bp", **{"optim.epochs": 2})
    interrupt_in_epoch_2(runs, monkeypatch)
    damaged = tmp_path / run_id(runs[1]) / CHECKPOINT_FILE
    damaged.write_bytes(b"not a checkpoint")
    results = train_stacked(runs, resume=True)
    assert [r.status for r in results] == ["completed", "failed", "completed"]
    assert "cannot be read" in results[1].record.error
    assert [load_record(tmp_path / run_id(c)).status for c in runs] == [
        "completed", "interrupted", "completed"]  # the damaged run's folder as it was


def test_a_run_left_alone_in_its_stack_trains_as_it_does_alone(tmp_path):
    """A group of one (a stack of one, or resumed from its own epoch) records
    stacked_runs = 1, as a run trained alone does: its numbers are that run's, bit for bit."""
    config = configs(tmp_path / "a", "dfa")[0]
    alone = train(config)
    (stacked,) = train_stacked([config.replace(**{"run.out_dir": str(tmp_path / "s")})])
    assert stacked.record.environment["execution"]["stacked_runs"] == 1
    assert comparable(stacked.record) == comparable(alone.record)
    assert checkpoint_gap(alone.run_dir, stacked.run_dir) == 0.0


def test_a_run_of_a_group_that_trains_alone_fails_alone(tmp_path, monkeypatch):
    """Runs of one shape whose model cannot stack (BatchNorm's buffers) train one after
    another; one's failure is its own: the others train, and no record of a run that never
    trained names another run's error."""
    from creditaudit.sweep.worker import run_group

    runs = [RunConfig().replace(**{
        **TINY, "data.n_train": 64, "data.n_test": 32, "data.in_dim": 3072,
        "model.arch": "convmixer", "optim.epochs": 1, "optim.batch_size": 32,
        "diagnostics.eval_samples": 32, "method.name": "dfa", "run.out_dir": str(tmp_path),
        "run.seed": seed}) for seed in (1, 2)]
    original = Trainer.train_epoch

    def first_fails(self, epoch):
        if self.config.run.seed == 1:
            raise RuntimeError("seed 1 exploded")
        return original(self, epoch)

    monkeypatch.setattr(Trainer, "train_epoch", first_fails)
    outcomes = run_group([c.to_dict() for c in runs], run_ids=[run_id(c) for c in runs])
    assert [o["status"] for o in outcomes] == ["failed", "completed"]
    records = [load_record(tmp_path / run_id(c)) for c in runs]
    assert [r.status for r in records] == ["failed", "completed"]
    assert "seed 1 exploded" in records[0].error and records[1].error is None


def test_a_run_listed_twice_in_a_stack_is_refused(tmp_path):
    """Both would train into its one folder, its record counting it twice in its stack."""
    config = configs(tmp_path, "bp")[0]
    with pytest.raises(ConfigError, match=r"runs 1 and 3 of the stack are the same run"):
        train_stacked([config, config.replace(**{"run.seed": 5}), config])
    assert not (tmp_path / run_id(config)).exists()


# --- what stacks, and what trains alone ----------------------------------------------------
def test_stack_groups_follow_the_shared_shape(tmp_path):
    base = RunConfig().replace(**{**TINY, "run.out_dir": str(tmp_path)})
    runs = [base.replace(**{"run.seed": s}) for s in (1, 2, 3)]
    runs += [base.replace(**{"model.d": 16})]  # another shape
    runs += [base.replace(**{"method.name": "ep"})]  # a rule that does not stack
    runs += [base.replace(**{"optim.lr": 0.5, "method.penalty": 0.1,
                             "diagnostics.every": 2})]
    assert stack_groups(runs, 8) == [[0, 1, 2, 5], [3], [4]]
    assert stack_groups(runs, 2) == [[0, 1], [2, 5], [3], [4]]
    assert stack_groups(runs, 1) == [[0], [1], [2], [3], [4], [5]]
    assert stack_key(runs[4]) is None
    assert stack_key(runs[0].replace(**{"run.out_dir": "elsewhere", "run.threads": 2})) \
        == stack_key(runs[0])
    with pytest.raises(ConfigError, match="--stack must be >= 1"):
        stack_groups(runs, 0)


def test_train_stacked_refuses_runs_of_different_shapes(tmp_path):
    base = RunConfig().replace(**{**TINY, "run.out_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"run 2 differs from run 1 in model\.d"):
        train_stacked([base, base.replace(**{"model.d": 16})])
    with pytest.raises(ConfigError, match="does not train stacked"):
        train_stacked([base.replace(**{"method.name": "fa-linear"})])
    assert not (tmp_path / run_id(base)).exists()


def test_each_rule_declares_its_stacked_step():
    """The rule class says how it steps stacked; the built-ins step as they always have."""
    from creditaudit.methods import rule_class

    kinds = {name: rule_class(name).stacks_as() for name in stacked_rule_names()}
    assert kinds == {"bp": "end_to_end", "frozen": "end_to_end", "dfa": "projected",
                     "drtp": "projected", "fa": "fa"}


def test_a_subclass_of_a_stacked_rule_steps_alone_until_it_declares_so():
    """``stacked_step`` is never inherited: a DFA variant with its own step must not be
    stepped as DFA behind its back."""
    from creditaudit.methods import DFA

    class Variant(DFA):
        name, label = "dfa-variant", "DFA variant"

    assert Variant.stacks_as() is None
    refusal = stack_refusal(make_rule(Variant, arch="resmlp"))
    assert refusal is not None and "DFA variant step is not written for stacked" in refusal
    assert ("(built-in rules that are: bp, fa, dfa, drtp, frozen; a rule declares it with "
            "stacked_step)") in refusal

    class Declared(DFA):
        name, label = "dfa-declared", "DFA declared"
        stacked_step = "projected"

    assert stack_refusal(make_rule(Declared, arch="resmlp")) is None


def test_a_plugin_rule_steps_stacked_as_it_declares_unless_it_waives_the_check(monkeypatch):
    """A plugin rule passed the door's conformance checks, the stacked one among them
    (tests/test_stacked_plugins.py trains one), so it stacks as it declares; one that
    declares that check a failure by design steps alone."""
    from creditaudit.methods import DFA
    from creditaudit.methods.registry import RULES

    class Declared(DFA):
        name, label = "dfa-plugin-declared", "DFA plugin"
        stacked_step = "projected"

    class Waived(DFA):
        name, label = "dfa-plugin-waived", "DFA waived"
        stacked_step = "projected"
        expected_failures = {"stacked_step_is_the_rule_step[resmlp]": "its own step"}

    real = RULES.guest
    monkeypatch.setattr(RULES, "guest", lambda name: object() if name.startswith("dfa-plugin")
                        else real(name))
    assert stack_refusal(make_rule(Declared, arch="resmlp")) is None
    refusal = stack_refusal(make_rule(Waived, arch="resmlp"))
    assert refusal == ("DFA waived declares that its stacked step fails the conformance check "
                       "stacked_step_is_the_rule_step[resmlp]: it steps alone with its own "
                       "train_step")


@pytest.mark.parametrize(("declared", "message"), [
    ("sideways", "has stacked_step 'sideways'; use one of end_to_end, projected, fa or None"),
    ("fa", "declares stacked_step 'fa' but has no propagate method"),
])
def test_a_rule_declaring_a_stacked_step_it_lacks_is_refused(declared, message):
    from creditaudit.methods import BP
    from creditaudit.methods.registry import validate_rule_class

    bad = type("Bad", (BP,), {"name": "bad", "label": "Bad", "stacked_step": declared})
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_rule_class(bad, "test rule")


@pytest.mark.parametrize(("method", "arch", "reason"), [
    ("fa-linear", "resmlp", "not written for stacked"),
    ("ep", "resmlp", "not written for stacked"),
    ("dfa", "convmixer", "buffers"),
    ("bp", "adapted-transformer", "adapted model"),
])
def test_stack_refusal_says_why(method, arch, reason):
    from creditaudit.methods import rule_class

    assert reason in stack_refusal(make_rule(rule_class(method), arch=arch))


@pytest.mark.parametrize("arch", ["resmlp", "vit"])
@pytest.mark.parametrize("method", sorted(stacked_rule_names()))
def test_stacked_step_on_every_architecture_that_stacks(method, arch, float64):
    """One stacked step of two tiny runs equals each run's own step (float64 rounding)."""
    from creditaudit.methods import rule_class
    from creditaudit.testing import tiny_batch

    class Run:
        def __init__(self, seed: int) -> None:
            self.rule = make_rule(rule_class(method), seed=seed, arch=arch)
            self.model = self.rule.model
            self.optimizer = torch.optim.SGD(self.rule.trainable_parameters(), lr=0.1)
            self.device = torch.device("cpu")

    runs, alone = [Run(0), Run(1)], [Run(0), Run(1)]
    batches = [tiny_batch(seed=s, arch=arch) for s in (1, 2)]
    for run, (x, y) in zip(alone, batches, strict=True):
        assert run.rule.train_step(x, y, run.optimizer).finite
    from creditaudit.methods.stacked import StackedStep

    step = StackedStep(runs)
    step.stack()
    out = step.forward_backward(torch.stack([b[0] for b in batches]),
                                torch.stack([b[1] for b in batches]))
    step.optimize([0, 1])
    step.unstack()
    assert out.finite.all()
    for a, s in zip(alone, runs, strict=True):
        for p, q in zip(a.model.parameters(), s.model.parameters(), strict=True):
            assert relative_gap(p.detach(), q.detach()) < TOLERANCE


# --- data on the device ----------------------------------------------------------------------
def images(n: int = 200, seed: int = 0) -> Dataset:
    """CIFAR-like uint8 images (3×8×8), augmented and normalised as CIFAR is."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8, generator=gen)
    y = torch.randint(0, 10, (n,), generator=gen)
    return Dataset(name="images", train_x=x[:150], train_y=y[:150], test_x=x[150:],
                   test_y=y[150:], n_classes=10, mean=(0.5, 0.4, 0.3), std=(0.2, 0.3, 0.25),
                   augment=True)


@pytest.mark.parametrize("random_targets", [None, 10])
@pytest.mark.parametrize("flatten", [False, True])
def test_epoch_draws_give_the_batches_of_the_per_batch_path(random_targets, flatten):
    data = images()

    def batches(per_epoch: bool) -> tuple[list[tuple[torch.Tensor, torch.Tensor]],
                                          torch.Tensor]:
        gen = torch.Generator().manual_seed(5)
        loader = InMemoryLoader(data.train_x, data.train_y, 32, shuffle=True, generator=gen,
                                augment=True, mean=data.mean, std=data.std, flatten=flatten,
                                random_targets=random_targets, draw_per_epoch=per_epoch)
        return [b for _ in range(2) for b in loader], gen.get_state()

    (a, state_a), (b, state_b) = batches(False), batches(True)
    assert len(a) == len(b) == 2 * 5
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert torch.equal(state_a, state_b)  # the same number of draws
    if random_targets is not None:  # the targets replaced the labels
        assert not torch.equal(a[0][1], data.train_y[:32])


def test_device_data_trains_the_run_of_the_host_path(tmp_path):
    """run.device_data = "on" (what CUDA runs use): the epoch's draws made up front, batches
    cropped and normalised from them; on the CPU it trains the host path's run bit for bit
    (CIFAR-10 layout: random crop, flip, normalisation; random targets)."""
    from integrity_support import write_cifar10

    write_cifar10(tmp_path / "data", per_batch=40)
    config = RunConfig().replace(**{
        "data.name": "cifar10", "data.data_dir": str(tmp_path / "data"),
        "data.random_targets": True, "model.d": 8, "model.n_blocks": 2, "optim.epochs": 2,
        "optim.batch_size": 32, "diagnostics.eval_samples": 32,
        "diagnostics.end_of_run": False, "run.progress": False, "run.device": "cpu"})
    host = Trainer(config.replace(**{"run.out_dir": str(tmp_path / "a")}))
    device = Trainer(config.replace(**{"run.out_dir": str(tmp_path / "b"),
                                       "run.device_data": "on"}))
    assert host.dataset.augment
    assert device.train_loader.draw_per_epoch and not host.train_loader.draw_per_epoch
    a, b = host.run(), device.run()
    assert comparable(a.record) == comparable(b.record)
    assert b.record.environment["execution"]["device_data"] is True
    assert checkpoint_gap(a.run_dir, b.run_dir) == 0.0


def test_cuda_graphs_resolve_to_off_on_the_cpu_and_say_so(tmp_path):
    result = train(RunConfig().replace(**{**TINY, "run.out_dir": str(tmp_path),
                                          "optim.epochs": 1, "run.device": "cpu"}))
    execution = load_record(result.run_dir).environment["execution"]
    assert execution == {"device_data": False, "cuda_graphs": "off (not a CUDA run)",
                         "stacked_runs": 1}
    off = Trainer(RunConfig().replace(**{**TINY, "run.out_dir": str(tmp_path),
                                         "run.cuda_graphs": "off"}))
    assert off.cuda_graphs.text == "off (run.cuda_graphs = off)"


def test_a_learning_rate_beyond_float32_is_not_captured_and_says_why(monkeypatch):
    """The captured optimiser holds the rate in a float32 tensor: a run with lr 1e300 (one
    meant to diverge) failed on a GPU with "value cannot be converted to type float without
    overflow" where the eager run diverged; it now trains eagerly, saying why. (Both found
    by scripts/gpu_checks.sh on an H200.)"""
    from creditaudit.methods import build_rule
    from creditaudit.models import ResidualMLP
    from creditaudit.run.steps.stepping import cuda_graphs_decision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    rule = build_rule(ResidualMLP(8, 16, 3, 2), MethodConfig(name="bp"), n_classes=3, seed=0)
    cuda = torch.device("cuda")
    assert cuda_graphs_decision("auto", cuda, rule, 1e-3).on
    assert cuda_graphs_decision("auto", cuda, rule, 3e38).on
    decision = cuda_graphs_decision("auto", cuda, rule, 1e300)
    assert not decision.on
    assert decision.text == ("off (learning rate 1e+300 is beyond float32, in which a "
                             "captured step holds it)")
    # The fused kernel reads the rate from a float32 tensor (a float64 one: "expected scalar
    # type Float but found Double"), which rounds lr 1e-3 by 4.7e-8: a captured float64 run
    # left its eager twin by that on a GPU. Float64 runs train eagerly there.
    double = build_rule(ResidualMLP(8, 16, 3, 2).double(), MethodConfig(name="bp"),
                        n_classes=3, seed=0)
    decision = cuda_graphs_decision("auto", cuda, double, 1e-3)
    assert not decision.on
    assert decision.text == ("off (a float64 run: the captured step holds its learning rate "
                             "in float32)")


def test_the_records_doc_describes_the_execution_block_as_written(tmp_path):
    """docs/records.md said `device_data` and `cuda_graphs` both hold "on, or off and why",
    but `device_data` is written as true or false."""
    result = train(RunConfig().replace(**{**TINY, "run.out_dir": str(tmp_path),
                                          "optim.epochs": 1, "run.device": "cpu"}))
    execution = load_record(result.run_dir).environment["execution"]
    assert execution["device_data"] is False and execution["cuda_graphs"].startswith("off (")
    text = (Path(__file__).parents[1] / "docs" / "records.md").read_text()
    assert "`device_data`: true or false" in text
    assert "`cuda_graphs`: on, or off and why" in text


# --- sweeps with --stack -----------------------------------------------------------------------
SWEEP = """
[base.data]
n_train = 256
n_test = 128
in_dim = 6
teacher_width = 16
[base.model]
d = 8
n_blocks = 2
[base.optim]
epochs = 1
batch_size = 64
[base.diagnostics]
eval_samples = 64
end_of_run = false
[base.run]
out_dir = "{out}"
[grid]
"method.name" = ["dfa", "fa-linear"]
"run.seed" = [1, 2, 3]
"""


def test_a_sweep_with_stack_trains_each_shape_as_one_stack(tmp_path, capsys):
    from creditaudit.cli import main

    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP.format(out=tmp_path / "runs"))
    assert main(["sweep", str(path), "--stack", "4", "--dry-run"]) == 0
    assert "stacks: 3 runs in 1 stack of up to 4, 3 runs alone" in capsys.readouterr().out
    assert main(["sweep", str(path), "--stack", "4", "--workers", "0", "-q"]) == 0
    out = capsys.readouterr().out
    assert "6 runs (6 completed)" in out
    records = [load_record(d) for d in sorted((tmp_path / "runs").iterdir()) if d.is_dir()]
    stacked = {r.config.method.name: r.environment["execution"]["stacked_runs"]
               for r in records}
    assert stacked == {"dfa": 3, "fa-linear": 1}
    summary = json.loads((tmp_path / "runs" / "sweep_summary.json").read_text())
    assert {run["action"] for run in summary["runs"]} == {"trained"}
    assert main(["sweep", str(path), "--stack", "4", "--workers", "0", "-q"]) == 0
    assert "6 runs (6 completed)" in capsys.readouterr().out  # nothing trained again


# A stacked sweep SIGKILLed right after the first of its runs wrote its checkpoint of epoch 1.
SWEEP_KILLED_BETWEEN_CHECKPOINTS = """
import os, signal, sys
from creditaudit.cli import main
from creditaudit.run.trainer import Trainer
original = Trainer.checkpoint
def checkpoint(self, epoch):
    original(self, epoch)
    if epoch == 1:
        os.kill(os.getpid(), signal.SIGKILL)
Trainer.checkpoint = checkpoint
main(["sweep", sys.argv[1], "--stack", "2", "--workers", "0", "-q"])
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_sweep_stack_killed_between_its_epoch_1_checkpoints_records_its_threads(tmp_path):
    """Killed (-9) between its runs' checkpoint writes of epoch 1, a stacked sweep resumed
    with the run ahead put back to its initial weights, and so started over; but the sweep
    had chosen its thread count from the epoch-1 checkpoint, before it was put back, as for
    a run going on from a trained epoch: its record read run.threads = None where the
    uninterrupted twin's reads the sweep's count (numbers identical). It now reads the
    sweep's count, as the twin's: the records are equal."""
    from creditaudit.cli import main

    sweeps = {}
    for name in ("straight", "killed"):
        sweeps[name] = tmp_path / f"{name}.toml"
        sweeps[name].write_text(SWEEP.format(out=tmp_path / name).replace(
            '"fa-linear"', "").replace("[1, 2, 3]", "[1, 2]").replace("epochs = 1", "epochs = 2"))
    assert main(["sweep", str(sweeps["straight"]), "--stack", "2", "--workers", "0", "-q"]) == 0
    killed = subprocess.run([sys.executable, "-c", SWEEP_KILLED_BETWEEN_CHECKPOINTS,
                             str(sweeps["killed"])], capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    dirs = sorted(d for d in (tmp_path / "killed").iterdir() if d.is_dir())
    assert [load_checkpoint(d / CHECKPOINT_FILE)["epoch"] for d in dirs] == [1, 0]
    assert main(["sweep", str(sweeps["killed"]), "--stack", "2", "--workers", "0", "-q"]) == 0
    for run_dir in dirs:
        straight, resumed = load_record(tmp_path / "straight" / run_dir.name), load_record(run_dir)
        assert resumed.status == "completed"
        assert resumed.config.run.threads == straight.config.run.threads is not None
        assert comparable(resumed) == comparable(straight)


def test_the_dry_run_and_header_describe_the_stacks_and_workers_of_the_runs_to_train(
        tmp_path, capsys):
    # they grouped every run, finished ones too, while the sweep groups only those left, and
    # counted --workers slots (or one run per slot) whatever the tasks
    from creditaudit.cli import main

    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP.format(out=tmp_path / "runs"))
    first = tmp_path / "first.toml"  # dfa with seed 1: one run of the grid, trained first
    first.write_text(SWEEP.format(out=tmp_path / "runs").replace(
        '"method.name" = ["dfa", "fa-linear"]\n"run.seed" = [1, 2, 3]',
        '"method.name" = ["dfa"]\n"run.seed" = [1]'))
    assert main(["sweep", str(first), "--workers", "0", "-q"]) == 0
    capsys.readouterr()
    assert main(["sweep", str(path), "--stack", "4", "--workers", "8", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "stacks: 2 runs in 1 stack of up to 4, 3 runs alone" in out, out
    assert "executor: local executor, 4 worker processes × 1 thread (5 runs at once)" in out
    assert "6 runs: 1 done or skipped, 5 to run" in out
    assert main(["sweep", str(path), "--stack", "4", "--workers", "0", "-q"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.endswith("(inline executor, 1 parallel task (2 runs at once) × 1 thread; "
                           "2 runs in 1 stack of up to 4, 3 runs alone)"), header
    assert ": 6 runs, 5 to train → " in header, header


def test_the_eta_and_running_count_a_stack_as_one_task():
    from creditaudit.sweep import SweepState

    stacks = [["a", "b", "c", "d"], ["e", "f", "g", "h"]]
    state = SweepState(total=8, slots=2, outstanding=8, tasks=stacks, run_seconds=[10.0])
    assert (state.running, state.eta_seconds) == (8, 10.0)  # two stacks train at once
    for ended in "abcd":
        state.task_ended(ended)
        state.count("completed")
    assert (state.tasks, state.running, state.eta_seconds) == ([list("efgh")], 4, 10.0)


def test_stack_flag_errors_are_one_line(tmp_path, capsys):
    from creditaudit.cli import main

    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP.format(out=tmp_path / "runs"))
    assert main(["sweep", str(path), "--stack", "0", "--dry-run"]) != 0
    assert "--stack must be >= 1" in capsys.readouterr().err
    assert main(["sweep", str(path), "--stack", "2", "--executor", "ray", "--dry-run"]) != 0
    assert "--stack is for the local executor" in capsys.readouterr().err


def test_a_stacked_group_trains_the_runs_it_claims(tmp_path):
    """A run another process holds is reported busy; the group trains the others."""
    from creditaudit.sweep import try_claim
    from creditaudit.sweep.worker import run_group

    runs = configs(tmp_path, "bp", **{"optim.epochs": 1})
    ids = [run_id(c) for c in runs]
    claim, _ = try_claim(tmp_path / ids[1], stale_after=900)
    assert claim is not None
    outcomes = run_group([c.to_dict() for c in runs], run_ids=ids)
    assert [o["status"] for o in outcomes] == ["completed", "busy", "completed"]
    assert [o["action"] for o in outcomes] == ["trained", "busy", "trained"]
    assert load_record(tmp_path / ids[0]).environment["execution"]["stacked_runs"] == 2
    assert not (tmp_path / ids[0] / "claim.json").exists()


def test_a_stack_whose_step_fails_records_every_run_failed(tmp_path, monkeypatch):
    from creditaudit.methods.stacked import StackedStep
    from creditaudit.sweep.worker import run_group

    def boom(self, x, y):
        raise RuntimeError("step exploded")

    monkeypatch.setattr(StackedStep, "forward_backward", boom)
    runs = configs(tmp_path, "dfa", **{"optim.epochs": 1})
    outcomes = run_group([c.to_dict() for c in runs], run_ids=[run_id(c) for c in runs])
    assert {o["status"] for o in outcomes} == {"failed"}
    for config in runs:
        record = load_record(Path(config.run.out_dir) / run_id(config))
        assert record.status == "failed" and "step exploded" in record.error


def test_a_run_that_ended_before_its_stack_failed_keeps_its_own_outcome(tmp_path,
                                                                        monkeypatch):
    """A run that diverged, then the shared step of the others failed: the diverged run's
    outcome said 'failed' with the others' error (the progress line counted it failed, and
    sweep_summary.json gave its entry that error)."""
    from creditaudit.methods.stacked import StackedStep
    from creditaudit.sweep.worker import run_group

    original = StackedStep.forward_backward

    def boom_once_one_left(self, x, y):
        if len(self.members) == 2:  # the diverged run has left the stack
            raise RuntimeError("step exploded")
        return original(self, x, y)

    monkeypatch.setattr(StackedStep, "forward_backward", boom_once_one_left)
    runs = configs(tmp_path, "dfa", **{"optim.epochs": 3})
    runs[1] = runs[1].replace(**{"optim.lr": 1e300})
    outcomes = run_group([c.to_dict() for c in runs], run_ids=[run_id(c) for c in runs])
    assert [o["status"] for o in outcomes] == ["failed", "diverged", "failed"]
    assert outcomes[1]["error"] is None
    assert "step exploded" in outcomes[0]["error"]
    assert load_record(Path(runs[1].run.out_dir) / run_id(runs[1])).status == "diverged"


def test_a_run_whose_loggers_cannot_start_fails_alone_in_its_stack(tmp_path):
    """One run's TensorBoard folder blocked by a file: it failed every run of the stack
    with that run's error (its loggers were built outside the per-run guard), and, failed
    before its first record, it was recorded nowhere (alone it is recorded failed)."""
    from creditaudit.sweep.worker import run_group

    runs = [c.replace(**{"run.tensorboard": str(tmp_path / "tb")})
            for c in configs(tmp_path / "runs", "bp", **{"optim.epochs": 1})]
    ids = [run_id(c) for c in runs]
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / ids[0]).write_text("a file where the run's TensorBoard folder goes")
    outcomes = run_group([c.to_dict() for c in runs], run_ids=ids)
    assert [o["status"] for o in outcomes] == ["failed", "completed", "completed"]
    assert "TensorBoard folder" in outcomes[0]["error"]
    assert outcomes[1]["error"] is None and outcomes[2]["error"] is None
    record = load_record(tmp_path / "runs" / ids[0])
    assert record.status == "failed" and "TensorBoard folder" in record.error


def test_a_full_disk_interrupts_a_stack_as_it_interrupts_a_run_alone(tmp_path, monkeypatch):
    """No space for a checkpoint: every run of the stack is recorded 'interrupted' (as a run
    trained alone is, docs/reliability.md), not 'failed', so the next sweep resumes them
    without --retry-failed."""
    from creditaudit.errors import DiskFullError
    from creditaudit.sweep.worker import run_group

    original = Trainer.checkpoint

    def full(self, epoch):
        if epoch == 1:
            raise DiskFullError(f"cannot write {self.run_dir / CHECKPOINT_FILE}: no space "
                                "left on the device")
        return original(self, epoch)

    runs = configs(tmp_path, "bp", **{"optim.epochs": 2})
    ids = [run_id(c) for c in runs]
    monkeypatch.setattr(Trainer, "checkpoint", full)
    outcomes = run_group([c.to_dict() for c in runs], run_ids=ids)
    assert [o["status"] for o in outcomes] == ["interrupted"] * 3
    assert all("no space left" in o["error"] for o in outcomes)
    assert {load_record(tmp_path / i).status for i in ids} == {"interrupted"}
    monkeypatch.setattr(Trainer, "checkpoint", original)  # space freed: the runs go on
    outcomes = run_group([c.to_dict() for c in runs], run_ids=ids)
    assert [(o["status"], o["action"]) for o in outcomes] == [("completed", "resumed")] * 3


def test_an_interrupt_while_a_stack_starts_leaves_no_run_recorded_running(tmp_path,
                                                                          monkeypatch):
    """Ctrl-C while the stack writes its runs' folders (each run's epoch-0 evaluation,
    seconds at scale): the runs started so far say 'interrupted', not 'running'."""
    original = Trainer.start
    calls = []

    def start(self, resume):
        calls.append(self.run_id)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return original(self, resume)

    runs = configs(tmp_path, "bp", **{"optim.epochs": 1})
    monkeypatch.setattr(Trainer, "start", start)
    with pytest.raises(KeyboardInterrupt):
        train_stacked(runs)
    assert [load_record(tmp_path / run_id(c)).status for c in runs[:2]] == ["interrupted"] * 2


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_stack_killed_between_its_checkpoint_writes_keeps_an_epoch_no_resume_needs(tmp_path):
    """Killed between its runs' checkpoint writes of epoch 2, then the run behind started
    over (``force``): the run ahead is not put back to the epoch of a run that does not
    resume from it (it trained epoch 2 for nothing): it goes on from its epoch 2."""
    out = tmp_path / "b"
    overrides = [{**TINY, "method.name": "dfa", "optim.epochs": 3, "run.out_dir": str(out),
                  **variant} for variant in VARIANTS[:2]]
    killed = subprocess.run([sys.executable, "-c", KILLED_BETWEEN_CHECKPOINTS,
                             json.dumps(overrides)], capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    runs = [RunConfig().replace(**o) for o in overrides]
    ahead, behind = train_stacked(runs, resume=[True, False], force=[False, True])
    assert [ahead.status, behind.status] == ["completed", "completed"]
    assert [p.epoch for p in ahead.record.resumed] == [3]
    assert behind.record.resumed == []


def test_a_stack_interrupted_between_its_checkpoint_writes_trains_the_epoch_again(
        tmp_path, monkeypatch):
    """A Ctrl-C right after the first run's checkpoint of epoch 2 records that epoch in the
    first run's interrupted record (the second's ends at epoch 1); resumed, the stack puts
    the first back to epoch 1 and trains epoch 2 again: both end as the stack left alone."""
    def overrides(out: Path) -> list[dict[str, Any]]:
        return [{**TINY, "method.name": "dfa", "optim.epochs": 3, "run.out_dir": str(out),
                 **variant} for variant in VARIANTS[:2]]

    straight = train_stacked([RunConfig().replace(**o) for o in overrides(tmp_path / "a")])
    runs = [RunConfig().replace(**o) for o in overrides(tmp_path / "b")]
    original = Trainer.checkpoint

    def checkpoint(self, epoch):
        original(self, epoch)
        if epoch == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "checkpoint", checkpoint)
    with pytest.raises(KeyboardInterrupt):
        train_stacked(runs)
    monkeypatch.setattr(Trainer, "checkpoint", original)
    dirs = [tmp_path / "b" / run_id(c) for c in runs]
    assert [[e.epoch for e in load_record(d).log] for d in dirs] == [[0, 1, 2], [0, 1]]
    resumed = train_stacked(runs, resume=True)
    for a, r in zip(straight, resumed, strict=True):
        assert [(p.epoch, p.environment["execution"]["stacked_runs"])
                for p in r.record.resumed] == [(2, 2)]
        assert comparable(a.record) == comparable(r.record)
        assert checkpoint_gap(a.run_dir, r.run_dir) == 0.0
