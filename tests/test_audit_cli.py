"""``creditaudit audit``: reports from finished runs, --frozen, formats and one-line errors."""

from __future__ import annotations

import json
import os
import socket

import pytest

from creditaudit.cli import main
from creditaudit.config import RunConfig
from creditaudit.records import CHECKPOINT_FILE, CLAIM_FILE, RECORD_FILE
from creditaudit.report.html import markdown_fragment

TINY = {"data.n_train": 256, "data.n_test": 1024, "data.in_dim": 16, "model.d": 16,
        "model.n_blocks": 2, "optim.epochs": 1, "optim.batch_size": 64,
        "diagnostics.eval_samples": 1024,
        "diagnostics.rho_samples": 64, "diagnostics.rho_directions": 4,
        "diagnostics.null_draws": 3, "run.progress": False}


def _train(out_dir, **overrides):
    from creditaudit.run.trainer import train

    config = RunConfig().replace(**{**TINY, "run.out_dir": str(out_dir), **overrides})
    return train(config)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("audit_runs")
    dfa = _train(root, **{"method.name": "dfa"})
    frozen = _train(root, **{"method.name": "frozen"})
    other_arch = _train(root, **{"method.name": "frozen", "model.n_blocks": 3})
    return {"dfa": dfa, "frozen": frozen, "other_arch": other_arch}


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("creditaudit: error:")
    return err


