"""Hostile records never take a folder command down, and out-of-domain values are refused.

A results folder holds good runs beside one ``record.json`` of each hostile kind: 200 000
nested ``[`` (RecursionError in the parser), a symlink to /dev/zero (an endless read), a named
pipe (opening it blocks), a file over the size limit, a folder, and records whose accuracy
or cosine is 5. Every folder command runs as a real ``creditaudit`` process under a timeout,
so a hang fails the test instead of stalling the suite, and under a memory cap, so an endless
read fails fast instead of filling the machine. Each command must succeed for the good runs
and name every bad record in exactly one line.
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from creditaudit.config import RunConfig
from creditaudit.descriptions.fields import ACCURACY, COSINE, FRACTION, NONNEGATIVE
from creditaudit.errors import ConfigError, RunRecordError
from creditaudit.files.safe_files import MAX_TEXT_BYTES, read_text
from creditaudit.files.strict_json import MAX_DEPTH, TooDeep, check_depth, nesting_depth
from creditaudit.records import RECORD_FILE, EpochEntry, EpochMeasures, load_record
from creditaudit.records.run_parts import EndOfRun, FinalResults
from creditaudit.run.plan import run_id
from integrity_support import as_written, sweep_toml, tiny_config, write_idx_dataset

TIMEOUT_S = 240  # a command here takes seconds; a blocked one is killed and fails the test
MEMORY_CAP = 4 << 30  # heap of a command: an endless read ends in MemoryError, not swapping


def _sparse(path: Path, size: int) -> None:
    """A file of ``size`` zero bytes that takes no disk space."""
    with path.open("wb") as handle:
        handle.truncate(size)


def _modified(good: dict, edit: Callable[[dict], None]) -> str:
    record = json.loads(json.dumps(good))
    edit(record)
    return as_written(record)


def _set(pointer: str, value: object) -> Callable[[dict], None]:
    """An edit setting the value at ``pointer`` (``final/test_acc``, ``log/1/cos_per_layer/0``)
    of a record dict."""
    *parents, last = pointer.split("/")

    def edit(record: dict) -> None:
        node = record
        for token in parents:
            node = node[int(token)] if isinstance(node, list) else node[token]
        node[int(last) if isinstance(node, list) else last] = value

    return edit


HOSTILE: dict[str, Callable[[Path, dict], None]] = {
    "deep-nesting": lambda path, good: path.write_text("[" * 200_000),
    "symlink-to-dev-zero": lambda path, good: path.symlink_to("/dev/zero"),
    "named-pipe": lambda path, good: os.mkfifo(path),
    "oversized": lambda path, good: _sparse(path, MAX_TEXT_BYTES + 1),
    "folder": lambda path, good: path.mkdir(),
    "accuracy-5": lambda path, good: path.write_text(_modified(good,
                                                               _set("final/test_acc", 5.0))),
    "cosine-5": lambda path, good: path.write_text(_modified(good,
                                                             _set("diagnostics/deep_cos", 5.0))),
}


def plant_hostile(path: Path, kind: str, good: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    HOSTILE[kind](path, good)
    return path


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_CAP, MEMORY_CAP))


def cli(*argv: object) -> subprocess.CompletedProcess:
    """``creditaudit ARGV`` in a fresh process (PYTHONPATH and the test cache inherited)."""
    command = [sys.executable, "-m", "creditaudit", *map(str, argv)]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S,
                              preexec_fn=_cap_memory, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`creditaudit {' '.join(map(str, argv))}` hung (> {TIMEOUT_S} s)")


BATCH = """
import contextlib, io, json, sys
from creditaudit.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    results.append([code, err.getvalue()])
print(json.dumps(results))
"""


def cli_batch(argvs: list[list[object]]) -> list[tuple[int, str]]:
    """(exit code, stderr) of ``creditaudit ARGV`` for each of ``argvs``, run one after
    another in one fresh process (one start-up instead of many)."""
    argvs_text = json.dumps([[str(a) for a in argv] for argv in argvs])
    try:
        done = subprocess.run([sys.executable, "-c", BATCH, argvs_text], capture_output=True,
                              text=True, timeout=TIMEOUT_S, preexec_fn=_cap_memory, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"one of {argvs_text} hung (> {TIMEOUT_S} s)")
    assert done.returncode == 0, done.stderr
    return [tuple(result) for result in json.loads(done.stdout.splitlines()[-1])]


def assert_each_named_once(stderr: str, bad: list[Path], prefix: str) -> None:
    """Every bad path is in exactly one stderr line, which starts with ``prefix``; no
    traceback and no internal error."""
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    lines = stderr.splitlines()
    for path in bad:
        naming = [line for line in lines if f"{path} " in line or f"{path}:" in line]
        assert len(naming) == 1, (path, naming, stderr)
        assert naming[0].startswith(prefix), naming[0]


@pytest.fixture(scope="module")
def world(tmp_path_factory, single_thread) -> SimpleNamespace:
    """A finished DFA run and its frozen-blocks baseline, beside one record of each hostile
    kind (``bad``: kind → path), in one results folder."""
    from creditaudit.run.trainer import train

    root = tmp_path_factory.mktemp("hostile")
    data = write_idx_dataset(root / "mnist")
    results = root / "results"
    runs = {method: train(RunConfig().replace(**tiny_config(data, results,
                                                            **{"method.name": method})))
            for method in ("dfa", "frozen")}
    assert all(run.status == "completed" for run in runs.values())
    good = json.loads((runs["dfa"].run_dir / RECORD_FILE).read_text())
    bad = {kind: plant_hostile(results / f"hostile-{kind}" / RECORD_FILE, kind, good)
           for kind in HOSTILE}
    return SimpleNamespace(root=root, data=data, results=results, runs=runs, good=good,
                           bad=bad)


@pytest.fixture(autouse=True)
def _exempt_planted(world, plant):
    """The planted records are bad on purpose: left out of the session's strict-JSON check."""
    plant.register(*(p for p in world.bad.values() if p.is_file()))


