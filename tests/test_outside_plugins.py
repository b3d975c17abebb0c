"""Proof from outside: a package with one plugin of each kind — a credit rule (Sparse DFA,
with its own option), an architecture (a plain MLP without LayerNorm), a generated dataset
(a Gaussian mixture) and a fifth protocol diagnostic ((e), softmax saturation) — installed
through entry points (tests/plugin_pkg, tests/plugin_support.py), trains, sweeps, audits,
reports and exports through the command line, and every reader tells the truth about it.
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch

from creditaudit import RunConfig
from creditaudit.config import config_from_dict
from creditaudit.formatting import markdown_text
from creditaudit.protocol import FIRED, PASSED, WALK_BACK
from creditaudit.records import load_record
from creditaudit.registry import ARCHITECTURES, DATASETS, DIAGNOSTICS, RULES, reload_plugins
from plugin_support import (
    DISTRIBUTION,
    MODULE,
    PACKAGE,
    PROJECT,
    ROOT,
    VERSION,
    cli,
    forget_test_plugins,
    install_test_plugins,
    set_version,
)

ORIGIN = f"{DISTRIBUTION}=={VERSION}"
# The run everything below reads: all four plugins, tiny; (e) made to fire by calling any
# sample whose top softmax probability is ≥ 0.1 saturated (with 4 classes: every sample).
CONFIG = {
    "data": {"name": "gaussian-mixture", "n_train": 512, "n_test": 256, "dim": 8},
    "model": {"arch": "plain-mlp", "width": 16, "depth": 2},
    "method": {"name": "sparse-dfa", "connections": 2},
    "optim": {"epochs": 1, "batch_size": 64},
    "diagnostics": {"protocol": ["a", "b", "c", "d", "e"], "eval_samples": 256,
                    "rho_samples": 32, "rho_directions": 2, "null_draws": 2,
                    "e": {"confidence": 0.1}},
}
CONFIG_TOML = """\
[data]
name = "gaussian-mixture"
n_train = 512
n_test = 256
dim = 8
[model]
arch = "plain-mlp"
width = 16
depth = 2
[method]
name = "sparse-dfa"
connections = 2
[optim]
epochs = 1
batch_size = 64
[diagnostics]
protocol = ["a", "b", "c", "d", "e"]
eval_samples = 256
rho_samples = 32
rho_directions = 2
null_draws = 2
[diagnostics.e]
confidence = 0.1
"""
# The sweep varies the rule's own option; (e) keeps its default thresholds (and passes).
GRID_TOML = """\
[base.data]
name = "gaussian-mixture"
n_train = 256
n_test = 256
dim = 8
[base.model]
arch = "plain-mlp"
width = 16
depth = 2
[base.method]
name = "sparse-dfa"
[base.optim]
epochs = 1
batch_size = 64
[base.diagnostics]
protocol = ["a", "b", "c", "d", "e"]
eval_samples = 256
end_of_run = false
[grid]
"method.connections" = [1, 2]
"""


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """The package installed in this process (and uninstalled afterwards); its site."""
    site = install_test_plugins(tmp_path / "site")
    monkeypatch.syspath_prepend(str(site))
    reload_plugins()
    yield site
    monkeypatch.undo()
    forget_test_plugins()
    reload_plugins()


def test_the_test_package_is_never_part_of_the_wheel():
    import setuptools

    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '[tool.setuptools.packages.find]\nwhere = ["src"]' in pyproject
    packages = setuptools.find_packages(where=str(ROOT / "src"))
    assert "creditaudit" in packages
    assert not [p for p in packages if "test_plugins" in p or p.startswith("tests")]


def test_each_plugin_registers_with_its_distribution(installed):
    for registry, name in ((RULES, "sparse-dfa"), (ARCHITECTURES, "plain-mlp"),
                           (DATASETS, "gaussian-mixture"), (DIAGNOSTICS, "e")):
        assert name in registry.names(), registry.broken()
        assert registry.origin(name).text == ORIGIN
    # A plugin diagnostic joins the protocol only when a config lists it.
    from creditaudit.protocol import default_names

    assert default_names() == ["a", "b", "c", "d"]


def test_each_plugin_passes_its_conformance_suite(installed):
    import creditaudit.testing as testing

    testing.check_rule(RULES.get("sparse-dfa"), archs=("resmlp",))
    # The suites of the other three axes, where this version of creditaudit has them.
    for check, registry, name in (("check_model", ARCHITECTURES, "plain-mlp"),
                                  ("check_dataset", DATASETS, "gaussian-mixture"),
                                  ("check_diagnostic", DIAGNOSTICS, "e")):
        if hasattr(testing, check):
            getattr(testing, check)(registry.get(name))


def test_a_rule_derived_from_dfa_gets_a_style_and_rank_of_its_own(installed):
    """Sparse DFA declares no color, marker or rank: it must not be drawn or listed as DFA
    (nor look like any rule that declares its style)."""
    from creditaudit.figures.common import method_color, method_marker
    from creditaudit.results import method_rank

    builtin = [cls for cls in RULES.classes() if RULES.origin(cls.name).builtin]
    assert method_color("sparse-dfa") not in {cls.style("color") for cls in builtin}
    assert method_marker("sparse-dfa") not in {cls.style("marker") for cls in builtin}
    assert method_rank("sparse-dfa") == (100, "sparse-dfa") != method_rank("dfa")
    assert method_color("dfa") == RULES.get("dfa").color  # a declared style is kept


def test_a_version_bump_changes_the_run_id(installed):
    from creditaudit.run.plan import plan_run

    config = config_from_dict(CONFIG)
    first = plan_run(config)
    assert first.code.to_dict()["model"]["origin"] == ORIGIN
    set_version(installed, "0.2.0")
    reload_plugins()
    second = plan_run(config)
    assert second.code.to_dict()["data"]["origin"] == f"{DISTRIBUTION}==0.2.0"
    assert second.run_id != first.run_id
    # Options of the plugins are part of the id as any other option.
    assert plan_run(config.replace(**{"method.connections": 3})).run_id != second.run_id


def test_diagnose_asks_a_plugin_model_whether_it_ends_in_a_layernorm(installed):
    """The plain MLP has no `out_ln` attribute: its declared terminal_ln is the fact."""
    from creditaudit import diagnose
    from creditaudit.models import build_model

    config = config_from_dict(CONFIG)
    torch.manual_seed(0)
    model = build_model(config.model, input_shape=(8,), n_classes=4)
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    report = diagnose(model, x, y)
    assert report.metadata["terminal_ln"] is False


def test_a_protocol_without_some_built_ins_is_judged_and_tabled(installed):
    """diagnostics.protocol may leave built-ins out: diagnose() skips what it does not run,
    and the report's column of a diagnostic a run was not judged by says so."""
    from creditaudit import diagnose
    from creditaudit.models import build_model
    from creditaudit.protocol import Protocol
    from creditaudit.report.tables import diagnostic_cell

    config = config_from_dict(CONFIG)
    torch.manual_seed(0)
    model = build_model(config.model, input_shape=(8,), n_classes=4)
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    report = diagnose(model, x, y, verify_reference=False,
                      protocol=Protocol.of(["a", "e"], {"e": config.diagnostics.e}))
    assert [r.id for r in report.diagnostics] == ["a", "e"]
    assert report.metadata["protocol"]["e"]["confidence"] == 0.1
    assert report.diagnostic("e").status == FIRED and report.verdict == WALK_BACK
    assert diagnostic_cell(report, "b") == "—"


