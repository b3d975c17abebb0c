"""Labels and messages that say what they are, in the terms of the surface that shows them:
an adapted model's label counts the states it was given (L is not the network's depth);
(d)'s missing baseline is asked for as diagnose()'s argument in Python and as --frozen on
the command line; a backprop run whose (a) fired says what that means on screen."""

from __future__ import annotations

import pytest
import torch

from creditaudit import adapt, diagnose
from creditaudit.audit import audit_run
from creditaudit.cli import main
from creditaudit.config import RunConfig
from creditaudit.report import format_run_summary
from creditaudit.run.trainer import train
from creditaudit.testing.zoo import TransformerClassifier

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = {"data.n_train": 256, "data.n_test": 256, "data.in_dim": 16, "model.d": 16,
        "model.n_blocks": 2, "optim.epochs": 1, "optim.batch_size": 64,
        "diagnostics.eval_samples": 256, "diagnostics.end_of_run": False, "run.progress": False}


@pytest.fixture(scope="module")
def transformer():
    torch.manual_seed(0)
    net = TransformerClassifier(image_shape=(1, 28, 28), patch=(7, 7), d=16, depth=4, heads=2)
    x, y = torch.rand(64, 1, 28, 28), torch.arange(64) % 10
    states = [f"encoder.layers.{i}" for i in range(4)]
    return adapt(net, states, example=x[:4]), x, y


def test_an_adapted_models_label_counts_its_states_not_a_depth(transformer):
    """A depth-4 transformer read at its four blocks has L=3 segments: `L=3` read as its
    depth; the label names the four states."""
    model, _, _ = transformer
    label = model.describe().label
    assert label == "TransformerClassifier d=16, 4 states h_0…h_3"
    assert "L=" not in label and model.describe().n_blocks == 3
    assert model.describe().short_label == "TransformerClassifier"


def test_diagnose_asks_for_its_own_argument(transformer):
    model, x, y = transformer
    report = diagnose(model, x, y, headline_acc=0.5)
    reason = report.diagnostic("d").reason
    assert reason.startswith("no frozen-blocks accuracy given") and "frozen_acc=" in reason
    assert "--frozen" not in reason and "RUN_OR_ACC" not in reason
    assert "frozen_acc=" not in diagnose(model, x, y, headline_acc=0.5,
                                         frozen_acc=0.4).diagnostic("d").reason
    # the report names the network, not the wrapper creditaudit put around it
    assert report.metadata["model"] == model.describe().label


@pytest.fixture(scope="module")
def dfa_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("labels")
    return train(RunConfig().replace(**{**TINY, "method.name": "dfa",
                                        "run.out_dir": str(out)}))


def test_audit_asks_in_python_terms_and_the_command_line_in_its_own(dfa_run, capsys):
    report = audit_run(dfa_run.run_dir, metrics=False, frozen_from_runs=False)
    assert "pass frozen=RUN_OR_ACC" in report.diagnostic("d").reason
    assert main(["audit", str(dfa_run.run_dir), "--no-metrics", "--no-frozen-from-runs",
                 "--format", "json"]) == 0
    out = capsys.readouterr().out
    assert "pass --frozen RUN_OR_ACC" in out and "frozen_acc=" not in out


def test_a_backprop_run_whose_growth_fired_says_what_that_means(tmp_path):
    """(a) fires for BP itself on a ViT's first epoch on Fashion-MNIST (growth 78×); here a
    limit of 1.0001× makes it fire on the tiny task. The summary then says that BP's own
    growth is the yardstick; a DFA run whose (a) fired gets no such line."""
    tight = {**TINY, "run.out_dir": str(tmp_path), "diagnostics.a.growth": 1.0001}
    bp = train(RunConfig().replace(**{**tight, "method.name": "bp"})).record
    dfa = train(RunConfig().replace(**{**tight, "method.name": "dfa"})).record
    assert "a" in bp.protocol.fired and "a" in dfa.protocol.fired
    summary = format_run_summary([bp, dfa])
    notes = [line for line in summary.splitlines() if "fired for backprop itself" in line]
    assert len(notes) == 1 and notes[0].startswith("bp: (a) fired for backprop itself")
    assert "growth" in notes[0] and "temporal" in notes[0]
    assert bp.model.label in notes[0]


def test_settings_that_differ_share_columns_past_a_few():
    from creditaudit.report.tables import MAX_SETTING_COLUMNS, setting_cells, setting_columns

    keys = ["model.args.d", "model.args.depth", "optim.lr"]
    assert setting_columns(keys) == {"model.args": ["model.args.d", "model.args.depth"],
                                     "optim.lr": ["optim.lr"]}
    values = {"model.args.d": "32", "model.args.depth": "2", "optim.lr": "0.001"}
    assert setting_cells(values, keys) == {"model.args": "d=32, depth=2", "optim.lr": "0.001"}
    many = [f"optim.k{i}" for i in range(MAX_SETTING_COLUMNS + 1)]
    assert list(setting_columns(many)) == ["settings"]
    assert setting_cells({"optim.k0": "1"}, many)["settings"].startswith("optim.k0=1, optim.k1=—")


