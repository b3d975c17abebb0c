"""The end-of-run block's cost is bounded: memory by chunks sized from the model's measured
footprint, compute by ρ's budget in floating-point operations; chunking changes no value,
the budget only the sample count — the same count on any machine under any load."""

from __future__ import annotations

import inspect
import json
import logging
import math
import re
import time

import pytest
import torch
from torch import Tensor

from creditaudit import records
from creditaudit.config import RunConfig, config_from_dict, load_config, semantic_dict
from creditaudit.errors import ConfigError
from creditaudit.measures import nudging, null, perturbation, progress, quality
from creditaudit.measures.budget import MIN_RHO_SAMPLES, rho_budget, rho_sample_flops
from creditaudit.measures.nudging import nudging_table
from creditaudit.measures.perturbation import BP_CREDIT, jackknife_se, pearson, rho_table
from creditaudit.measures.quality import DEFAULT_RHO_FLOPS, credit_quality, full_credits
from creditaudit.measures.working import WorkingCopy, _saved_bytes, measure_footprint
from creditaudit.methods import DFA, bp_state_gradients
from creditaudit.models import ResidualMLP
from creditaudit.records import comparable
from creditaudit.run.plan import run_id
from creditaudit.run.trainer import train
from creditaudit.testing import TINY_ARCHS, make_rule, tiny_batch, tiny_model

F64 = torch.float64
REAL_PERF_COUNTER = time.perf_counter


def _samples(arch: str, batches: int = 3) -> tuple[Tensor, Tensor]:
    """Several tiny batches as one evaluation set (27 samples)."""
    parts = [tiny_batch(seed=seed, arch=arch) for seed in range(1, batches + 1)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


class FakeClock:
    """A clock that moves ``step`` seconds each time it is read."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        now = self.now
        self.now += self.step
        return now


def _close(a: object, b: object, path: str = "") -> None:
    """Nested lists/dicts of floats equal to float64 rounding (NaN equals NaN)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), path
        for key in a:
            _close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (u, v) in enumerate(zip(a, b)):
            _close(u, v, f"{path}[{i}]")
    elif isinstance(a, float):
        assert isinstance(b, float), path
        assert (math.isnan(a) and math.isnan(b)) or b == pytest.approx(a, rel=1e-9,
                                                                         abs=1e-12), path
    else:
        assert a == b, path


# --- chunking changes no value ------------------------------------------------------------
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_chunking_changes_no_value_of_rho_nudging_or_the_null(arch):
    """A memory cap of one sample per chunk and per perturbed forward (and one of a few
    samples, not dividing the 27) gives every end-of-run value of one unchunked pass."""
    rule = make_rule(DFA, arch=arch)
    rule.model.eval()  # as credit_quality runs it: BatchNorm keeps its statistics
    x, y = _samples(arch)
    options = {"rho_samples": 20, "rho_directions": 3, "null_draws": 3, "rho_flops": None}
    whole = credit_quality(rule, x, y, memory_gb=100.0, **options)
    footprint = measure_footprint(rule.model.forward_states, x, y)
    per_sample = 2 * footprint.graph_bytes + 3 * footprint.state_bytes  # with a backward
    for memory_bytes in (1, 5 * per_sample):
        chunked = credit_quality(rule, x, y, memory_gb=memory_bytes / 1e9, **options)
        for key in ("perturbation_rho", "rho_se", "rho_controls", "nudging",
                    "nudging_controls", "fresh_b_null", "bp_cosine", "gamma"):
            _close(whole[key], chunked[key], key)
        assert chunked["rho_samples"] == 20 and chunked["nudging_samples"] == 27


def test_a_working_copy_in_chunks_gives_the_states_and_gradients_of_one_pass():
    rule = make_rule(DFA, arch="vit")
    x, y = _samples("vit")
    whole = WorkingCopy.of(rule.model, x, y, F64).part(0, 27, bp_over=27)
    chunked = WorkingCopy.of(rule.model, x, y, F64, chunk=4)
    for start, stop in ((0, 27), (3, 9), (7, 8)):  # across chunk borders, inside one
        part = chunked.part(start, stop, bp_over=27)
        for a, b in zip(whole.states + whole.bp + [whole.logits],  # type: ignore[operator]
                        part.states + part.bp + [part.logits]):  # type: ignore[operator]
            assert torch.allclose(a[start:stop], b, rtol=1e-12, atol=1e-15)
    assert len(chunked._chunks) <= 2  # only the chunks the last part needed are kept