# --- end to end, through the command line ---------------------------------------------------
@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """One run of all four plugins ((e) fires) and a sweep over the rule's option, trained
    in fresh processes that find the plugins through their entry points."""
    root = tmp_path_factory.mktemp("outside")
    site = install_test_plugins(root / "site")
    out = root / "runs"
    (root / "run.toml").write_text(CONFIG_TOML + f'[run]\nout_dir = "{out}"\n')
    trained = cli(site, "train", "--config", "run.toml", "--no-progress", cwd=root)
    assert trained.returncode == 0, trained.stderr
    (root / "grid.toml").write_text(f'[base.run]\nout_dir = "{out}"\n' + GRID_TOML)
    swept = cli(site, "sweep", "grid.toml", "--workers", "0", cwd=root)
    assert swept.returncode == 0, swept.stderr
    return root, site, out


def records_of(out):
    return {path.parent.name: load_record(path) for path in out.glob("*/record.json")}


def the_run(out):
    """The config-file run (connections=2, on 512 training samples)."""
    return next((name, r) for name, r in records_of(out).items() if r.data.n_train == 512)


def test_the_record_tells_the_truth_about_each_plugin(results):
    _, _, out = results
    name, record = the_run(out)
    assert name.startswith("sparse-dfa-plain-mlp-gaussian-mixture-s42-")
    assert record.status == "completed"
    # The architecture: what the built model declared, not a config key.
    assert record.model.arch == "plain-mlp"
    assert record.model.terminal_ln is False and record.model.residual is False
    assert (record.model.d, record.model.n_blocks) == (16, 2)
    # Every plugin option is in the record's config, as given or as its default.
    assert record.config.method.connections == 2
    assert record.config.model.activation == "relu"
    assert record.config.data.separation == 3.0
    assert record.config.diagnostics.protocol == ["a", "b", "c", "d", "e"]
    written = json.loads((out / name / "record.json").read_text())["config"]
    assert written["diagnostics"]["e"] == {"max_share": 0.5, "confidence": 0.1}
    # The data: its identity is the generator's arguments, its shape the one it declares.
    assert record.data.provenance["args"]["dim"] == 8 and record.data.n_classes == 4
    # Each plugin's dist==version, per axis, beside the built-in diagnostics' origin.
    components = record.environment["components"]
    for axis in ("method", "model", "data"):
        assert components[axis]["origin"] == ORIGIN
    origins = {d["name"]: d["origin"] for d in components["diagnostics"]}
    assert origins == {"a": "creditaudit", "b": "creditaudit", "c": "creditaudit",
                       "d": "creditaudit", "e": ORIGIN}