# --- folder commands -----------------------------------------------------------------------
def test_report_skips_every_hostile_record(world):
    done = cli("report", world.results)
    assert done.returncode == 0, done.stderr
    assert_each_named_once(done.stderr, list(world.bad.values()), "warning: ")
    text = (world.results / "report" / "report.md").read_text()
    assert all(run.run_dir.name in text for run in world.runs.values())


def test_figures_skip_every_hostile_record(world, tmp_path):
    done = cli("figures", world.results, "--out", tmp_path / "figures")
    assert done.returncode == 0, done.stderr
    assert_each_named_once(done.stderr, list(world.bad.values()), "warning: ")
    assert "2 run records" in done.stdout and list((tmp_path / "figures").glob("*.png"))


def test_audit_finds_its_frozen_baseline_among_hostile_records(world):
    done = cli("audit", world.runs["dfa"].run_dir, "-q", "--no-metrics")
    assert done.returncode == 0, done.stderr
    assert_each_named_once(done.stderr, list(world.bad.values()), "warning: ")
    assert "vs frozen blocks" in done.stdout  # (d) against the run found beside it


def test_export_skips_every_hostile_record(world, tmp_path):
    done = cli("export", world.results, tmp_path / "export")
    assert done.returncode == 0, done.stderr
    assert_each_named_once(done.stderr, list(world.bad.values()), "warning: ")
    manifest = json.loads((tmp_path / "export" / "export_manifest.json").read_text())
    assert len(manifest["unreadable"]) == len(world.bad)


def test_sweep_starts_its_hostile_runs_over(world, tmp_path):
    """The sweep's own runs hold the hostile records: each is named in one warning and
    trained again, except the folder named record.json, which nothing can replace: that run
    fails with one line and the sweep goes on (exit 1: a run of the grid failed)."""
    out = tmp_path / "sweep"
    base = tiny_config(world.data, out)
    kinds = list(HOSTILE)
    sweep = tmp_path / "s.toml"
    sweep.write_text(sweep_toml(base, f'[grid]\n"run.seed" = {list(range(len(kinds)))}\n'))
    folders = [out / run_id(RunConfig().replace(**base, **{"run.seed": seed}))
               for seed in range(len(kinds))]
    bad = [plant_hostile(folder / RECORD_FILE, kind, world.good)
           for folder, kind in zip(folders, kinds)]
    done = cli("sweep", sweep, "--workers", "0", "-q")
    assert done.returncode == 1, done.stderr
    assert_each_named_once(done.stderr, bad, "warning: starting ")
    for folder, kind in zip(folders, kinds):
        if kind == "folder":
            assert f"{folder.name}: " in done.stdout and (folder / RECORD_FILE).is_dir()
        else:
            assert load_record(folder).status == "completed", kind