@pytest.mark.parametrize(("keep_bytes", "passes"), [(1e9, 7), (0.0, 13)])
def test_chunks_the_memory_can_keep_serve_rho_and_nudging_once(monkeypatch, keep_bytes,
                                                                passes):
    rule = make_rule(DFA, arch="resmlp")
    x, y = _samples("resmlp")
    working = WorkingCopy.of(rule.model, x, y, F64, chunk=4, keep_bytes=keep_bytes)
    credits = full_credits(rule, x, y)
    calls = []
    original = ResidualMLP.forward_states

    def counting(self, inputs):
        if self is working.model and not torch.is_grad_enabled():
            calls.append(inputs.shape[0])
        return original(self, inputs)

    monkeypatch.setattr(ResidualMLP, "forward_states", counting)
    kept = rho_table(rule.model, x, y, credits, n_directions=3, n_samples=27, working=working)
    deltas = nudging_table(rule.model, x, y, [credits, BP_CREDIT], (0.1,), working=working)
    # 7 chunks of the 27 samples: once, or again for nudging but for the first (ρ's one
    # block of 27 samples needed every chunk at once, nudging's first part chunk 0 only).
    # Without a budget no sample is run to count ρ's FLOPs.
    assert len(calls) == passes and calls[0] == working.chunk
    fresh = WorkingCopy.of(rule.model, x, y, F64)
    assert kept["rho"] == pytest.approx(rho_table(rule.model, x, y, credits, n_directions=3,
                                                  n_samples=27, working=fresh)["rho"],
                                        rel=1e-9, abs=1e-12)
    _close(deltas, nudging_table(rule.model, x, y, [credits, BP_CREDIT], (0.1,),
                                 working=fresh))


# --- the memory cap -----------------------------------------------------------------------
def test_footprint_is_the_bytes_autograd_saves_per_sample():
    torch.manual_seed(0)
    model = ResidualMLP(16, 32, 10, 3).double().eval()
    x, y = torch.randn(16, 16, dtype=F64), torch.randint(0, 10, (16,))
    footprint = measure_footprint(model.forward_states, x, y)
    saved = {k: _saved_bytes(model.forward_states, x[:k], y[:k])[0]
             for k in (8, 16)}
    assert saved[16] - saved[8] == 8 * footprint.graph_bytes  # linear in the batch
    assert footprint.state_bytes == 4 * 32 * 8  # h_0 … h_3, 32 float64 each
    wider = ResidualMLP(16, 64, 10, 3).double().eval()
    assert measure_footprint(wider.forward_states, x, y).graph_bytes > \
        1.8 * footprint.graph_bytes


def test_a_small_memory_cap_bounds_every_float64_forward(monkeypatch):
    """With a cap of a few samples' graphs, no float64 pass of ρ or nudging takes more
    samples (forward_states) or rows (forward_from) than the cap holds."""
    rule = make_rule(DFA, arch="resmlp")
    x, y = _samples("resmlp")
    footprint = measure_footprint(rule.model.forward_states, x, y)
    memory_bytes = 4 * (2 * footprint.graph_bytes + 3 * footprint.state_bytes)
    working = WorkingCopy.planned(rule.model, x, y, F64, memory_bytes=memory_bytes)
    assert working.chunk == 4 and working.max_rows == memory_bytes // footprint.graph_bytes
    credits = full_credits(rule, x, y)
    seen: dict[str, list[int]] = {"forward_states": [], "forward_from": []}
    for name in seen:
        original = getattr(ResidualMLP, name)

        def counting(self, *args, _name=name, _original=original):
            if self is working.model:
                seen[_name].append(args[-1].shape[0])
            return _original(self, *args)

        monkeypatch.setattr(ResidualMLP, name, counting)
    rho_table(rule.model, x, y, credits, n_directions=5, n_samples=27, working=working)
    nudging_table(rule.model, x, y, [credits, BP_CREDIT], (0.1,), working=working)
    assert max(seen["forward_states"]) <= working.chunk
    assert max(seen["forward_from"]) <= working.max_rows < 27 * 5  # the rows were sliced