def test_the_fifth_diagnostic_counts_in_the_verdict(results):
    _, _, out = results
    _, fired = the_run(out)
    assert fired.protocol.fired == ["e"] and fired.protocol.verdict == WALK_BACK
    assert fired.log[-1].protocol["e"] == FIRED
    swept = [r for r in records_of(out).values() if r.data.n_train == 256]
    assert sorted(r.config.method.connections for r in swept) == [1, 2]
    assert len({r.run_id for r in swept}) == 2
    for record in swept:  # default thresholds: (e) judged, passed, no walk-back from it
        assert record.log[-1].protocol["e"] == PASSED and "e" not in record.protocol.fired


def test_audit_judges_by_the_protocol_the_run_was_trained_with(results):
    root, site, out = results
    name, record = the_run(out)
    done = cli(site, "audit", str(out / name), "--format", "json", cwd=root)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert list(report["diagnostics"]) == ["a", "b", "c", "d", "e"]
    assert report["diagnostics"]["e"]["status"] == FIRED
    assert report["verdict"] == record.protocol.verdict == WALK_BACK
    assert report["metadata"]["terminal_ln"] is False
    assert report["metadata"]["protocol"]["e"] == {"max_share": 0.5, "confidence": 0.1}
    assert "diagnostics (a)–(e)" in done.stderr


def table_rows(markdown: str, header_start: str) -> tuple[list[str], list[list[str]]]:
    """(columns, rows) of the first Markdown table whose header starts with
    ``header_start``."""
    lines = markdown.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[at:]
             if line.startswith("|")]
    rows = []
    for row in cells[2:]:
        if len(row) != len(cells[0]):
            break
        rows.append(row)
    return cells[0], rows


def test_report_and_export_of_the_folder(results):
    root, site, out = results
    name, _ = the_run(out)
    reported = cli(site, "report", str(out), "--out", str(root / "report"), cwd=root)
    assert reported.returncode == 0, reported.stderr
    text = (root / "report" / "report.md").read_text()
    columns, rows = table_rows(text, "| run |")
    assert "(e)" in columns and len(rows) == 3
    row = dict(zip(columns, next(r for r in rows if r[0] == name)))
    assert row["out_ln"] == "no" and row["arch"] == "Plain MLP d=16 L=2 no out_LN no residual"
    assert row["(e)"].startswith("**fired**")
    assert row["verdict"].startswith("needs walk-back (e)")
    # The reporting template of each run: the terminal-LN cell says no, never yes.
    columns, rows = table_rows(text, "| method | credit |")
    assert rows and all(r[columns.index("terminal LN")] == "no" for r in rows)
    assert f"| (e) | softmax saturation | 1.000 | {markdown_text('> 0.5')} | fired |" in text
    assert (root / "report" / "figures" / "fig6_audit_panels.png").is_file()
    exported = cli(site, "export", str(out), str(root / "exported"), cwd=root)
    assert exported.returncode == 0, exported.stderr
    manifest = json.loads((root / "exported" / "export_manifest.json").read_text())
    assert manifest["written"] == []  # the original study's layout has no slot for them


