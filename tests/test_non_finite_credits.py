"""A credit (or reference gradient) that is NaN/Inf makes no cosine, and says so.

A rule can pass the door on its tiny batches and return NaN credits on the evaluation set
(``creditaudit_guests.fx3_rules``: NaN past 32 samples); a user's network can feed a
built-in rule NaN in eval mode. Then:

- *measured*: each such state's ``cos_valid`` is false and ``cos_invalid`` says why
  (``credit_not_finite``, ``gradient_not_finite``), which is not an exactly-zero vector
  (that sample is left out and the cosine stays valid, with ``cos_defined`` < 1);
- *shown*: the run summary marks the deep cosine ``§`` with a footnote naming NaN/Inf,
  never the ``†`` of "exactly zero";
- *named*: the rule's own — a plugin as its guest, with its distribution, in the one-line
  style of creditaudit.guests.blame — in the record (``credit_not_finite``) and in one
  warning line. The run completes (its training and accuracy are its own, as a diverged
  run's numbers are recorded and the command exits 0), and the record stays strict JSON.
"""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from torch import nn

from creditaudit import Recorder, adapt, rule
from creditaudit.config import MethodConfig
from creditaudit.descriptions import (
    BELOW_FLOOR,
    CREDIT_NOT_FINITE,
    GRADIENT_NOT_FINITE,
    EpochMeasures,
)
from creditaudit.errors import RunRecordError
from creditaudit.measures.alignment import layer_cosine_table
from creditaudit.methods import build_rule
from creditaudit.methods.bp import BP
from creditaudit.models import ResidualMLP
from creditaudit.records import RECORD_FILE, RunRecord, load_record
from creditaudit.report import format_run_summary
from creditaudit.report.folder import render_report_markdown
from creditaudit.results import RunIndex
from creditaudit.run.results import epoch_record, rule_named
from door_support import ORIGIN, cli_args, guests, site_with
from plugin_support import cli

pytestmark = pytest.mark.usefixtures("single_thread")

RULE = "fx3-nan-rule"
NAMED = f"credit rule plugin {RULE!r} ({ORIGIN})"
F64 = torch.float64


def test_each_cause_of_an_invalid_cosine_is_named_and_a_zero_vector_is_none():
    """Per layer: a NaN or Inf credit, an Inf gradient, a reference below the floor, each
    named; an exactly-zero credit only leaves its sample out."""
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(6, 4, generator=gen, dtype=F64) * 1e-3
    zero, nan, inf = g.clone(), g.clone(), g.clone()
    zero[0] = 0.0
    nan[1] = math.nan
    inf[2, 0] = math.inf
    bad_g = g.clone()
    bad_g[3, 1] = math.inf
    rows = layer_cosine_table([zero, nan, inf, nan, g], [g, g, g, bad_g, g * 1e-9], 1e-7)
    assert [row["cos_invalid"] for row in rows] == [
        None, CREDIT_NOT_FINITE, CREDIT_NOT_FINITE, GRADIENT_NOT_FINITE, BELOW_FLOOR]
    assert rows[0]["defined"] == pytest.approx(5 / 6) and rows[0]["cos"] == pytest.approx(1.0)
    assert [row["valid_reference"] for row in rows] == [True, True, True, True, False]


def test_nan_credits_on_the_evaluation_set_are_never_a_valid_cosine(tmp_path):
    """The epoch's measures: NaN credits at every state → cos_valid false, for that cause."""
    with guests(tmp_path / "site", RULE):
        torch.manual_seed(0)
        model = ResidualMLP(in_dim=6, d=10, n_classes=4, n_blocks=2).double()
        nan_rule = build_rule(model, MethodConfig(name=RULE), n_classes=4, seed=0)
        gen = torch.Generator().manual_seed(5)
        x = torch.randn(40, 6, generator=gen, dtype=F64)
        y = torch.randint(0, 4, (40,), generator=gen)
        values, _ = epoch_record(nan_rule, x, y)
    states = model.n_blocks + 1
    assert values["cos_valid"] == [False] * states
    assert values["cos_invalid"] == [CREDIT_NOT_FINITE] * states
    assert values["deep_cos_valid"] is False
    assert min(values["bp_grad_norms_per_sample_med"]) >= 1e-7  # not the floor's doing