# --- the compute budget and the standard error ---------------------------------------------
@pytest.fixture()
def blocks_of_four(monkeypatch):
    """ρ draws directions for 4 samples at a time (d = 8, M = 5)."""
    monkeypatch.setattr(perturbation, "MAX_ELEMENTS", 4 * 5 * 8)


def _trained_like() -> tuple[ResidualMLP, Tensor, Tensor, list[Tensor]]:
    torch.manual_seed(3)
    model = ResidualMLP(6, 8, 4, 3).double().eval()
    x, y = torch.randn(40, 6, dtype=F64), torch.randint(0, 4, (40,))
    credits = [g + 0.5 * torch.randn_like(g) * g.std() for g in bp_state_gradients(model, x, y)]
    return model, x, y, credits


def _every_clock_jumps(monkeypatch: pytest.MonkeyPatch, step: float) -> None:
    """A machine so loaded that each read of the clock finds ``step`` more seconds gone:
    ``time.perf_counter`` and ``time.monotonic`` jump, and so does every clock the
    end-of-run code took as a default argument when it was imported."""
    clock = FakeClock(step)
    monkeypatch.setattr(time, "perf_counter", clock)
    monkeypatch.setattr(time, "monotonic", clock)
    for module in (perturbation, progress, nudging, null, quality):
        functions = [f for f in vars(module).values() if inspect.isfunction(f)]
        for cls in (c for c in vars(module).values()
                    if isinstance(c, type) and c.__module__ == module.__name__):
            functions += [f for f in vars(cls).values() if inspect.isfunction(f)]
            functions += [f.__func__ for f in vars(cls).values() if isinstance(f, classmethod)]
        for f in functions:
            if f.__defaults__ and REAL_PERF_COUNTER in f.__defaults__:
                monkeypatch.setattr(f, "__defaults__", tuple(
                    clock if d is REAL_PERF_COUNTER else d for d in f.__defaults__))
            if f.__kwdefaults__ and REAL_PERF_COUNTER in f.__kwdefaults__.values():
                monkeypatch.setattr(f, "__kwdefaults__", {
                    k: clock if d is REAL_PERF_COUNTER else d
                    for k, d in f.__kwdefaults__.items()})


def test_one_samples_flops_are_counted_exactly():
    """ResidualMLP: a forward from h_l runs L − l blocks of two d×d matrix products (2 FLOPs
    per multiply-add) and the d×C head; ρ runs 1 + M of them per state."""
    for d, blocks, classes, m in ((8, 3, 4, 5), (16, 2, 10, 32), (256, 4, 10, 32)):
        model = ResidualMLP(6, d, classes, blocks).double().eval()
        x = torch.randn(3, 6, dtype=F64)
        forwards = sum((blocks - l) * 2 * 2 * d * d + 2 * d * classes
                       for l in range(blocks + 1))
        assert rho_sample_flops(model, x, n_directions=m) == (1 + m) * forwards
    # The audit table's model: 1024 samples of 32 directions fit the default budget.
    assert DEFAULT_RHO_FLOPS >= 1024 * 33 * (10 * 4 * 256 ** 2 + 5 * 2 * 256 * 10)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_flop_count_scales_with_the_model_and_ignores_the_clock(monkeypatch, arch):
    """Twice the directions, twice the forwards; a deeper model costs more; the count is
    the same under a clock that jumps, and ViT's attention counts the same whatever
    kernel the device would pick."""
    model = tiny_model(arch=arch).eval()
    x, _ = tiny_batch(arch=arch)
    one = rho_sample_flops(model, x, n_directions=1)
    assert one > 0 and rho_sample_flops(model, x, n_directions=3) == 2 * one
    deepest = len(model.forward_states(x)[0]) - 1
    assert rho_sample_flops(model, x, n_directions=1, layers=[0]) > \
        rho_sample_flops(model, x, n_directions=1, layers=[deepest])
    _every_clock_jumps(monkeypatch, 1000.0)
    assert rho_sample_flops(model, x, n_directions=1) == one