def test_figures_of_a_folder_of_plugin_runs(results):
    """Only plugin runs (rule, architecture without skips, dataset): the generic figures are
    drawn; each paper figure names the runs it needs and why these are not them — never that
    the folder holds no runs."""
    root, site, out = results
    done = cli(site, "figures", str(out), "--out", str(root / "figures"), cwd=root)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    drawn = {line.split(":")[0] for line in lines if line.startswith("drew ")}
    assert drawn == {"drew Figure 6 — audit panels", "drew Figure 8 — per-run curves"}
    assert (root / "figures" / "fig8_run_curves.png").is_file()
    missing = [line for line in lines if line.startswith("missing ")]
    assert len(missing) == 6 and "holds no completed" not in done.stdout
    control = ("— the 3 completed or diverged runs here are all control variants (depth "
               "ladder, random labels or no residual stream), which it does not compare")
    for figure, needs in (("Figure 1 — audit hero", "BP runs"), ("Figure 3 — penalty rescue",
                          "frozen-blocks runs"), ("Figure 5 — multi-seed summary set",
                                                  "State Bridge runs")):
        line = next(m for m in missing if m.startswith(f"missing {figure}: needs "))
        assert needs in line and line.endswith(control), line
    temporal = next(m for m in missing if "Figure 2" in m)
    assert "BP, FA and DFA runs (λ = 0) of one architecture — ResMLP: no runs" in temporal
    alignment = next(m for m in missing if "Figure 7" in m)
    assert "(closest recipe: gaussian-mixture, Plain MLP d=16 L=2" in alignment


def test_readers_without_the_plugins_still_show_the_fifth_diagnostic(results):
    """This process has none of the plugins installed: records are read as written."""
    from creditaudit.figures import RunIndex, audit_panels
    from creditaudit.report.folder import render_report_markdown

    _, _, out = results
    assert RULES.find("sparse-dfa") is None and DIAGNOSTICS.find("e") is None
    index = RunIndex.from_dir(out)
    assert index.diagnostic_ids() == ["a", "b", "c", "d", "e"]
    text = render_report_markdown(index)
    columns, rows = table_rows(text, "| run |")
    assert "(e)" in columns and {r[columns.index("out_ln")] for r in rows} == {"no"}
    figure = audit_panels.build(index)[audit_panels.NAME]
    titles = [ax.get_title() for ax in figure.axes]
    assert titles[-1] == "(e) softmax saturation" and len(titles) == 5


@pytest.mark.slow
def test_a_version_bump_trains_again_instead_of_serving_the_old_record(results, tmp_path):
    root, _, out = results
    name, old = the_run(out)
    site = install_test_plugins(tmp_path / "site")
    set_version(site, "0.2.0")
    done = cli(site, "train", "--config", str(root / "run.toml"), "--no-progress", cwd=root)
    assert done.returncode == 0, done.stderr
    assert "not rerun" not in done.stderr
    new = [r for n, r in records_of(out).items() if n != name and r.data.n_train == 512]
    assert len(new) == 1 and new[0].status == "completed" and new[0].log
    assert new[0].environment["components"]["method"]["origin"] == f"{DISTRIBUTION}==0.2.0"
    assert load_record(out / name).environment["components"]["method"]["origin"] == ORIGIN
    assert old.updated == load_record(out / name).updated  # the old record is untouched
    shutil.rmtree(out / new[0].run_id)  # the other tests count the runs


def test_the_run_config_reads_back_without_the_plugins(results):
    """A record's config holds the plugin sections as written when they are not installed."""
    _, _, out = results
    _, record = the_run(out)
    assert "creditaudit_test_plugins" not in sys.modules
    assert isinstance(record.config, RunConfig)
    assert record.config.model.arch == "plain-mlp"
    assert record.config.to_dict()["model"]["width"] == 16


def test_extending_md_shows_the_package_as_it_is():
    """docs/extending.md shows this package's architecture, dataset and diagnostic — each
    module from its imports down, verbatim — and their entry points."""
    from docs_support import doc_blocks

    blocks = doc_blocks([ROOT / "docs" / "extending.md"])
    shown = [b.text.strip() for b in blocks if b.lang == "python"]
    for module in ("models", "datasets", "diagnostics"):
        source = (PACKAGE / MODULE / f"{module}.py").read_text()
        code = source.split('"""', 2)[2].strip()  # after the module docstring
        assert code in shown, f"docs/extending.md does not show {module}.py as it is"
    toml = "\n".join(b.text for b in blocks if b.lang == "toml")
    for group, entries in PROJECT["entry-points"].items():
        for name, target in entries.items():
            if group != "creditaudit.rules":  # the page's rule is NoisyBP
                assert f'[project.entry-points."{group}"]\n{name} = "{target}"' in toml