def test_report_tables_of_runs_that_mix_many_settings_stay_narrow(tmp_path):
    """Runs differing in six settings gave six columns (one per key; ~40 for a sweep over an
    outside network's model.args); now one `settings` column says what differs."""
    from creditaudit.report.tables import audit_table, summary_table
    from creditaudit.results import RunIndex

    base = {**TINY, "method.name": "bp", "run.out_dir": str(tmp_path)}
    other = {"optim.lr": 3e-3, "optim.weight_decay": 0.0, "optim.batch_size": 32,
             "data.n_train": 128, "diagnostics.a.growth": 40.0, "diagnostics.every": 2}
    train(RunConfig().replace(**base))
    train(RunConfig().replace(**{**base, **other}))
    index = RunIndex.from_dir(tmp_path)
    audit = audit_table(index, index.runs)
    assert "settings" in audit.columns and "optim.lr" not in audit.columns
    assert len(audit.columns) <= 20
    cells = [row["settings"] for row in audit.rows]
    assert any("optim.lr=0.003" in cell and "data.n_train=128" in cell for cell in cells)
    assert "settings" in summary_table(index, index.runs).columns


def test_the_demo_time_is_one_measured_figure_everywhere():
    """README said "about 2 minutes", --help "~75 s", docs/benchmarks.md 121 s."""
    import re
    from pathlib import Path

    from creditaudit.cli import build_parser
    from creditaudit.cli.demo import MEASURED_SECONDS

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    assert f"It took {MEASURED_SECONDS} s on an idle 2-core machine" in readme
    bench = (root / "docs" / "benchmarks.md").read_text()
    assert re.search(rf"\*\*{MEASURED_SECONDS} s wall\*\*", bench)
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    helps = {c.dest: c.help for c in sub._choices_actions}
    assert f"({MEASURED_SECONDS} s on 2 idle cores)" in helps["demo"]


@pytest.fixture
def outside_network(tmp_path, monkeypatch):
    """An installed distribution ``ux-netpkg`` 1.2 whose module defines a block class, as
    transformers defines BertLayer; the fixture's wrapper class lives in this test module,
    as a user's BertLogits lives in their script."""
    import sys

    from creditaudit.models import packages

    site = tmp_path / "site"
    (site / "ux_netpkg").mkdir(parents=True)
    (site / "ux_netpkg" / "__init__.py").write_text(
        "from torch import nn\n\nclass Block(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.lin = nn.Linear(8, 8)\n\n"
        "    def forward(self, x):\n        return x + self.lin(x)\n")
    info = site / "ux_netpkg-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ux-netpkg\nVersion: 1.2\n")
    (info / "top_level.txt").write_text("ux_netpkg\n")
    monkeypatch.syspath_prepend(str(site))
    packages._distributions.cache_clear()
    import ux_netpkg

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Linear(4, 8)
            self.blocks = torch.nn.Sequential(ux_netpkg.Block(), ux_netpkg.Block())
            self.head = torch.nn.Linear(8, 10)

        def forward(self, x):
            return self.head(self.blocks(self.embed(x)))

    yield Wrapper
    sys.modules.pop("ux_netpkg", None)
    packages._distributions.cache_clear()


def test_a_network_built_from_a_package_is_named_by_that_package(outside_network, tmp_path):
    """`__main__:BertLogits` said nothing of transformers: the label and the record name
    the distribution the network's classes come from."""
    from creditaudit import Recorder, rule

    torch.manual_seed(0)
    x, y = torch.randn(32, 4), torch.arange(32) % 10
    model = adapt(outside_network(), ["embed", "blocks.0", "blocks.1"], example=x[:4])
    assert model.describe().label == "Wrapper (ux-netpkg) d=8, 3 states h_0…h_2"
    assert model.describe().short_label == "Wrapper (ux-netpkg)"
    rec = Recorder(rule("bp", model), x, y, out=tmp_path, name="w", progress=False,
                   config={"diagnostics.end_of_run": False})
    components = rec.record.environment["components"]["model"]
    assert components["module_packages"] == ["ux-netpkg==1.2"]
    assert "Wrapper" in components["module"]  # the class path alone names no package


def test_a_table_whose_d_is_judged_against_its_frozen_runs_says_so(tmp_path):
    """A sweep's table judges (d) against the frozen-blocks runs among its rows, where the
    record of the same run (and `train`'s own table) may say "(d) not evaluated": the table
    said nothing of it. Now a line under it says which (d) it shows."""
    tiny = {**TINY, "run.out_dir": str(tmp_path)}
    frozen = train(RunConfig().replace(**{**tiny, "method.name": "frozen"})).record
    dfa = train(RunConfig().replace(**{**tiny, "method.name": "dfa"})).record
    note = "(d) of 1 run: against the mean final accuracy of the frozen-blocks runs"
    assert note in format_run_summary([frozen, dfa])
    assert note not in format_run_summary([dfa])
    assert note not in format_run_summary([frozen, dfa], use_frozen_runs=False)