def test_rho_uses_the_samples_its_flop_budget_pays_for(blocks_of_four):
    model, x, y, credits = _trained_like()
    per_sample = rho_sample_flops(model, x, n_directions=5)
    cut = rho_table(model, x, y, credits, n_directions=5, n_samples=40, seed=3,
                    working=WorkingCopy.of(model, x, y, F64),
                    budget_flops=12.9 * per_sample)
    budget = cut["budget"]
    assert cut["samples"] == budget.samples == 12 and budget.reached
    assert (budget.asked, budget.sample_flops) == (40, per_sample)
    # What it reports is ρ, its SE and its controls on the first 12 samples, to the bit:
    # the count is decided before the first forward, so nothing else changes.
    short = rho_table(model, x, y, credits, n_directions=5, n_samples=12, seed=3,
                      working=WorkingCopy.of(model, x, y, F64))
    for key in ("rho", "se", "bp", "random", "measurable"):
        assert cut[key] == short[key], key
    full = rho_table(model, x, y, credits, n_directions=5, n_samples=40, seed=3,
                     working=WorkingCopy.of(model, x, y, F64), budget_flops=40 * per_sample)
    assert full["samples"] == 40 and not full["budget"].reached
    # fewer samples, wider (a property of this draw: seed 3's twelve samples spread more at
    # every layer than its forty)
    assert all(a > b for a, b in zip(cut["se"], full["se"]))


def test_the_same_budget_buys_fewer_samples_of_a_costlier_model():
    x = torch.randn(64, 6, dtype=F64)
    budget = 2e6  # d = 8: 1.1e4 FLOPs per sample, d = 16: 4.0e4, d = 32: 1.5e5
    counts = []
    for d in (8, 16, 32):
        model = ResidualMLP(6, d, 4, 3).double().eval()
        working = WorkingCopy.of(model, x, torch.zeros(64, dtype=torch.long), F64)
        counts.append(rho_budget(working, 64, n_directions=5,
                                 budget_flops=budget).samples)
    assert counts == [64, 50, 13]
    assert counts[0] == 64  # the cheapest model gets every sample it asked for


def test_rho_budget_never_cuts_below_the_minimum_sample_count(blocks_of_four):
    model, x, y, credits = _trained_like()
    table = rho_table(model, x, y, credits, n_directions=5, n_samples=40, budget_flops=0.0,
                      working=WorkingCopy.of(model, x, y, F64))
    assert table["samples"] == MIN_RHO_SAMPLES == 8
    assert all(math.isfinite(v) for v in table["se"])
    few = rho_table(model, x, y, credits, n_directions=5, n_samples=5, budget_flops=0.0,
                    working=WorkingCopy.of(model, x, y, F64))
    assert few["samples"] == 5  # fewer asked for than the minimum: all of them


def test_the_block_is_the_same_however_loaded_the_machine(monkeypatch):
    """Every clock jumping 1000 s per read (a time budget would stop ρ at its minimum and
    cut the float64 pass into one-sample chunks) changes no recorded number, with the
    default budget and with one that cuts ρ."""
    rule = make_rule(DFA, arch="resmlp")
    x, y = _samples("resmlp")
    per_sample = rho_sample_flops(rule.model, x, n_directions=3)
    options = {"rho_samples": 20, "rho_directions": 3, "null_draws": 2}
    idle = [credit_quality(rule, x, y, **options),
            credit_quality(rule, x, y, rho_flops=12.5 * per_sample, **options)]
    assert [out["rho_samples"] for out in idle] == [20, 12]
    _every_clock_jumps(monkeypatch, 1000.0)
    loaded = [credit_quality(rule, x, y, **options),
              credit_quality(rule, x, y, rho_flops=12.5 * per_sample, **options)]
    assert loaded == idle