def test_experiment_lists_a_hostile_run_as_missing(world, tmp_path, plant):
    from creditaudit.study.experiments import get_experiment

    configs = get_experiment("fresh_null").configs("smoke", out_dir=tmp_path)
    bad = [plant_hostile(tmp_path / run_id(config) / RECORD_FILE, kind, world.good)
           for config, kind in zip(configs, HOSTILE)]
    plant.register(*(path for path in bad if path.is_file()))
    done = cli("experiment", "fresh_null", "--scale", "smoke", "--no-train", "--out", tmp_path)
    assert done.returncode == 1, done.stderr  # runs are missing
    assert_each_named_once(done.stderr, bad, "missing: ")


def test_a_hostile_config_or_sweep_file_is_one_line(world, tmp_path):
    files = {kind: plant_hostile(tmp_path / kind / "file.toml", kind, world.good)
             for kind in ("named-pipe", "symlink-to-dev-zero", "oversized")}
    files["deep-toml"] = tmp_path / "deep.toml"
    files["deep-toml"].write_text("x = " + "[" * 100_000)  # tomllib recurses per level
    said = {"named-pipe": "named pipe", "symlink-to-dev-zero": "is a device",
            "oversized": f"over the {MAX_TEXT_BYTES >> 20} MiB", "deep-toml": "too deeply"}
    argvs = [argv for path in files.values()
             for argv in (["train", "--config", path], ["sweep", path])]
    for argv, (code, stderr) in zip(argvs, cli_batch(argvs)):
        kind = next(k for k, path in files.items() if path == argv[-1])
        lines = stderr.strip().splitlines()
        assert code == 2 and len(lines) == 1, (argv, stderr)
        what = "sweep file" if argv[0] == "sweep" else "config file"
        assert lines[0].startswith(f"creditaudit: error: {what} "), lines[0]
        assert str(argv[-1]) in lines[0] and said[kind] in lines[0], lines[0]


# --- reading: bounded, non-blocking, depth-limited -------------------------------------------
def test_the_read_is_bounded_even_where_the_size_lies(monkeypatch):
    """/proc files say they hold 0 bytes: only the bounded read stops a long one."""
    assert os.stat("/proc/self/status").st_size == 0
    monkeypatch.setattr("creditaudit.files.safe_files.MAX_TEXT_BYTES", 64)
    with pytest.raises(ConfigError, match="over the"):
        read_text(Path("/proc/self/status"), "config file", ConfigError)