def test_a_record_from_before_cos_invalid_reads_an_invalid_cosine_as_below_the_floor():
    measures = EpochMeasures(hidden_norms=[1.0, 1.0, 1.0], bp_grad_norms_per_sample_med=[
        1e-3, 1e-9, 1e-9], g_L_zero_fraction=0.0, g_L_nonzero_median=1e-9,
        cos_per_layer=[0.5, 0.1, 0.2], cos_valid=[True, False, False])
    assert measures.deep_cos_invalid == (BELOW_FLOOR,) and measures.deep_cos_valid is False
    measures.cos_valid = None
    assert measures.deep_cos_invalid is None and measures.deep_cos_valid is None


def test_a_rule_is_named_as_its_own():
    torch.manual_seed(0)
    model = ResidualMLP(in_dim=6, d=10, n_classes=4, n_blocks=2)
    assert rule_named(rule("bp", model)) == ("credit rule 'bp'", False)

    class Mine(BP):  # a user's own class, which the registry does not hold
        name, label = "fx3-mine", "Mine"

    mine = Mine(model, MethodConfig(name="bp"), n_classes=4,
                generator=torch.Generator().manual_seed(0))
    what, guest = rule_named(mine)
    assert guest and what.startswith("credit rule ") and "Mine (your own class)" in what