def test_the_record_says_what_budget_gave_rho_its_samples(monkeypatch):
    rule = make_rule(DFA, arch="resmlp")
    x, y = _samples("resmlp")
    monkeypatch.setattr(perturbation, "MAX_ELEMENTS", 3 * 8)  # one sample per block (M=3)
    per_sample = rho_sample_flops(rule.model, x, n_directions=3)
    lines: list[str] = []
    out = credit_quality(rule, x, y, rho_samples=20, rho_directions=3, null_draws=2,
                         rho_flops=9.5 * per_sample, progress=lines.append)
    assert out["rho_samples"] == out["nudging_samples"] == 9
    assert (out["rho_samples_asked"], out["rho_sample_flops"], out["rho_budget_flops"]) == \
        (20, per_sample, 9.5 * per_sample)
    assert out["rho_samples"] == math.floor(out["rho_budget_flops"] / out["rho_sample_flops"])
    assert any(line.startswith("ρ (perturbation correlation): 9 samples") and
               f"holds 9 of the 20 samples asked for at {per_sample:.3g} FLOPs each" in line
               for line in lines)
    # Nudging averages over ρ's 9 samples.
    credits = full_credits(rule, x, y)
    expected = nudging_table(rule.model, x, y, [credits, BP_CREDIT], (0.01, 0.1),
                             n_samples=9)
    _close(out["nudging"], expected[0])
    _close(out["nudging_controls"]["bp"], expected[1])
    unlimited = credit_quality(rule, x, y, rho_samples=20, rho_directions=3, null_draws=2,
                               rho_flops=None)
    assert unlimited["rho_samples"] == 20 and unlimited["nudging_samples"] == 27
    assert unlimited["rho_samples_asked"] == 20 and unlimited["rho_budget_flops"] is None


def test_a_cut_budget_computes_no_float64_sample_past_rhos(monkeypatch):
    rule = make_rule(DFA, arch="resmlp", dtype=torch.float32)
    x, y = _samples("resmlp")
    x = x.float()
    per_sample = rho_sample_flops(rule.model, x, n_directions=3)
    rows: list[int] = []
    original = ResidualMLP.forward_states

    def counting(self, inputs):
        if inputs.dtype == F64:
            rows.append(inputs.shape[0])
        return original(self, inputs)

    monkeypatch.setattr(ResidualMLP, "forward_states", counting)
    out = credit_quality(rule, x, y, rho_samples=20, rho_directions=3, null_draws=2,
                         rho_flops=10 * per_sample, memory_gb=100.0)
    assert out["rho_samples"] == 10
    assert rows and max(rows) <= 10  # never the 27 samples of one unbounded pass


def test_rho_flops_is_part_of_the_run_id_only_when_changed():
    """The default keeps every existing run id; another budget is another computation."""
    default = RunConfig()
    assert default.diagnostics.rho_flops == DEFAULT_RHO_FLOPS
    assert "rho_flops" not in semantic_dict(default)["diagnostics"]
    same = default.replace(**{"diagnostics.rho_flops": DEFAULT_RHO_FLOPS})
    other = default.replace(**{"diagnostics.rho_flops": 1e9})
    assert semantic_dict(other)["diagnostics"] == {"rho_flops": 1e9}
    ids = [run_id(c) for c in (default, same, other)]
    assert ids[0] == ids[1] != ids[2]


TINY_RUN = {
    "data.n_train": 256, "data.n_test": 128, "data.in_dim": 8, "data.teacher_width": 16,
    "model.d": 16, "model.n_blocks": 2, "optim.epochs": 1, "optim.batch_size": 64,
    "method.name": "dfa", "diagnostics.eval_samples": 64, "diagnostics.rho_samples": 48,
    "diagnostics.rho_directions": 4, "diagnostics.null_draws": 2, "run.progress": False,
}


def test_two_runs_of_one_config_record_the_same_end_of_run_block(tmp_path, monkeypatch):
    """The same config trained twice — the second time on a machine so loaded that every
    clock jumps 1000 s per read — records the same block to the bit, with a budget that
    cuts ρ (a time budget would have cut the second run's ρ to its minimum)."""
    model = ResidualMLP(8, 16, 10, 2)
    per_sample = rho_sample_flops(model, torch.zeros(1, 8), n_directions=4)
    options = {**TINY_RUN, "diagnostics.rho_flops": 20.5 * per_sample}
    first = train(RunConfig().replace(**options, **{"run.out_dir": str(tmp_path / "a")}))
    _every_clock_jumps(monkeypatch, 1000.0)
    second = train(RunConfig().replace(**options, **{"run.out_dir": str(tmp_path / "b")}))
    block = first.record.diagnostics
    assert (block.rho_samples, block.rho_samples_asked, block.rho_sample_flops) == \
        (20, 48, per_sample)
    assert block.nudging_samples == 20 and block.perturbation_rho is not None
    assert comparable(first.record)["diagnostics"] == comparable(second.record)["diagnostics"]