def test_nesting_is_measured_outside_strings_and_refused_before_parsing(world, tmp_path):
    assert nesting_depth('["[[[", {"k]}": ["\\"[", [1]]}]') == 4
    assert nesting_depth('"[[" , "\\\\"') == 0
    started = time.perf_counter()
    with pytest.raises(TooDeep, match="200000 levels"):
        check_depth("[" * 200_000)
    assert time.perf_counter() - started < 5
    check_depth("[" * MAX_DEPTH + "]" * MAX_DEPTH)  # exactly at the limit: read
    with pytest.raises(TooDeep):
        check_depth("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    deep = tmp_path / RECORD_FILE
    nested = json.loads("[" * (MAX_DEPTH + 6) + "]" * (MAX_DEPTH + 6))
    deep.write_text(_modified(world.good, _set("environment/nested", nested)))
    with pytest.raises(RunRecordError, match="levels deep"):
        load_record(deep)


# --- domains --------------------------------------------------------------------------------
OUT_OF_DOMAIN = [
    ("final/test_acc", 5.0, "final.test_acc = 5.0"),
    ("log/1/acc_eval", 1.5, "log[1].acc_eval = 1.5"),
    ("log/1/train_acc", -0.25, "log[1].train_acc = -0.25"),
    ("log/1/cos_per_layer/1", -1.5, "log[1].cos_per_layer[1] = -1.5"),
    ("diagnostics/deep_cos", 5.0, "diagnostics.deep_cos = 5.0"),
    ("diagnostics/bp_cosine/0", 1.01, "diagnostics.bp_cosine[0] = 1.01"),
    ("diagnostics/gamma/pooled", -3.0, "diagnostics.gamma.pooled = -3.0"),
    ("diagnostics/cosine_table/1/defined", 1.5, "diagnostics.cosine_table[1].defined = 1.5"),
    ("log/1/cos_defined/0", -0.5, "log[1].cos_defined[0] = -0.5"),
    ("log/1/g_L_zero_fraction", 2.0, "log[1].g_L_zero_fraction = 2.0"),
    ("log/1/hidden_norms/0", -1.0, "log[1].hidden_norms[0] = -1.0"),
    ("log/1/bp_grad_norms_per_sample_med/2", -0.001,
     "log[1].bp_grad_norms_per_sample_med[2] = -0.001"),
    ("final/g_L_norm", -1e-5, "final.g_L_norm = -1e-05"),
    ("log/1/cos_per_layer/0", "0.5", "log[1].cos_per_layer[0] must be a number, got '0.5'"),
]


@pytest.mark.parametrize(("pointer", "value", "named"), OUT_OF_DOMAIN,
                         ids=[p for p, _, _ in OUT_OF_DOMAIN])
def test_a_value_outside_its_domain_is_one_line_naming_field_and_value(
        world, tmp_path, plant, pointer, value, named):
    path = plant(tmp_path / RECORD_FILE, _modified(world.good, _set(pointer, value)))
    with pytest.raises(RunRecordError) as caught:
        load_record(path)
    assert named in str(caught.value) and str(path) in str(caught.value)
    assert "\n" not in str(caught.value)


# Values of the wrong kind where the reading code used to index or iterate them: each was a
# TypeError, KeyError or OverflowError (an "internal error") instead of a one-line refusal.
WRONG_KIND = [
    ("log/1/hidden_norms", 2.5, "hidden_norms must be a list"),
    ("log/1/cos_per_layer", {"a": 1}, "cos_per_layer must be a list"),
    ("environment", 1.5, "'environment' must be an object"),
    ("environment", "linux", "'environment' must be an object"),
    # a field's type was not checked, only the numbers in it: report and the record's
    # headline_gamma then failed with an internal error (found by p49)
    ("diagnostics/gamma", 0.5, "diagnostics.gamma must be an object, got 0.5"),
    ("diagnostics/gamma", [0.5], "diagnostics.gamma must be an object, got [0.5]"),
    ("diagnostics/bp_cosine", 0.5, "diagnostics.bp_cosine must be a list, got 0.5"),
    ("diagnostics/bp_cosine", [[0.5]], "diagnostics.bp_cosine[0] must be a number"),
    ("diagnostics/bp_cosine/0", {"k": 0.5}, "diagnostics.bp_cosine[0] must be a number"),
    ("diagnostics/cosine_controls", {"bp": 0.5},
     "diagnostics.cosine_controls.bp must be a list"),
    ("diagnostics/cosine_table", {"k": 0.5}, "diagnostics.cosine_table must be a list"),
    ("diagnostics/cosine_table/0", 0.5, "diagnostics.cosine_table[0] must be an object"),
    ("diagnostics/cosine_table/0", {"k": 0.5}, "diagnostics.cosine_table[0] has no 'cos'"),
    ("final/test_acc", [0.5], "final.test_acc must be a number, got [0.5]"),
    ("log/1/acc_eval", {"a": 0.5}, "log[1].acc_eval must be a number"),
    ("diagnostics/rho_measurable", 0.5, "diagnostics.rho_measurable must be a list"),
    ("diagnostics/nudging", {"0.1": 0.5}, "diagnostics.nudging.0.1 must be a list"),
    # a key inside a cosine-table row was checked for its domain only: a list or an object
    # of numbers in it passed, and report failed with an internal error (found by a probe)
    ("diagnostics/cosine_table/1/cos", [0.5],
     "diagnostics.cosine_table[1].cos must be a number, got [0.5]"),
    ("diagnostics/cosine_table/1/cos", {"a": 0.5},
     "diagnostics.cosine_table[1].cos must be a number, got {'a': 0.5}"),
    ("diagnostics/cosine_table/1/defined", [1.0],
     "diagnostics.cosine_table[1].defined must be a number, got [1.0]"),
    ("diagnostics/cosine_table/0/g_norm", {"a": 1.0},
     "diagnostics.cosine_table[0].g_norm must be a number"),
    ("diagnostics/cosine_table/1/valid_reference", [True],
     "diagnostics.cosine_table[1].valid_reference must be true or false, got [True]"),
    ("diagnostics/fresh_b_null", {"mean": [0.1], "values": [0.1, 0.2]},
     "diagnostics.fresh_b_null.mean must be a number, got [0.1]"),
    ("diagnostics/fresh_b_null", {"mean": 0.1, "values": 0.2},
     "diagnostics.fresh_b_null.values must be a list, got 0.2"),
    ("diagnostics/fresh_b_null", {"z": "3", "values": [0.1]},
     "diagnostics.fresh_b_null.z must be a number, got '3'"),
    # the model's and data's fields were not checked: report and figures joined a dtype of
    # 7 or a label of 5 into their texts (internal error), a data source of 3 was indexed
    ("model/dtype", 7, "model.dtype has the wrong type (int)"),
    ("model/label", 5, "model.label has the wrong type (int)"),
    ("model/d", "16", "model.d has the wrong type (str)"),
    ("data/source", 3, "data.source has the wrong type (int)"),
    ("data/name", ["mnist"], "data.name has the wrong type (list)"),
]


@pytest.mark.parametrize(("pointer", "value", "named"), WRONG_KIND,
                         ids=[f"{p}={v!r}" for p, v, _ in WRONG_KIND])
def test_a_value_of_the_wrong_kind_is_one_line(world, tmp_path, plant, pointer, value, named):
    path = plant(tmp_path / RECORD_FILE, _modified(world.good, _set(pointer, value)))
    with pytest.raises(RunRecordError) as caught:
        load_record(path)
    assert named in str(caught.value) and "\n" not in str(caught.value)


def test_components_that_are_no_mapping_declare_no_failure(world, tmp_path, plant):
    """environment is free-form: components given as a list (no plugin's declared
    failures) are no internal error in report's notes (``.items()`` of a list was)."""
    from creditaudit.report.notes import declared_failure_notes

    path = plant(tmp_path / RECORD_FILE,
                 _modified(world.good, _set("environment/components", [1])))
    assert declared_failure_notes([load_record(path)]) == []


def test_a_cosine_table_row_of_the_wrong_kind_is_one_line_in_report(world, tmp_path, plant):
    """``creditaudit report`` names a record whose cosine-table row holds a list where a
    number belongs in one line (record, row and key), beside the good runs it reports."""
    bad = plant(tmp_path / "results" / "bad-row" / RECORD_FILE,
                _modified(world.good, _set("diagnostics/cosine_table/1/cos", [0.5])))
    good = tmp_path / "results" / "good" / RECORD_FILE
    good.parent.mkdir()
    good.write_text(as_written(world.good))
    done = cli("report", tmp_path / "results")
    assert done.returncode == 0, done.stderr
    assert_each_named_once(done.stderr, [bad], "")
    assert "diagnostics.cosine_table[1].cos must be a number" in done.stderr


def test_a_fresh_null_missing_keys_is_reported_not_an_internal_error(world, tmp_path, plant):
    """Each key of ``fresh_b_null`` is optional when read: report formatted
    ``null['training_value']`` and failed with an internal error (KeyError) on a record
    without it; the missing numbers are shown as —."""
    plant(tmp_path / "results" / "partial-null" / RECORD_FILE,
          _modified(world.good, _set("diagnostics/fresh_b_null", {"mean": 0.1})))
    done = cli("report", tmp_path / "results")
    assert done.returncode == 0 and "internal error" not in done.stderr, done.stderr


def test_a_fresh_null_of_the_right_kinds_loads(world, tmp_path, plant):
    """``fresh_b_null.values`` is a list of cosines: a record holding one loads."""
    null = {"mean": 0.1, "std": 0.05, "values": [0.05, 0.15], "training_value": 0.4,
            "z": 6.0, "n": 2, "seed": 7}
    path = plant(tmp_path / RECORD_FILE,
                 _modified(world.good, _set("diagnostics/fresh_b_null", null)))
    assert load_record(path).diagnostics.fresh_b_null == null


def test_a_report_copy_placed_outside_its_object_is_one_line(world, tmp_path, plant):
    """``protocol.report_copies`` gives each copy's place in its object: one beyond the
    object (a huge index overflowed list.insert; a merely large one was appended) is
    refused."""
    copies = world.good["protocol"].get("report_copies")
    assert copies, "the good run's protocol stores its report's copies once"
    label = next(iter(copies))
    for index in (10**30, 99, -1):
        path = plant(tmp_path / RECORD_FILE, _modified(
            world.good, _set(f"protocol/report_copies/{label}", index)))
        with pytest.raises(RunRecordError, match="report_copies has an unexpected entry"):
            load_record(path)


def _with_non_finite(good: dict, marks: dict[str, str]) -> str:
    """A record whose values at ``marks``' pointers are NaN or ±inf, written as creditaudit
    writes them (null plus a mark)."""
    record = json.loads(json.dumps(good))
    for pointer in marks:
        _set(pointer.lstrip("/"), None)(record)
    record["non_finite"] = marks
    return as_written(record)


def test_rounding_slack_is_allowed_but_not_more(world, tmp_path, plant):
    path = tmp_path / RECORD_FILE
    plant(path, _modified(world.good, _set("log/1/cos_per_layer/1", 1.0000000002)))
    assert load_record(path).log[1].value("cos_per_layer")[1] == 1.0000000002
    plant(path, _modified(world.good, _set("log/1/cos_per_layer/1", 1.00001)))
    with pytest.raises(RunRecordError, match=r"cos_per_layer\[1\] = 1.00001"):
        load_record(path)


def test_nan_is_undefined_everywhere_and_inf_only_where_unbounded(world, tmp_path, plant):
    """A diverged run writes NaN norms and cosines and infinite growth: it loads. An infinite
    cosine or a norm of −inf is no measurement: refused."""
    path = tmp_path / RECORD_FILE
    plant(path, _with_non_finite(world.good, {
        "/log/1/cos_per_layer/1": "NaN", "/final/test_acc": "NaN",
        "/log/1/hidden_norms/2": "Infinity", "/log/1/test_loss": "Infinity"}))
    record = load_record(path)
    measures = record.log[1].measures
    assert measures is not None
    assert math.isnan(measures.cos_per_layer[1]) and measures.max_block_growth > 1e308
    for pointer, name in (("/log/1/cos_per_layer/1", "Infinity"),
                          ("/diagnostics/deep_cos", "-Infinity"),
                          ("/log/1/hidden_norms/1", "-Infinity")):
        plant(path, _with_non_finite(world.good, {pointer: name}))
        with pytest.raises(RunRecordError, match="is outside"):
            load_record(path)


def test_values_an_entry_derives_are_never_read_from_the_file(world, tmp_path, plant):
    """Each number is stored once: a derived value written in the file (the copies earlier
    schemas stored, or a tampered one) is ignored and derived again from the stored ones."""
    path = tmp_path / RECORD_FILE
    plant(path, _modified(world.good, _set("log/1/h_L_norm", -2.0)))
    entry = load_record(path).log[1].measures
    assert entry is not None
    assert entry.h_L_norm == entry.hidden_norms[-1] > 0
    assert entry.deep_cos == pytest.approx(sum(entry.cos_per_layer[1:]) /
                                           (len(entry.cos_per_layer) - 1))


def test_accuracy_cosine_fraction_and_norm_fields_declare_their_domain():
    """Every field whose name says what it is carries that domain, so a new field of one of
    these kinds cannot be added without one (docs/records.md states each)."""
    import dataclasses

    expected = ((("acc",), ACCURACY), (("cos_per_layer", "deep_cos", "bp_cosine"), COSINE),
                (("fraction", "defined"), FRACTION), (("norm",), NONNEGATIVE))
    checked = 0
    for part in (EpochEntry, EpochMeasures, FinalResults, EndOfRun):
        for f in dataclasses.fields(part):
            for words, domain in expected:
                if any(word in f.name for word in words) and not f.name.endswith("_valid"):
                    assert f.metadata.get("domain") == domain, (part.__name__, f.name)
                    checked += 1
    assert checked >= 14