# --- a plugin rule through the command line ----------------------------------------------
@pytest.fixture(scope="module")
def nan_run(tmp_path_factory):
    """``creditaudit train`` of the NaN rule on the door's tiny mixture data: (the finished
    process, the run's folder)."""
    root = tmp_path_factory.mktemp("nan_run")
    site = site_with(root, RULE, "door-mixture")
    out = root / "runs"
    done = cli(site, "train", *cli_args(out, **{"method.name": RULE}), cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = [p.parent for p in out.glob(f"*/{RECORD_FILE}")]
    return done, run_dir


def test_the_record_says_the_credits_were_not_finite_and_whose(nan_run):
    _, run_dir = nan_run
    raw = json.loads((run_dir / RECORD_FILE).read_text())
    assert raw["status"] == "completed"  # trained as backprop: its accuracy is its own
    for entry in raw["log"]:
        assert entry["cos_valid"] == [False, False, False], entry["epoch"]
        assert entry["cos_invalid"] == [CREDIT_NOT_FINITE] * 3
    rows = raw["diagnostics"]["cosine_table"]
    assert [row["cos_invalid"] for row in rows] == [CREDIT_NOT_FINITE] * 3
    assert all(row["valid_reference"] for row in rows)  # the reference itself is fine
    assert raw["credit_not_finite"] == {"epoch": 0, "states": [0, 1, 2], "rule": NAMED,
                                        "guest": True}
    record = load_record(run_dir)
    assert record.deep_cos_valid is False
    assert record.deep_cos_invalid == (CREDIT_NOT_FINITE,)


def test_the_summary_names_nan_not_zero_and_the_plugin(nan_run):
    done, run_dir = nan_run
    row = next(line for line in done.stdout.splitlines() if line.startswith(RULE))
    assert "—§" in row and "†" not in row
    assert "§ not a valid cosine: at some deep state the rule's credits are NaN or Inf" \
        in done.stdout
    assert "exactly zero" not in done.stdout
    named = [line for line in done.stdout.splitlines() if line.startswith(NAMED)]
    assert len(named) == 1 and "returned NaN/Inf credits at states 0, 1, 2" in named[0]
    # the same from the record alone (report, sweep)
    assert named[0] in format_run_summary([load_record(run_dir)])


def test_the_reports_tables_mark_the_deep_cosine_as_the_summary_does(nan_run):
    """report.md's audit and seed-summary tables carry the § of the printed summary, and
    say under the audit table what it means."""
    _, run_dir = nan_run
    markdown = render_report_markdown(RunIndex.from_records([load_record(run_dir)]))
    marked = [line for line in markdown.splitlines()
              if line.startswith("|") and f"| {RULE} |" in line and "| —§ |" in line]
    assert len(marked) == 2, markdown  # the audit table's row and the seed summary's
    assert "§ not a valid cosine: at some deep state the rule's credits are NaN or Inf" \
        in markdown


def test_one_warning_line_names_the_plugin_as_its_own_error(nan_run):
    done, _ = nan_run
    warnings = [line for line in done.stderr.splitlines() if "NaN/Inf credits" in line]
    assert len(warnings) == 1, done.stderr[-3000:]
    assert warnings[0].startswith(f"warning: {NAMED} returned NaN/Inf credits")
    assert warnings[0].endswith("an error in its code, not in creditaudit: fix it or report "
                                "it to its authors")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("pointer,value", [
    ("log/1/cos_invalid", ["credit_not_finite", "zero", None]),
    ("log/1/cos_invalid", [None, None, None]),  # disagrees with cos_valid
    ("diagnostics/cosine_table/1/cos_invalid", "tiny"),
    ("credit_not_finite", {"epoch": "first", "states": [1], "rule": "x", "guest": True}),
])
def test_a_made_up_reason_is_refused_when_read(nan_run, pointer, value):
    _, run_dir = nan_run
    raw = json.loads((run_dir / RECORD_FILE).read_text())
    *parents, last = pointer.split("/")
    node = raw
    for token in parents:
        node = node[int(token)] if isinstance(node, list) else node[token]
    node[int(last) if isinstance(node, list) else last] = value
    with pytest.raises(RunRecordError, match="not written by creditaudit as it is"):
        RunRecord.from_dict(raw, "edited")


# --- a user's network in the own loop ----------------------------------------------------
class NaNWithoutGrad(nn.Module):
    """A network whose forward is NaN in eval mode without gradients on more than 32
    samples (what DFA's credits read), and finite with them (the reference gradient)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.b(torch.tanh(self.a(x))))
        if not torch.is_grad_enabled() and x.shape[0] > 32:
            h = h * math.nan
        return self.head(h)


def test_the_own_loop_names_the_rule_and_points_at_the_network(tmp_path, caplog):
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(64, 8, generator=gen), torch.randint(0, 4, (64,), generator=gen)
    torch.manual_seed(0)
    dfa = rule("dfa", adapt(NaNWithoutGrad(), ["a", "b"], example=x[:4]))
    with caplog.at_level(logging.WARNING), \
            Recorder(dfa, x, y, out=tmp_path, name="own", progress=False,
                     config={"diagnostics.end_of_run": False}) as rec:
        rec.epoch(0)
    record = load_record(tmp_path / "own")
    assert record.status == "completed"
    measures = record.log[0].measures
    assert measures is not None and not any(measures.cos_valid)
    assert set(measures.cos_invalid) == {CREDIT_NOT_FINITE}
    fault = record.credit_not_finite
    assert fault is not None and fault["rule"] == "credit rule 'dfa'" and not fault["guest"]
    lines = [r.getMessage() for r in caplog.records if "NaN/Inf credits" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("warning: credit rule 'dfa' returned")
    assert "check that the network's forward is finite in eval mode" in lines[0]


def test_a_bridge_whose_value_net_overflowed_is_named_with_its_options(tmp_path):
    """bridge_lr=1e30 makes the Credit Bridge's value net NaN within an epoch; its credits ∇V
    are then NaN. The record and the summary name the value net and the options that train
    it, not the network's forward."""
    from creditaudit import RunConfig
    from creditaudit.run.trainer import train

    config = RunConfig().replace(**{
        "method.name": "credit-bridge", "method.warmup_fraction": 1.0,
        "method.bridge_lr": 1e30, "method.bridge_hidden": 16, "data.n_train": 128,
        "data.n_test": 128, "data.in_dim": 16, "model.d": 16, "model.n_blocks": 2,
        "optim.epochs": 2, "diagnostics.end_of_run": False, "diagnostics.eval_samples": 128,
        "run.progress": False, "run.out_dir": str(tmp_path)})
    record = train(config).record
    fault = record.credit_not_finite
    assert fault is not None and not fault["guest"]
    assert "value net V_φ holds NaN/Inf" in fault["part"]
    assert "method.bridge_lr=1e+30" in fault["part"]
    again = load_record(tmp_path / record.run_id / RECORD_FILE)
    assert again.credit_not_finite == fault
    summary = format_run_summary([again])
    assert "value net V_φ holds NaN/Inf" in summary and "network's forward" not in summary


@pytest.mark.parametrize(("name", "key", "option"), [
    ("state-bridge", "predictor", "bridge_lr"),
    ("local-ce", "weights", "classifier_lr_scale")])
def test_each_rule_names_its_own_part_that_went_non_finite(name, key, option):
    from creditaudit.methods.footprint import nonfinite_part

    model = ResidualMLP(in_dim=8, d=8, n_blocks=2, n_classes=4)
    options = {"bridge_hidden": 8} if "bridge" in name else {}
    bound = build_rule(model, MethodConfig(name=name, **options), n_classes=4, seed=0)
    assert nonfinite_part(bound) is None
    with torch.no_grad():
        part = bound.predictor if key == "predictor" else None
        first = next(part.parameters()) if part is not None else bound.weights[0]
        first.view(-1)[0] = math.inf
    text = nonfinite_part(bound)
    assert text is not None and f"method.{option}=" in text
    assert torch.isfinite(torch.stack([p.detach().abs().sum() for p in model.parameters()])
                          ).all()  # the network itself is finite