def test_a_config_or_record_with_the_retired_time_budget_still_loads(tmp_path, caplog):
    """diagnostics.rho_seconds (ρ's former time budget) is ignored with a warning in a
    config a user gives — a dict, a TOML file, an override — never an error; a run record
    holding it loads too (records drop, silently, every key their version no longer reads)."""
    plain = RunConfig().replace(**{"diagnostics.rho_samples": 64})
    with caplog.at_level(logging.WARNING, logger="creditaudit.config"):
        assert config_from_dict({"diagnostics": {"rho_seconds": 40.0,
                                                 "rho_samples": 64}}) == plain
        (tmp_path / "old.toml").write_text("[diagnostics]\nrho_seconds = 1e9\n"
                                           "rho_samples = 64\n")
        assert load_config(tmp_path / "old.toml") == plain
        assert plain.replace(**{"diagnostics.rho_seconds": 5.0}) == plain
        record = records.new_record(plain, device="cpu")
        raw = record.to_dict()
        raw["config"]["diagnostics"]["rho_seconds"] = 40.0
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / records.RECORD_FILE).write_text(json.dumps(raw))
        assert records.load_record(tmp_path / "run").config == plain
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3 and all(
        w.startswith("warning: diagnostics.rho_seconds is no longer read and is ignored")
        and "diagnostics.rho_flops" in w and "\n" not in w for w in warnings)
    with pytest.raises(ConfigError, match="unknown key diagnostics.rho_second;"):
        config_from_dict({"diagnostics": {"rho_second": 40.0}})  # a typo is still one


def test_jackknife_se_leaves_out_one_sample_with_all_its_directions():
    generator = torch.Generator().manual_seed(0)
    p = torch.randn(12, 4, generator=generator, dtype=F64)
    t = p + torch.randn(12, 4, generator=generator, dtype=F64)
    left_out = torch.tensor([pearson(torch.cat([p[:i], p[i + 1:]]),
                                     torch.cat([t[:i], t[i + 1:]])) for i in range(12)],
                            dtype=F64)
    by_hand = math.sqrt(11 / 12 * float(((left_out - left_out.mean()) ** 2).sum()))
    assert jackknife_se(p, t) == pytest.approx(by_hand, rel=1e-10)
    assert math.isnan(jackknife_se(p[:1], t[:1]))


def test_jackknife_se_matches_the_spread_of_rho_when_directions_share_a_sample():
    """Each sample shifts all its M pairs together, so pairs are not independent: the SE
    must match the spread of ρ over repeated draws, which the i.i.d.-pairs formula
    (1 − ρ²)/√(nM) misses by far."""
    generator = torch.Generator().manual_seed(1)
    n, m, repeats = 48, 16, 300
    rhos, ses = [], []
    for _ in range(repeats):
        shared = torch.randn(n, 1, generator=generator, dtype=F64) * 2.0
        p = shared + torch.randn(n, m, generator=generator, dtype=F64)
        t = shared * torch.randn(n, 1, generator=generator, dtype=F64) \
            + torch.randn(n, m, generator=generator, dtype=F64)
        rhos.append(pearson(p, t))
        ses.append(jackknife_se(p, t))
    spread = float(torch.tensor(rhos).std())
    mean_se = sum(ses) / repeats
    assert mean_se == pytest.approx(spread, rel=0.25)
    naive = (1 - sum(rhos) ** 2 / repeats ** 2) / math.sqrt(n * m)
    assert naive < 0.5 * spread


def test_the_float64_pass_is_one_chunk_at_the_audit_table_size():
    """At the audit table's size (d=256, L=4, 1280 samples) the 2 GB cap keeps the pass one
    chunk, so the recorded numbers are those of one pass; the plan reads no clock."""
    torch.manual_seed(0)
    model = ResidualMLP(256, 256, 10, 4).eval()
    x, y = torch.randn(1280, 256), torch.randint(0, 10, (1280,))
    working = WorkingCopy.planned(model, x, y, F64, memory_bytes=2e9)
    assert working.chunk == 1280
    assert working.first(1280) is working and working.first(100).chunk == 100