def test_audit_json_has_the_four_diagnostics(runs, capsys):
    record = runs["dfa"].record
    assert main(["audit", str(runs["dfa"].run_dir), "--format", "json", "-q"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""  # -q: no stage lines
    report = json.loads(captured.out)
    assert set(report["diagnostics"]) == {"a", "b", "c", "d"}
    assert report["verdict"] in ("trustworthy", "needs walk-back")
    # (d) is evaluated against the frozen-blocks run of the same recipe beside the run
    assert report["diagnostics"]["d"]["status"] != "not evaluated"
    assert report["metadata"]["frozen_from_runs"] == 1
    assert report["metadata"]["frozen_acc"] == runs["frozen"].record.final_acc
    assert report["metadata"]["headline_acc"] == pytest.approx(record.log[-1].acc_eval)
    assert report["metadata"]["method"] == "dfa" and report["metadata"]["epoch"] == 1
    # The live audit sees what training recorded at the same epoch.
    assert report["hidden_norms"] == pytest.approx(record.log[-1].value("hidden_norms"),
                                                rel=1e-5)
    assert report["metrics"]["fresh_b_null"]["n"] == 3
    assert len(report["layer_cosines"]) == 3
    assert main(["audit", str(runs["dfa"].run_dir), "--format", "json", "--no-metrics",
                 "--no-frozen-from-runs"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["diagnostics"]["d"]["status"] == "not evaluated"
    assert report["verdict"] in ("incomplete", "needs walk-back")
    assert captured.err.startswith("audit: diagnostics (a)–(d)")  # the one stage, on stderr
    assert captured.err.count("\n") == 1


def test_audit_reports_each_metric_stage(runs, capsys):
    assert main(["audit", str(runs["dfa"].run_dir), "--format", "json"]) == 0
    stages = [line.split(":")[1].strip() for line in capsys.readouterr().err.splitlines()]
    assert stages == ["diagnostics (a)–(d) and per-layer cosines on 1024 evaluation samples "
                      "(epoch 1)", "ρ (perturbation correlation)", "nudging",
                      "fresh-feedback null"]


def test_audit_frozen_as_fraction_or_run(runs, capsys):
    dfa = str(runs["dfa"].run_dir / RECORD_FILE)
    assert main(["audit", dfa, "--frozen", "0.349", "--format", "json", "--no-metrics"]) == 0
    report = json.loads(capsys.readouterr().out)
    headline = report["metadata"]["headline_acc"]
    assert report["diagnostics"]["d"]["value"] == pytest.approx(100 * (headline - 0.349))
    assert report["metrics"] is None
    frozen_run = str(runs["frozen"].run_dir)
    assert main(["audit", dfa, "--frozen", frozen_run, "--format", "json", "--no-metrics"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["metadata"]["frozen_acc"] == pytest.approx(
        runs["frozen"].record.final_acc)


@pytest.mark.parametrize("frozen", ["34.9", "-0.1", "nan"])
def test_audit_rejects_accuracies_outside_unit_interval(runs, capsys, frozen):
    assert main(["audit", str(runs["dfa"].run_dir), "--frozen", frozen, "--no-metrics"]) == 2
    assert "fraction in [0, 1]" in _one_line_error(capsys)


def test_audit_names_frozen_when_its_run_is_missing(runs, capsys, tmp_path):
    """A --frozen that is neither a fraction nor a run (a typo, 34,9) said only "no run
    record at 34,9": among several runs, after the audited run's name, it read as that
    run's record missing."""
    dfa = str(runs["dfa"].run_dir)
    assert main(["audit", dfa, dfa, "--frozen", "34,9", "--no-metrics", "-q"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    # the option's error, said once before any run is read
    assert lines == ["creditaudit: error: --frozen 34,9 is neither an accuracy "
                     "fraction in [0, 1] (e.g. 0.349) nor a frozen run: no run record at "
                     "34,9: pass a run folder that holds record.json or the file itself"]


@pytest.mark.parametrize("flag", [["--frozen", "74.1"], ["--frozen", "nosuch-run"],
                                  ["--data-dir", "no-such-folder"],
                                  ["--device", "cuda"]])
def test_an_option_s_error_writes_nothing(runs, capsys, tmp_path, monkeypatch, flag):
    """Since one refused run gives `[]` in --output, a bad option did too: `audit RUN
    --frozen 74.1 --format json --output out.json` replaced an earlier report by `[]` and
    said `report: out.json (no run audited)`, as if RUN had been refused. An option's own
    error is the call's, as docs/reliability.md promises of bad input: one line, exit 2,
    nothing printed on stdout, no file changed."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    out_file = tmp_path / "report.json"
    out_file.write_text("an earlier call's report")
    dfa = str(runs["dfa"].run_dir)
    for paths in ([dfa], [dfa, dfa]):
        assert main(["audit", *paths, *flag, "--no-metrics", "-q", "--format", "json",
                     "--output", str(out_file)]) == 2
        assert f"error: {flag[0]}" in _one_line_error(capsys)
        assert out_file.read_text() == "an earlier call's report"
        assert main(["audit", *paths, *flag, "--no-metrics", "-q", "--format", "json"]) == 2
        assert capsys.readouterr().out == ""


def test_audit_rejects_a_frozen_run_of_another_architecture(runs, capsys):
    code = main(["audit", str(runs["dfa"].run_dir), "--frozen",
                 str(runs["other_arch"].run_dir), "--no-metrics"])
    assert code == 2
    assert "model.n_blocks" in _one_line_error(capsys)


def test_audit_formats_and_output_file(runs, capsys, tmp_path):
    run_dir = str(runs["dfa"].run_dir)
    assert main(["audit", run_dir, "--format", "latex", "--no-metrics"]) == 0
    table = capsys.readouterr().out.strip().splitlines()
    assert table[0].startswith(r"\begin{tabular}") and table[-1] == r"\end{tabular}"
    assert [line for line in table if line.startswith("dfa & ")][0].endswith(r"\\")
    out = tmp_path / "report.md"
    assert main(["audit", run_dir, "--format", "md", "--no-metrics", "--output", str(out)]) == 0
    assert "report:" in capsys.readouterr().out
    text = out.read_text()
    assert text.startswith("| method |") and "| (d) | depth utility |" in text
    assert main(["audit", run_dir, "--no-metrics"]) == 0
    assert "verdict:" in capsys.readouterr().out


def test_audit_of_several_runs_gives_one_report_each(runs, capsys, tmp_path):
    """`audit runs/dfa-…-s42-*` where the glob matches several folders: each is audited."""
    dfa, frozen = str(runs["dfa"].run_dir), str(runs["frozen"].run_dir)
    assert main(["audit", dfa, frozen, "--no-metrics", "-q"]) == 0
    out = capsys.readouterr().out
    assert out.count("creditaudit protocol — ") == 2 and out.count("verdict:") == 2
    assert out.index(f"== {dfa} ==") < out.index("(dfa)") < out.index(f"== {frozen} ==") \
        < out.index("(frozen)")
    assert main(["audit", dfa, frozen, "--no-metrics", "-q", "--format", "json"]) == 0
    reports = json.loads(capsys.readouterr().out)
    assert [r["metadata"]["method"] for r in reports] == ["dfa", "frozen"]
    assert main(["audit", dfa, frozen, "--no-metrics", "-q", "--format", "latex"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()  # one table, a row per run
    assert lines[0].startswith(r"\begin{tabular}") and lines[-1] == r"\end{tabular}"
    first = lines.index(f"% {dfa}")
    assert lines[first + 1].startswith("dfa & ")
    assert lines[first + 2] == f"% {frozen}" and lines[first + 3].startswith("frozen & ")
    out_file = tmp_path / "reports.md"
    assert main(["audit", dfa, frozen, "--no-metrics", "-q", "--format", "md",
                 "--output", str(out_file)]) == 0
    assert out_file.read_text().count("| (d) | depth utility |") == 2
    # One bad run among them: one line naming it, the others still audited, exit 2.
    capsys.readouterr()
    missing = str(tmp_path / "nope")
    assert main(["audit", missing, dfa, "--no-metrics", "-q", "--format", "json"]) == 2
    captured = capsys.readouterr()
    assert [r["metadata"]["method"] for r in json.loads(captured.out)] == ["dfa"]
    assert len(captured.err.strip().splitlines()) == 1
    assert captured.err.startswith(f"creditaudit: error: {missing}: no run record")


def test_json_of_several_runs_all_refused_is_an_empty_list(tmp_path, capsys):
    """`audit runs/* --format json` where every run is refused printed nothing at all (not
    a JSON document), so `json.load` in a script piping it broke, and with --output an
    earlier report in the file was left standing; it is now `[]`, the refusals still on
    stderr and the exit still 2."""
    paths = [str(tmp_path / "a"), str(tmp_path / "b")]  # no record in either
    assert main(["audit", *paths, "--format", "json", "-q"]) == 2
    captured = capsys.readouterr()
    assert json.loads(captured.out) == []
    assert [line.split(":")[2].strip() for line in captured.err.splitlines()] == paths
    out_file = tmp_path / "reports.json"
    out_file.write_text("[{\"an earlier\": \"report\"}]")
    assert main(["audit", *paths, "--format", "json", "-q", "--output", str(out_file)]) == 2
    assert json.loads(out_file.read_text()) == []
    assert capsys.readouterr().out == f"report: {out_file} (no run audited)\n"


@pytest.mark.parametrize("form", ["json", "md"])
def test_one_refused_run_leaves_no_earlier_report_standing(tmp_path, capsys, plant, form):
    """`audit RUN --format json --output out.json` where RUN's record was unreadable raised
    before anything was written: nothing on stdout (not a JSON document) and, with --output,
    an earlier call's report left in the file as if it were this one's. One refused run is
    now what several are: JSON `[]`, the file replaced by this call's (empty) result, the
    refusal one line on stderr, exit 2."""
    run = tmp_path / "run"
    run.mkdir()
    plant(run / RECORD_FILE, '{"schema": "creditaudit.run/1", "log": [')
    if form == "json":
        assert main(["audit", str(run), "--format", "json", "-q"]) == 2
        assert json.loads(capsys.readouterr().out) == []
    out_file = tmp_path / f"report.{form}"
    out_file.write_text("an earlier call's report")
    assert main(["audit", str(run), "--format", form, "-q", "--output", str(out_file)]) == 2
    assert out_file.read_text() == ("[]\n" if form == "json" else "")
    assert capsys.readouterr().out == f"report: {out_file} (no run audited)\n"
    assert main(["audit", str(run), "--format", form, "-q"]) == 2
    assert "truncated or not JSON" in _one_line_error(capsys)


def test_audit_missing_run_exits_2_with_one_line(tmp_path, capsys):
    assert main(["audit", str(tmp_path / "nope")]) == 2
    assert "no run record" in _one_line_error(capsys)


def test_audit_of_a_results_folder_names_its_runs(runs, capsys):
    """audit RESULTS (the --out of train/sweep, a folder of many runs) said only 'no run
    record at RESULTS/record.json: pass a run folder that holds record.json', as for a path
    holding nothing; it now says the folder holds runs and names one."""
    results = runs["dfa"].run_dir.parent
    found = sorted(path.parent for path in results.glob(f"*/{RECORD_FILE}"))
    assert len(found) >= 3
    assert main(["audit", str(results)]) == 2
    line = _one_line_error(capsys)
    assert f"{results} is a results folder of {len(found)} runs, not a run's folder: pass " \
           f"a run's folder (e.g. {found[0]}), or several" in line, line


@pytest.mark.parametrize("name", [CHECKPOINT_FILE, "config.toml", "init.pt"])
def test_audit_of_a_run_s_other_file_names_its_folder(runs, capsys, name):
    """audit RUN/checkpoint.pt (or its config.toml, init.pt: a tab-completed path) read the
    file as a record and refused it as "not UTF-8 text (a binary file?)" or "truncated or
    not JSON", blaming a file that is fine; it now names the run's folder to pass, for the
    run audited and for --frozen alike."""
    run_dir = runs["dfa"].run_dir
    assert main(["audit", str(run_dir / name), "-q"]) == 2
    line = _one_line_error(capsys)
    assert f"{run_dir / name} is one of the run's own files, not its record: pass the " \
           f"run's folder {run_dir} (or its {RECORD_FILE})" in line, line
    frozen = runs["frozen"].run_dir
    assert main(["audit", str(run_dir), "-q", "--frozen", str(frozen / name)]) == 2
    line = _one_line_error(capsys)
    assert f"--frozen {frozen / name} is neither" in line
    assert f"pass the run's folder {frozen} (or its {RECORD_FILE})" in line, line


def test_audit_missing_checkpoint_or_malformed_record_exits_2(runs, tmp_path, capsys, plant):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(runs["dfa"].run_dir, copy)
    (copy / CHECKPOINT_FILE).unlink()
    assert main(["audit", str(copy)]) == 2
    error = _one_line_error(capsys)
    # the completed run wrote a checkpoint with its epoch: the file was removed, and
    # `train --resume` (the advice for a run that never trained) would only serve the record
    assert "no checkpoint" in error and "moved or deleted" in error and "--force" in error
    assert "never finished an epoch" not in error and "--resume" not in error
    plant(copy / RECORD_FILE, '{"schema": "creditaudit.run/1", "log": [')
    assert main(["audit", str(copy)]) == 2
    assert "truncated or not JSON" in _one_line_error(capsys)


def test_audit_help_documents_every_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["audit", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--frozen", "--format", "--output", "--metrics", "--no-metrics", "RUN"):
        assert option in text
    # --device said the diagnostics "always run in fp32", while ρ and nudging run on a
    # float64 copy (the report's metadata.metrics_precision says float64)
    assert "always run in fp32" not in text
    assert "ρ and nudging on a float64 copy" in " ".join(text.split())


def test_audit_refuses_an_unfinished_frozen_run_and_its_advice_works(tmp_path, capsys,
                                                                      monkeypatch):
    """A frozen run interrupted after epoch 1 has no final test accuracy (its final_acc
    falls back to the last logged epoch): --frozen used to take it as (d)'s baseline; the
    look-up beside the run counts only finished frozen runs, and so does --frozen now."""
    from creditaudit.run.trainer import Trainer

    root = tmp_path / "runs"
    dfa = str(_train(root, **{"method.name": "dfa", "optim.epochs": 2}).run_dir)
    original = Trainer.train_epoch

    def interrupted_at_2(self, current):  # noqa: ANN001
        if current == 2:
            raise KeyboardInterrupt
        return original(self, current)

    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(Trainer, "train_epoch", interrupted_at_2)
        _train(root, **{"method.name": "frozen", "optim.epochs": 2})
    (frozen,) = [p for p in root.iterdir() if str(p) != dfa]
    assert (frozen / RECORD_FILE).exists()
    capsys.readouterr()
    # Audited itself (at its last checkpoint), it is no baseline of (d): its verdict read
    # 'baseline of (d)', where the tables say '— (run interrupted)' and --frozen refuses it.
    assert main(["audit", str(frozen), "--no-metrics", "-q"]) == 0
    out = capsys.readouterr().out
    assert "run status interrupted: audited at its last checkpoint, epoch 1" in out
    assert "baseline of (d)" not in out.split("verdict: ")[1].splitlines()[0]
    assert main(["audit", dfa, "--frozen", str(frozen), "--no-metrics"]) == 2
    config = frozen / "config.toml"
    assert _one_line_error(capsys) == (
        f"creditaudit: error: --frozen run {frozen} is interrupted (1 of 2 epochs done), so "
        f"it has no final test accuracy: finish it with creditaudit train --config {config} "
        "--resume, then audit again")
    # trained again by a live process now (its claim): a --resume would be refused as busy
    claim = frozen / CLAIM_FILE
    claim.write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname(),
                                 "time": "now", "token": "another-process"}))
    assert main(["audit", dfa, "--frozen", str(frozen), "--no-metrics"]) == 2
    line = _one_line_error(capsys)
    assert f"is interrupted (being trained again by pid {os.getppid()} on " in line
    assert line.endswith("wait for it to finish, then audit again") and "--resume" not in line
    claim.unlink()
    # without --frozen the unfinished run is not a baseline either: (d) is not evaluated
    assert main(["audit", dfa, "--no-metrics", "--format", "json"]) == 0
    metadata = json.loads(capsys.readouterr().out)["metadata"]
    assert "frozen_from_runs" not in metadata and metadata["frozen_acc"] is None
    assert main(["train", "--config", str(config), "--resume", "-q"]) == 0  # as it says
    capsys.readouterr()
    assert main(["audit", dfa, "--frozen", str(frozen), "--no-metrics", "--format",
                 "json"]) == 0
    from creditaudit.records import load_record

    finished = load_record(frozen)
    assert finished.status == "completed"
    report = json.loads(capsys.readouterr().out)
    assert report["metadata"]["frozen_acc"] == pytest.approx(finished.final_acc)


def test_load_run_names_the_folder_it_read_not_the_one_recorded(runs, tmp_path):
    """A copied run's ``run.out_dir`` names the folder it trained in: ``load_run(...).run_dir``
    used to be built from it, so it named the original (or a folder that no longer exists)."""
    import shutil

    from creditaudit.audit import load_run

    copy = tmp_path / "moved" / runs["dfa"].run_dir.name
    shutil.copytree(runs["dfa"].run_dir, copy)
    assert load_run(copy).run_dir == copy
    assert load_run(copy / RECORD_FILE).run_dir == copy


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_audit_on_a_missing_gpu_names_its_own_option(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["audit", str(tmp_path), "--device", "cuda"]) == 2
    out, err = capsys.readouterr()
    (line,) = [text for text in (out + err).splitlines() if text.strip()]
    # the flag as the command line spells it, not audit_run's argument device='cuda'
    assert "--device cuda but no CUDA device is available; use --device cpu" in line
    assert "run.device" not in line and "device='cuda'" not in line


@pytest.mark.parametrize("method, options", [
    ("frozen", {"method.penalty": 0.1}),
    ("credit-bridge", {"method.bridge_copies": 2, "method.bridge_noise": 0.0}),
])
def test_a_run_trained_before_its_options_were_refused_is_audited_as_trained(
        tmp_path, capsys, monkeypatch, method, options):
    """Options refused today as changing nothing (the frozen baseline's penalty; bridge
    copies without noise) were accepted by earlier versions: their runs exist, and audit
    rebuilds them with the options they recorded instead of refusing their own record."""
    import creditaudit.methods
    import creditaudit.run.plan

    with monkeypatch.context() as older_version:
        for module in (creditaudit.methods, creditaudit.run.plan):
            older_version.setattr(module, "check_options", lambda cls, config: None)
        run = _train(tmp_path, **{"method.name": method, **options})
    assert run.record.status == "completed"
    assert main(["train", "--config", str(run.run_dir / RECORD_FILE), "--out",
                 str(tmp_path / "again"), "-q"]) == 2  # training it anew is still refused
    assert "has no effect" in _one_line_error(capsys)
    assert main(["audit", str(run.run_dir), "--format", "json", "-q"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["metadata"]["method"] == method and report["metadata"]["epoch"] == 1


def test_a_rule_extra_named_as_a_metric_does_not_replace_the_measured_one(tmp_path, capsys,
                                                                          monkeypatch):
    """A rule's per-epoch field named like an end-of-run metric (a plugin's end_epoch
    returning {"bp_cosine": 0.5}) replaced audit's measured per-layer cosines with 0.5, and
    the text report then crashed as an internal error; the report of the record leaves such
    a field out (``epoch_fields``), and so does audit now."""
    from creditaudit.methods.dfa import DFA

    monkeypatch.setattr(DFA, "end_epoch",
                        lambda self, epoch, n_epochs: {"bp_cosine": 0.5, "own_error": 0.25})
    run = _train(tmp_path, **{"method.name": "dfa"})
    assert run.record.log[-1].extras == {"bp_cosine": 0.5, "own_error": 0.25}
    assert main(["audit", str(run.run_dir), "--format", "json", "-q"]) == 0
    metrics = json.loads(capsys.readouterr().out)["metrics"]
    assert metrics["bp_cosine"] == pytest.approx(run.record.diagnostics.bp_cosine)
    assert metrics["own_error"] == 0.25  # the rule's own field is still shown
    assert main(["audit", str(run.run_dir), "--no-metrics", "--format", "json", "-q"]) == 0
    assert json.loads(capsys.readouterr().out)["metrics"] == {"own_error": 0.25}
    assert main(["audit", str(run.run_dir), "-q"]) == 0
    assert "cos per layer   [" in capsys.readouterr().out


def test_a_frozen_run_audited_is_not_judged_against_a_frozen_baseline(runs, capsys, caplog):
    """`audit runs/*-s42-* --frozen FROZEN` audits the frozen run too: (d) judged it against
    itself (margin 0 pp: "the trained blocks add too little", needs walk-back), where every
    report of its record calls it the frozen baseline of (d) and leaves (d) as trained."""
    frozen = str(runs["frozen"].run_dir)
    for baseline in (frozen, "0.05"):
        assert main(["audit", frozen, "--frozen", baseline, "--no-metrics", "--format",
                     "json", "-q"]) == 0
        report = json.loads(capsys.readouterr().out)
        d = report["diagnostics"]["d"]
        assert d["status"] == "not evaluated" and report["metadata"]["frozen_acc"] is None
        assert "this frozen-blocks run is the baseline" in d["reason"]
        assert "--frozen is not applied to it" in caplog.text


def test_an_audited_frozen_run_s_verdict_reads_as_the_tables_say_it(runs, capsys, tmp_path):
    """The tables, the report and Figure 6 say of a finished frozen-blocks run "baseline of
    (d)" in place of a verdict (baseline_text); its audit gave it a verdict of its own
    ("needs walk-back (c); (d) not evaluated"), so one run read two ways. Every format of
    the audit now says what the tables say (JSON keeps the judgement's data, and the label
    in metadata.baseline); a run of another rule keeps its verdict."""
    from creditaudit.protocol.records import baseline_text
    from creditaudit.records import load_record

    frozen = runs["frozen"].run_dir
    label = baseline_text(load_record(frozen))
    assert label == "baseline of (d)"
    assert main(["audit", str(frozen), "--no-metrics", "-q"]) == 0
    assert f"verdict: {label}\n" in capsys.readouterr().out
    assert main(["audit", str(frozen), "--no-metrics", "-q", "--format", "md"]) == 0
    out = capsys.readouterr().out
    assert f"**Verdict: {label}**" in out and f"| {label} |" in out
    assert main(["audit", str(frozen), "--no-metrics", "-q", "--format", "latex"]) == 0
    assert f"& {label} \\\\" in capsys.readouterr().out
    assert main(["audit", str(frozen), "--no-metrics", "-q", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["metadata"]["baseline"] == label
    out_file = tmp_path / "report.md"
    assert main(["audit", str(frozen), "--no-metrics", "-q", "--output", str(out_file)]) == 0
    assert capsys.readouterr().out == f"report: {out_file} ({label})\n"
    assert main(["audit", str(runs["dfa"].run_dir), "--no-metrics", "-q"]) == 0
    assert "verdict: needs walk-back" in capsys.readouterr().out


def test_audit_of_a_diverged_run_says_which_epoch_it_audited(tmp_path, capsys):
    """A diverged run's checkpoint is its last finite epoch (here epoch 0): the text and
    Markdown reports gave its numbers and verdict without saying that they are not of the
    run's end (only -q-less stderr and the json's metadata named the epoch)."""
    run = _train(tmp_path, **{"method.name": "bp", "optim.lr": 1e4, "optim.epochs": 2})
    assert run.record.status == "diverged"
    line = "run status diverged: audited at its last checkpoint, epoch 0"
    for form in ("text", "md"):
        assert main(["audit", str(run.run_dir), "--no-metrics", "-q", "--format", form]) == 0
        assert line in capsys.readouterr().out.splitlines()
    assert main(["audit", str(run.run_dir), "--no-metrics", "-q", "--format", "json"]) == 0
    metadata = json.loads(capsys.readouterr().out)["metadata"]
    assert (metadata["status"], metadata["epoch"]) == ("diverged", 0)


def test_audit_run_takes_a_frozen_run_as_a_path(runs):
    """``audit_run(..., frozen=Path(...))`` (load_run takes a Path) raised a TypeError from
    float(); a Path is a frozen run's folder, and what is neither is one line."""
    from creditaudit.audit import audit_run
    from creditaudit.errors import ConfigError

    report = audit_run(runs["dfa"].run_dir, frozen=runs["frozen"].run_dir, metrics=False)
    assert report.metadata["frozen_acc"] == pytest.approx(runs["frozen"].record.final_acc)
    for bad in (True, [0.5]):
        with pytest.raises(ConfigError, match="must be an accuracy fraction in"):
            audit_run(runs["dfa"].run_dir, frozen=bad, metrics=False)


def test_a_report_that_cannot_be_written_is_printed_not_lost(runs, capsys, tmp_path,
                                                             monkeypatch):
    from creditaudit.errors import OutputError
    from creditaudit.files import safe_files

    def full_disk(path, data):
        raise OutputError(f"cannot write {path}: no space left on device")

    monkeypatch.setattr(safe_files, "atomic_write_bytes", full_disk)
    out = tmp_path / "report.md"
    assert main(["audit", str(runs["dfa"].run_dir), "--format", "md", "--no-metrics", "-q",
                 "--output", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out.startswith("| method |") and "| (d) | depth utility |" in captured.out
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "the report is printed above instead" in err


@pytest.mark.parametrize("named", [".", "record.json"])
def test_audit_from_inside_the_run_folder_finds_the_frozen_runs_beside_it(runs, capsys,
                                                                         monkeypatch, named):
    """``cd RUN && creditaudit audit .``: the results folder was looked for as the parent
    of "." (itself), so the frozen-blocks run beside was missed and (d) silently not
    evaluated — another verdict than ``audit RUN`` for the same run."""
    monkeypatch.chdir(runs["dfa"].run_dir)
    assert main(["audit", named, "--format", "json", "--no-metrics", "-q"]) == 0
    metadata = json.loads(capsys.readouterr().out)["metadata"]
    assert metadata["frozen_from_runs"] == 1
    assert metadata["frozen_acc"] == runs["frozen"].record.final_acc


def test_audit_output_dash_prints_the_report(runs, capsys, tmp_path, monkeypatch):
    """--output - wrote the report to a file named '-' in the working folder (and said
    'report: -'), not to stdout as - means."""
    monkeypatch.chdir(tmp_path)
    assert main(["audit", str(runs["dfa"].run_dir), "--output", "-", "--format", "json",
                 "--no-metrics", "-q"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"]
    assert not (tmp_path / "-").exists()


def test_audit_refuses_an_empty_output_path(runs, capsys):
    """``--output ''`` was taken as no --output: the report was printed and exit 0, as if
    written (docs/reliability.md §7: an empty path is refused)."""
    code = main(["audit", str(runs["dfa"].run_dir), "--no-metrics", "-q", "--output", ""])
    assert code == 2
    assert "--output" in _one_line_error(capsys)


def test_audit_of_a_float64_run_says_how_to_audit_it(tmp_path, capsys):
    """A run a Python caller made in float64: the command line (float32) refuses it in one
    line naming what audits it — not --force, which audit has no such flag for — and a
    float64 Python caller audits it."""
    import torch

    from creditaudit.audit.checkpoint import audit_run
    from creditaudit.errors import RunRecordError

    torch.set_default_dtype(torch.float64)
    try:
        run = _train(tmp_path, **{"method.name": "dfa", "diagnostics.end_of_run": False})
        assert audit_run(run.run_dir).verdict  # audited in its own dtype
    finally:
        torch.set_default_dtype(torch.float32)
    assert main(["audit", str(run.run_dir), "-q"]) == 2
    err = _one_line_error(capsys)
    assert "default dtype float64" in err and "--force" not in err
    assert "torch.set_default_dtype(torch.float64)" in err and "audit_run" in err
    with pytest.raises(RunRecordError, match=r"set_default_dtype\(torch.float64\) first to "
                                             r"audit it$"):
        audit_run(run.run_dir)


def test_several_runs_are_named_by_their_folders_as_plain_text(runs, tmp_path, capsys):
    """``audit A B`` names each run by the path it was given: a folder named with a line
    break ended the LaTeX comment naming it (the rest of the name was LaTeX to compile),
    split the text and Markdown title lines, and a Markdown link or an escape sequence in
    it was rendered as such."""
    import shutil

    source = runs["dfa"].run_dir
    odd = str(tmp_path / "r\n\\input{secret}\x1b[2J")
    linked = str(tmp_path / "[x](javascript:y) <b>")
    shutil.copytree(source, odd)
    shutil.copytree(source, linked)
    flat = odd.replace("\n", " ").replace("\x1b", " ")
    capsys.readouterr()
    outs = {}
    for form in ("latex", "md", "text"):
        assert main(["audit", odd, linked, "--no-metrics", "-q", "--format", form]) == 0
        outs[form] = capsys.readouterr().out
        assert "\x1b" not in outs[form]
    assert not any(line.startswith("\\input") for line in outs["latex"].splitlines())
    assert f"% {flat}" in outs["latex"].splitlines()
    assert f"== {flat} ==" in outs["text"].splitlines()
    page = markdown_fragment(outs["md"])
    assert "<a " not in page and "<b>" not in page and "\\input{secret}" in page
    assert page.count("<h3>") == 2 and "[x](javascript:y) &lt;b&gt;</h3>" in page


def test_a_folder_holding_only_its_own_config_toml_is_no_run_starting(tmp_path, capsys):
    """`creditaudit audit proj` on a researcher's folder holding their own config.toml (no
    run ever there) said "proj holds config.toml of a run that has not written its record
    yet (one starting now in another process, or one killed …): wait for it": untrue. Only
    a run's own files (its claim, init.pt, checkpoint.pt) say a run is or was there."""
    (tmp_path / "config.toml").write_text("[optim]\nepochs = 1\n")
    assert main(["audit", str(tmp_path)]) == 2
    error = _one_line_error(capsys)
    assert "of a run that has not written its record yet" not in error
    assert f"pass a run folder that holds {RECORD_FILE}" in error
    (tmp_path / CLAIM_FILE).write_text("{}")
    assert main(["audit", str(tmp_path)]) == 2
    assert (f"holds config.toml, {CLAIM_FILE} of a run that has not written its record yet"
            in _one_line_error(capsys))
