"""The end-of-run block's cost is bounded: memory by chunks sized from the model's measured
footprint, time by ρ's budget; chunking changes no value, the budget only the sample count."""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch import Tensor

from creditaudit.diagnostics import perturbation
from creditaudit.diagnostics.nudging import nudging_table
from creditaudit.diagnostics.perturbation import (
    BP_CREDIT,
    MIN_RHO_SAMPLES,
    WorkingCopy,
    jackknife_se,
    measure_footprint,
    pearson,
    rho_table,
)
from creditaudit.diagnostics.quality import DEFAULT_RHO_SECONDS, credit_quality, full_credits
from creditaudit.methods import DFA, bp_state_gradients
from creditaudit.models import ResidualMLP
from creditaudit.testing import TINY_ARCHS, make_rule, tiny_batch

F64 = torch.float64


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
    options = {"rho_samples": 20, "rho_directions": 3, "null_draws": 3, "rho_seconds": None}
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
    assert len(calls) == passes
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
    saved = {k: perturbation._saved_bytes(model.forward_states, x[:k], y[:k])[0]
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


# --- the time budget and the standard error -----------------------------------------------
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


def test_rho_stops_after_the_block_that_spends_its_budget(blocks_of_four):
    model, x, y, credits = _trained_like()
    lines: list[str] = []
    working = WorkingCopy.of(model, x, y, F64)
    # The clock moves 1 s per block: the budget of 3 s is spent by the third block.
    cut = rho_table(model, x, y, credits, n_directions=5, n_samples=40, seed=2,
                    working=working, budget_s=3.0, clock=FakeClock(1.0), progress=lines.append)
    assert cut["samples"] == 12 and cut["budget_reached"]
    assert lines[-1].startswith("ρ: the 3 s time budget is spent after 12 of 40 samples")
    # What it reports is ρ, its SE and its controls on the first 12 samples.
    short = rho_table(model, x, y, credits, n_directions=5, n_samples=12, seed=2,
                      working=WorkingCopy.of(model, x, y, F64))
    for key in ("rho", "se", "bp", "random"):
        assert cut[key] == pytest.approx(short[key], rel=1e-9, abs=1e-12), key
    full = rho_table(model, x, y, credits, n_directions=5, n_samples=40, seed=2,
                     working=WorkingCopy.of(model, x, y, F64))
    assert full["samples"] == 40 and not full["budget_reached"]
    assert all(a > b for a, b in zip(cut["se"], full["se"]))  # fewer samples, wider


def test_rho_budget_never_cuts_below_the_minimum_sample_count(blocks_of_four):
    model, x, y, credits = _trained_like()
    table = rho_table(model, x, y, credits, n_directions=5, n_samples=40, budget_s=0.0,
                      working=WorkingCopy.of(model, x, y, F64), clock=FakeClock(100.0))
    assert table["samples"] == MIN_RHO_SAMPLES == 8
    assert all(math.isfinite(v) for v in table["se"])


def test_when_the_budget_cuts_rho_nudging_averages_over_rhos_samples(monkeypatch):
    rule = make_rule(DFA, arch="resmlp")
    x, y = _samples("resmlp")
    monkeypatch.setattr(perturbation, "MAX_ELEMENTS", 3 * 8)  # one sample per block (M=3)
    out = credit_quality(rule, x, y, rho_samples=20, rho_directions=3, null_draws=2,
                         rho_seconds=0.0)
    assert out["rho_samples"] == out["nudging_samples"] == MIN_RHO_SAMPLES
    credits = full_credits(rule, x, y)
    expected = nudging_table(rule.model, x, y, [credits, BP_CREDIT], (0.01, 0.1),
                             n_samples=MIN_RHO_SAMPLES)
    _close(out["nudging"], expected[0])
    _close(out["nudging_controls"]["bp"], expected[1])
    unlimited = credit_quality(rule, x, y, rho_samples=20, rho_directions=3, null_draws=2,
                               rho_seconds=None)
    assert unlimited["rho_samples"] == 20 and unlimited["nudging_samples"] == 27


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


def test_the_float64_pass_is_one_chunk_where_it_is_cheap_and_split_where_it_is_not():
    """At the audit table's size (d=256, L=4, 1280 samples) the pass stays one chunk, so
    the recorded numbers are those of one pass; a pass that would spend more than half of
    ρ's budget is split into chunks of at most 5% of it."""
    torch.manual_seed(0)
    model = ResidualMLP(256, 256, 10, 4).eval()
    x, y = torch.randn(1280, 256), torch.randint(0, 10, (1280,))
    budget = DEFAULT_RHO_SECONDS
    working = WorkingCopy.planned(model, x, y, F64, memory_bytes=2e9, budget_s=budget)
    assert working.chunk == 1280
    slow = WorkingCopy.planned(model, x, y, F64, memory_bytes=2e9, budget_s=budget,
                               clock=FakeClock(0.5))  # every probe pass "takes" 0.5 s
    assert slow.chunk == int(0.05 * budget / (0.5 / 4))


# --- progress -------------------------------------------------------------------------------
def test_each_stage_reports_samples_done_and_an_eta(monkeypatch):
    monkeypatch.setattr(perturbation, "PROGRESS_SECONDS", 0.0)
    rule = make_rule(DFA, arch="resmlp")
    x, y = _samples("resmlp")
    monkeypatch.setattr(perturbation, "MAX_ELEMENTS", 3 * 8)  # ρ: one sample per block
    footprint = measure_footprint(rule.model.forward_states, x, y)
    memory_gb = 10 * (2 * footprint.graph_bytes + 3 * footprint.state_bytes) / 1e9
    lines: list[str] = []
    credit_quality(rule, x, y, rho_samples=20, rho_directions=3, null_draws=2,
                   rho_seconds=None, memory_gb=memory_gb, progress=lines.append)
    pattern = re.compile(r"^(ρ|nudging|fresh-feedback null): (\d+)/(\d+) samples, "
                         r"\d+m\d\ds elapsed, ETA \d+m\d\ds$")
    done: dict[str, list[int]] = {}
    for line in lines:
        match = pattern.match(line)
        if match:
            assert int(match[3]) == {"ρ": 20}.get(match[1], 27)
            done.setdefault(match[1], []).append(int(match[2]))
    assert set(done) == {"ρ", "nudging", "fresh-feedback null"}
    assert done["ρ"] == list(range(1, 20))  # every block but the last, which ends the stage
    assert all(b > a for counts in done.values() for a, b in zip(counts, counts[1:]))
    starts = [line.split(":")[0].split(" (")[0] for line in lines if not pattern.match(line)]
    assert starts == ["ρ", "nudging", "fresh-feedback null"]  # the stage lines, unchanged


def test_progress_lines_are_rate_limited():
    lines: list[str] = []
    progress = perturbation.StageProgress(lines.append, "ρ", 100, limit_s=30.0,
                                          clock=FakeClock(0.0))
    progress.update(10, 5.0)  # 5 s in: too soon for a line
    progress.update(20, 12.0)
    progress.update(30, 15.0)  # 3 s after the last line
    progress.update(100, 60.0)  # done: the stage's own end says so
    assert lines == ["ρ: 20/100 samples, 0m12s elapsed, ETA 0m18s"]  # 48 s left, budget 18


@pytest.mark.slow
def test_at_the_audit_table_size_the_defaults_change_no_number():
    """d=256 L=4 ResidualMLP, 1280 evaluation samples, ρ on 1024 × 32: the default budget
    and memory cap neither cut ρ nor split a pass, so every number is that of one pass
    over every sample with no budget (what the block computed before either existed)."""
    torch.manual_seed(0)
    rule = make_rule(DFA)  # for its class; the audit-size model replaces the tiny one
    rule = type(rule)(ResidualMLP(256, 256, 10, 4).eval(), rule.config, n_classes=10,
                      generator=torch.Generator().manual_seed(7))
    x, y = torch.randn(1280, 256), torch.randint(0, 10, (1280,))
    default = credit_quality(rule, x, y, seed=42)
    unbounded = credit_quality(rule, x, y, seed=42, rho_seconds=None, memory_gb=1e3)
    assert default["rho_samples"] == 1024 and default["nudging_samples"] == 1280
    assert default == unbounded


def test_stages_hand_freed_memory_back_every_few_seconds(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(perturbation, "_MALLOC_TRIM", lambda pad: calls.append(pad) or 1)
    progress = perturbation.StageProgress(None, "nudging", 100, clock=FakeClock(0.0))
    for now in (1.0, 4.9, 5.0, 6.0, 10.5):
        progress.update(1, now)
    assert calls == [0, 0]  # at 5.0 and 10.5 s: every TRIM_SECONDS, not every chunk