# --- progress -------------------------------------------------------------------------------
def test_each_stage_reports_samples_done_and_an_eta(monkeypatch):
    monkeypatch.setattr(progress, "PROGRESS_SECONDS", 0.0)
    rule = make_rule(DFA, arch="resmlp")
    x, y = _samples("resmlp")
    monkeypatch.setattr(perturbation, "MAX_ELEMENTS", 3 * 8)  # ρ: one sample per block
    footprint = measure_footprint(rule.model.forward_states, x, y)
    memory_gb = 10 * (2 * footprint.graph_bytes + 3 * footprint.state_bytes) / 1e9
    lines: list[str] = []
    credit_quality(rule, x, y, rho_samples=20, rho_directions=3, null_draws=2,
                   rho_flops=None, memory_gb=memory_gb, progress=lines.append)
    pattern = re.compile(r"^(ρ|nudging|fresh-feedback null): (\d+)/(\d+) samples, "
                         r"\d+m\d\ds elapsed, ETA (\d+m\d\ds|\?)$")  # "?" before a sample is done
    done: dict[str, list[int]] = {}
    for line in lines:
        match = pattern.match(line)
        if match:
            assert int(match[3]) == {"ρ": 20}.get(match[1], 27)
            done.setdefault(match[1], []).append(int(match[2]))
    assert set(done) == {"ρ", "nudging", "fresh-feedback null"}
    assert done["ρ"] == list(range(1, 20))  # every block but the last, which ends the stage
    # never backwards; nudging also reports within a chunk, so with no pacing a count repeats
    assert all(b >= a for counts in done.values() for a, b in zip(counts, counts[1:]))
    assert all(counts[-1] > counts[0] for counts in done.values())
    starts = [line.split(":")[0].split(" (")[0] for line in lines if not pattern.match(line)]
    assert starts == ["ρ", "nudging", "fresh-feedback null"]  # the stage lines, unchanged


def test_progress_lines_are_rate_limited():
    lines: list[str] = []
    stage = progress.StageProgress(lines.append, "ρ", 100, clock=FakeClock(0.0))
    stage.update(10, 5.0)  # 5 s in: too soon for a line
    stage.update(20, 12.0)
    stage.update(30, 15.0)  # 3 s after the last line
    stage.update(100, 60.0)  # done: the stage's own end says so
    assert lines == ["ρ: 20/100 samples, 0m12s elapsed, ETA 0m48s"]


@pytest.mark.slow
def test_at_the_audit_table_size_the_defaults_change_no_number():
    """d=256 L=4 ResidualMLP, 1280 evaluation samples, ρ on 1024 × 32: the default budget
    (1024 samples cost 8.9e10 of its 2e11 FLOPs) and memory cap neither cut ρ nor split a
    pass, so every number is that of one pass over every sample with no budget (what the
    block computed before either existed)."""
    torch.manual_seed(0)
    rule = make_rule(DFA)  # for its class; the audit-size model replaces the tiny one
    rule = type(rule)(ResidualMLP(256, 256, 10, 4).eval(), rule.options, n_classes=10,
                      generator=torch.Generator().manual_seed(7))
    x, y = torch.randn(1280, 256), torch.randint(0, 10, (1280,))
    default = credit_quality(rule, x, y, seed=42)
    unbounded = credit_quality(rule, x, y, seed=42, rho_flops=None, memory_gb=1e3)
    assert default["rho_samples"] == 1024 and default["nudging_samples"] == 1280
    assert default["rho_sample_flops"] == 87_352_320
    assert (default["rho_budget_flops"], unbounded["rho_budget_flops"]) == (2e11, None)
    assert {k: v for k, v in default.items() if k != "rho_budget_flops"} == \
        {k: v for k, v in unbounded.items() if k != "rho_budget_flops"}


def test_stages_hand_freed_memory_back_every_few_seconds(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(progress, "_MALLOC_TRIM", lambda pad: calls.append(pad) or 1)
    stage = progress.StageProgress(None, "nudging", 100, clock=FakeClock(0.0))
    for now in (1.0, 4.9, 5.0, 6.0, 10.5):
        stage.update(1, now)
    assert calls == [0, 0]  # at 5.0 and 10.5 s: every TRIM_SECONDS, not every chunk
