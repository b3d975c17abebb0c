"""``creditaudit export --layout faeval``: the files the original figure scripts read exist,
hold the keys those scripts use, and carry the run records' values."""

from __future__ import annotations

import json
import shutil

import pytest

from creditaudit.cli import main
from creditaudit.records import RECORD_FILE, load_record
from creditaudit.study.experiments import run_experiments
from creditaudit.study.export import MANIFEST_FILE, export, manifest


@pytest.fixture(scope="module")
def results(tmp_path_factory, single_thread):
    # The same folder as test_experiments.py: within one session nothing is trained twice.
    folder = tmp_path_factory.getbasetemp() / "smoke_results"
    run_experiments(["audit_table", "penalty_sweep", "temporal"], scale="smoke",
                    out_dir=folder)
    records = [load_record(p).to_dict() for p in folder.glob(f"*/{RECORD_FILE}")]
    return folder, records


def find(records, method, *, arch="resmlp", out_ln=True, penalty=0.0, seed=42, epochs=2):
    """The one record of a run, as the export should have picked it."""
    hits = [r for r in records
            if r["config"]["method"]["name"] == method and r["config"]["model"]["arch"] == arch
            and r["model"]["terminal_ln"] == out_ln
            and r["config"]["method"]["penalty"] == penalty
            and r["config"]["method"]["trainable_blocks"] is None
            and r["config"]["run"]["seed"] == seed and r["config"]["optim"]["epochs"] == epochs]
    assert len(hits) == 1, (method, arch, out_ln, penalty, seed)
    return hits[0]


@pytest.fixture(scope="module")
def exported(results, tmp_path_factory):
    folder, _ = results
    out = tmp_path_factory.mktemp("faeval")
    return out, export(folder, out, layout="faeval")


def load(out, rel):
    return json.loads((out / "results" / rel).read_text())


def test_seed_000_and_001_penalty_rescue_inputs(results, exported):
    """Seed 000/001: vanilla DFA snapshot and the penalised DFA logs."""
    _, records = results
    out, _ = exported
    snap = load(out, "snapshot_evolution_v2/snapshot_evolution_s42.json")
    vanilla = find(records, "dfa")["log"]
    assert [e["epoch"] for e in snap["dfa_log"]] == [e["epoch"] for e in vanilla]
    for i, entry in enumerate(snap["dfa_log"]):
        assert entry["hidden_norms"][-1] == vanilla[i]["hidden_norms"][-1]
        assert entry["bp_grad_norms_per_sample_med"][-1] == \
            vanilla[i]["bp_grad_norms_per_sample_med"][-1]
        assert entry["acc_eval"] == vanilla[i]["acc_eval"]
    for lam in ("0.001", "0.01", "0.1", "0.0001", "0.0"):
        pen = load(out, f"dfa_residual_penalty/dfa_pen_lam{lam}_s42.json")
        log = find(records, "dfa", penalty=float(lam))["log"]
        assert [e["h_L_norm"] for e in pen["log"]] == [e["h_L_norm"] for e in log]
        assert [e["g_2_norm"] for e in pen["log"]] == [e["g_2_norm"] for e in log]
        assert [e["acc_eval"] for e in pen["log"]] == [e["acc_eval"] for e in log]


def test_seed_003_cross_architecture_inputs(results, exported):
    """Seed 003 reads bp/dfa/fa logs per architecture through extract_series."""
    _, records = results
    out, _ = exported

    def extract_series(log):
        return ([e["epoch"] for e in log], [e["hidden_norms"][-1] for e in log],
                [e["bp_grad_norms_per_sample_med"][-1] for e in log],
                [e["acc_eval"] for e in log])

    files = {
        "noln": ("snapshot_no_outln_v1/snapshot_noLN_s42.json",
                 "snapshot_no_outln_v1/snapshot_fa_canonical_noln_s42.json",
                 {"arch": "resmlp", "out_ln": False}),
        "synth": ("snapshot_synth_v1/snapshot_synth_a1.0_L4_s42.json",
                  "snapshot_synth_v1/snapshot_fa_canonical_s42.json",
                  {"arch": "student", "out_ln": False}),  # StudentNet has no terminal LN
    }
    for pair, fa, where in files.values():
        pair_json, fa_json = load(out, pair), load(out, fa)
        for key, method in (("bp_log", "bp"), ("dfa_log", "dfa")):
            assert extract_series(pair_json[key]) == extract_series(
                find(records, method, **where)["log"])
        assert extract_series(fa_json["fa_log"]) == extract_series(
            find(records, "fa", **where)["log"])


def test_seed_004_results_file(results, exported):
    """Seed 004: d[str(seed)][method] with log lists, diagnostics and drift (folder naming:
    results/{dataset}/ for seed 42, results/{dataset}_seed{seed}/ otherwise)."""
    _, records = results
    out, _ = exported
    for seed, rel in ((42, "synthetic/results_synthetic.json"),
                      (123, "synthetic_seed123/results_synthetic.json")):
        d = load(out, rel)
        assert list(d) == [str(seed)]
        methods = d[str(seed)]
        assert set(methods) == {"bp", "dfa", "state_bridge", "credit_bridge"}
        for key, method in (("bp", "bp"), ("dfa", "dfa"), ("state_bridge", "state-bridge"),
                            ("credit_bridge", "credit-bridge")):
            record = find(records, method, seed=seed)
            trained = [e for e in record["log"] if e["epoch"] >= 1]
            log = methods[key]["log"]
            assert log["test_acc"] == [e["test_acc"] for e in trained]
            assert log["train_acc"] == [e["train_acc"] for e in trained]
            diag = methods[key]["diagnostics"]
            assert diag["bp_cosine"] == record["diagnostics"]["bp_cosine"]
            assert diag["perturbation_rho"] == record["diagnostics"]["perturbation_rho"]
            assert diag["nudging"]["0.01"] == record["diagnostics"]["nudging"]["0.01"]
            drift = methods[key]["drift"]
            assert drift["blocks.0.w1.weight"] == \
                record["diagnostics"]["drift"]["blocks.0.w1.weight"]
        state_log = methods["state_bridge"]["log"]
        assert state_log["state_pred_error"] == [
            e["state_pred_error"] for e in find(records, "state-bridge", seed=seed)["log"]
            if e["epoch"] >= 1]
        assert len(state_log["state_pred_error"]) == len(state_log["train_acc"]) == 2


def test_vit_files_come_from_whichever_dataset_has_vit_runs(results, exported):
    """No CIFAR here: the ViT snapshots are the smoke ViT-Mini runs on the synthetic task
    viewed as 3×32×32 images (the temporal experiment's); no ConvMixer file exists."""
    _, records = results
    out, result = exported
    runs = {e["path"]: e["runs"] for e in result.written}
    for seed in (42, 123):
        pair = load(out, f"snapshot_vit_v1/snapshot_vit_s{seed}.json")
        fa = load(out, f"snapshot_vit_v1/snapshot_fa_canonical_s{seed}.json")
        for key, log, method, name in (("bp_log", pair, "bp", "snapshot_vit"),
                                       ("dfa_log", pair, "dfa", "snapshot_vit"),
                                       ("fa_log", fa, "fa", "snapshot_fa_canonical")):
            record = find(records, method, arch="vit", seed=seed)
            assert record["config"]["data"]["name"] == "synthetic"
            assert record["config"]["data"]["in_dim"] == 3072
            assert log[key] == record["log"]
            file_runs = runs[f"results/snapshot_vit_v1/{name}_s{seed}.json"]
            assert file_runs[key] == record["run_id"]
    assert not any("convmixer" in json.dumps(e["runs"]) for e in result.written)


def test_missing_runs_are_skipped_with_what_they_need(exported):
    out, result = exported
    written = {e["path"] for e in result.written}
    skipped = {e["path"]: e["needs"] for e in result.skipped}
    assert "results/cifar10/results_cifar10.json" in skipped  # no CIFAR here
    assert not (out / "results" / "cifar10").exists()
    for path in written:
        assert (out / path).is_file()
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert {e["path"] for e in manifest["written"]} == written
    assert {e["path"] for e in manifest["skipped"]} == set(skipped)


def test_partial_file_lists_its_missing_keys(results, tmp_path):
    folder, records = results
    for method in ("bp", "dfa"):
        run_id = find(records, method)["run_id"]
        shutil.copytree(folder / run_id, tmp_path / "runs" / run_id)
    result = export(tmp_path / "runs", tmp_path / "out")
    entry = next(e for e in result.written
                 if e["path"].endswith("snapshot_evolution_v2/snapshot_evolution_s42.json"))
    assert entry["missing"] == ["fa_log"] and "fa on ResidualMLP" in entry["needs"]
    snap = json.loads((tmp_path / "out" / entry["path"]).read_text())
    assert set(snap) == {"bp_log", "dfa_log"}
    assert not (tmp_path / "out" / "results" / "snapshot_evolution_v2" /
                "snapshot_evolution_s123.json").exists()


def test_export_command(results, tmp_path, capsys):
    folder, _ = results
    assert main(["export", "--layout", "faeval", str(folder), str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "wrote   results/snapshot_evolution_v2/snapshot_evolution_s42.json" in out
    assert "wrote   results/snapshot_vit_v1/snapshot_vit_s42.json" in out
    assert "skipped results/cifar10/results_cifar10.json" in out
    assert main(["export", str(tmp_path / "nothing"), str(tmp_path / "out2")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not exist" in err


def test_dataset_restricts_the_files_to_runs_on_it(results, tmp_path, capsys):
    """``--dataset`` once only preferred a dataset: on a folder of synthetic runs,
    ``--dataset fashion-mnist`` wrote snapshot files from the synthetic runs and a manifest
    naming a synthetic run beside "needs … fashion-mnist". Now every file but the StudentNet
    ones takes runs on that dataset only; the others are skipped with what they need."""
    folder, records = results
    out = tmp_path / "out"
    assert main(["export", str(folder), str(out), "--dataset", "fashion-mnist"]) == 0
    printed = capsys.readouterr().out
    assert "skipped results/snapshot_evolution_v2/snapshot_evolution_s42.json" in printed
    written = json.loads((out / MANIFEST_FILE).read_text())["written"]
    datasets = {r["run_id"]: (r["config"]["data"]["name"], r["config"]["model"]["arch"])
                for r in records}
    used = {datasets[run] for entry in written for run in entry["runs"].values()}
    assert used and all(arch == "student" for _, arch in used)  # StudentNet: synthetic task
    assert all("snapshot_synth_v1" in entry["path"] for entry in written)
    assert not (out / "results" / "snapshot_evolution_v2").exists()
    assert not (out / "results" / "snapshot_vit_v1").exists()
    skipped = json.loads((out / MANIFEST_FILE).read_text())["skipped"]
    evolution = next(e for e in skipped if e["path"].endswith("snapshot_evolution_s42.json"))
    assert "fashion-mnist" in evolution["needs"]
    # the dataset the runs are on still exports them
    same = export(folder, tmp_path / "same", dataset="synthetic")
    assert any("snapshot_evolution_s42" in e["path"] for e in same.written)


def test_unknown_dataset_is_refused_naming_the_folders_datasets(results, tmp_path, capsys):
    folder, _ = results
    assert main(["export", str(folder), str(tmp_path / "out"), "--dataset", "nosuch"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "'nosuch'" in err and "it holds: synthetic" in err
    assert not (tmp_path / "out").exists()


def test_results_folder_that_is_a_file_or_empty_is_refused(tmp_path, capsys):
    a_file = tmp_path / "afile"
    a_file.write_text("x\n")
    assert main(["export", str(a_file), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "is a file, not a folder" in err and "does not exist" not in err
    assert main(["export", "", str(tmp_path / "out")]) == 2
    assert "empty path" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    # a folder holding no record (a mistyped one) once wrote a manifest of every file
    # skipped and exited 0; now, as report and figures, one line, nothing written
    (tmp_path / "empty").mkdir()
    assert main(["export", str(tmp_path / "empty"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert (f"{tmp_path / 'empty'} holds no run records (record.json below it), so there "
            "is nothing to export: pass the folder your runs were written to") in err
    assert not (tmp_path / "out").exists()


# --- copies of one run, empty end-of-run blocks, diverged runs -------------------------------
TINY = {"data.n_train": 256, "data.n_test": 128, "data.in_dim": 8, "data.teacher_width": 16,
        "model.d": 16, "model.n_blocks": 2, "optim.epochs": 2, "optim.batch_size": 64,
        "diagnostics.eval_samples": 128, "diagnostics.rho_samples": 16,
        "diagnostics.null_draws": 2, "run.progress": False}


@pytest.fixture(scope="module")
def copies(tmp_path_factory, single_thread):
    """bp and fa runs (fa without its end-of-run block); a dfa run trained twice, with and
    without it (two run ids, one recipe); a dfa run of the same recipe that diverged in
    epoch 2 (a NaN update, its own seed)."""
    from creditaudit.config import RunConfig
    from creditaudit.run.trainer import Trainer, train
    from integrity_support import nan_weights_after

    out = tmp_path_factory.mktemp("copies")

    def run(folder, **overrides):
        config = RunConfig().replace(**{**TINY, "run.out_dir": str(out / folder), **overrides})
        return train(config).record

    runs = {"bp": run("all", **{"method.name": "bp"}),
            "fa": run("all", **{"method.name": "fa", "diagnostics.end_of_run": False}),
            "full": run("all", **{"method.name": "dfa"}),
            "bare": run("all", **{"method.name": "dfa", "diagnostics.end_of_run": False})}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "train_epoch", nan_weights_after(2))
        runs["diverged"] = run("all", **{"method.name": "dfa", "run.seed": 7,
                                         "diagnostics.end_of_run": False})
    return out / "all", runs


def _arranged(folder, tmp_path, name, first, *others):
    """Runs of ``folder`` below ``tmp_path/name``: ``first`` in a/, ``others`` in b/
    (readers list a/ before b/)."""
    root = tmp_path / name
    for sub, records in (("a", [first]), ("b", others)):
        for record in records:
            shutil.copytree(folder / record.run_id, root / sub / record.run_id)
    return root


def test_of_copies_of_one_run_the_one_that_fills_the_most_is_taken(copies, tmp_path):
    folder, runs = copies
    full, bare = runs["full"], runs["bare"]
    assert full.diagnostics.drift and not bare.diagnostics.drift
    for order in ((bare, full), (full, bare)):  # whichever the folder lists first
        root = _arranged(folder, tmp_path, f"{order[0].run_id}-first", *order, runs["bp"],
                         runs["fa"])
        out = tmp_path / f"out-{order[0].run_id}"
        result = export(root, out)
        entry = next(e for e in result.written if e["path"].endswith("results_synthetic.json"))
        assert entry["runs"]["dfa"] == full.run_id
        assert [c["run_id"] for c in entry["left_out"]["dfa"]] == [bare.run_id]
        assert "no end-of-run metrics; no drift" in entry["left_out"]["dfa"][0]["why"]
        assert "dfa.diagnostics" not in entry.get("missing", [])
        dfa = json.loads((out / entry["path"]).read_text())["42"]["dfa"]
        assert dfa["diagnostics"] and dfa["drift"]
        snapshot = next(e for e in result.written if "snapshot_evolution_s42" in e["path"])
        assert snapshot["runs"]["dfa_log"] == full.run_id  # the same run in every file
        assert manifest(out)["written"] == result.written
        assert f"dfa: left out {bare.run_id}: a copy of the run of {full.run_id}" \
            in result.format()


def test_a_run_without_its_end_of_run_block_makes_its_results_file_partial(copies, tmp_path):
    folder, runs = copies
    root = tmp_path / "runs"
    for key in ("bp", "bare"):
        shutil.copytree(folder / runs[key].run_id, root / runs[key].run_id)
    result = export(root, tmp_path / "out")
    entry = next(e for e in result.written if e["path"].endswith("results_synthetic.json"))
    assert entry["runs"]["dfa"] == runs["bare"].run_id
    assert {"dfa.diagnostics", "dfa.drift"} <= set(entry["missing"])
    assert "bp.diagnostics" not in entry["missing"]
    assert f"{runs['bare'].run_id} was trained with diagnostics.end_of_run=false" \
        in entry["needs"]
    assert "dfa.diagnostics, dfa.drift" in result.format()


def test_diverged_runs_are_named_in_the_manifest_and_the_output(copies, tmp_path):
    folder, runs = copies
    record = runs["diverged"]
    assert record.status == "diverged"
    root = tmp_path / "runs"
    shutil.copytree(folder / record.run_id, root / record.run_id)
    result = export(root, tmp_path / "out")
    note = f"{record.run_id} diverged in epoch 2; its last finite epoch is 1"
    entries = [e for e in manifest(tmp_path / "out")["written"] if e["runs"]]
    assert entries and all(e["diverged"] == dict.fromkeys(e["runs"], note) for e in entries)
    assert f"dfa_log: {note}" in result.format()


def test_a_run_that_stopped_early_is_named_in_the_manifest_and_the_output(copies, tmp_path):
    """A completed run whose log stops before its optim.epochs (--stop-on-walkback, a
    Recorder finished early) filled the files as if it were a whole run's: the manifest and
    the output name it, in the report's words."""
    from creditaudit.records import save_record
    from creditaudit.run.results import final_results

    folder, runs = copies
    record = load_record(folder / runs["full"].run_id)
    record.stopped_early = {"epoch": 1, "reason": "protocol verdict needs walk-back: (a)"}
    record.log = [entry for entry in record.log if entry.epoch <= 1]
    record.final = final_results(record.log)  # of its last epoch, as a stopped run's is
    save_record(tmp_path / "runs" / record.run_id, record)
    result = export(tmp_path / "runs", tmp_path / "out")
    note = (f"{record.run_id} stopped early at epoch 1: protocol verdict needs walk-back: "
            "(a)")
    entries = [e for e in manifest(tmp_path / "out")["written"] if e["runs"]]
    assert entries and all(e["stopped_early"] == dict.fromkeys(e["runs"], note)
                           for e in entries)
    assert "diverged" not in entries[0]
    assert f"dfa_log: {note}" in result.format()


@pytest.mark.parametrize("dataset", ["mnist1d", "fashion-mnist"])
def test_the_advice_for_a_missing_vit_file_is_a_command_that_trains_it_or_says_none(
        tmp_path, dataset):
    """``export --dataset mnist1d`` advised ``experiment temporal --dataset mnist1d`` for the
    ViT-Mini files, which trains no ViT there (MNIST-1D's signals hold no images). Advice
    names a command only where that command plans the runs; otherwise it says none does."""
    from creditaudit.study.experiments import get_experiment

    (tmp_path / "runs").mkdir()
    result = export(tmp_path / "runs", tmp_path / "out", dataset=dataset)
    needs = [e["needs"] for e in result.skipped if "snapshot_vit_v1" in e["path"]]
    assert needs
    plans_vit = any(c.model.arch == "vit" for c in get_experiment("temporal").configs(
        "smoke", dataset=dataset, out_dir=tmp_path / "plan"))
    advice = f"creditaudit experiment temporal --dataset {dataset}"
    for text in needs:
        assert (advice in text) == plans_vit, text
        assert ("no experiment trains it" in text) == (not plans_vit), text
    assert plans_vit == (dataset == "fashion-mnist")


def _files(out):
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def test_an_export_into_a_folder_of_an_earlier_one_leaves_only_its_own_files(copies, tmp_path,
                                                                                capsys):
    """A second export into OUT left the first one's files that it did not write beside its
    own, under a manifest that did not list them: the figure scripts read a mix of two
    exports. Now those files go (and the output says so); other files in OUT stay, and an
    export into a used OUT is byte-identical to one into an empty folder."""
    folder, runs = copies
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    export(folder, out)
    assert (out / "results/snapshot_evolution_v2/snapshot_evolution_s7.json").is_file()
    (out / "results" / "notes.txt").write_text("mine\n")
    only_bp = tmp_path / "only_bp"
    shutil.copytree(folder / runs["bp"].run_id, only_bp / runs["bp"].run_id)
    assert main(["export", str(only_bp), str(out)]) == 0
    printed = capsys.readouterr().out
    assert "removed results/snapshot_evolution_v2/snapshot_evolution_s7.json" in printed
    listed = {e["path"] for e in manifest(out)["written"]}
    assert set(_files(out)) == listed | {MANIFEST_FILE, "results/notes.txt"}
    assert not (out / "results" / "synthetic_seed7").exists()  # emptied folders go too
    export(only_bp, fresh)
    assert {k: v for k, v in _files(out).items() if k != "results/notes.txt"} == {
        k: v.replace(str(fresh).encode(), str(out).encode()) for k, v in _files(fresh).items()}
    before = _files(out)
    export(only_bp, out)  # the same export again: the same bytes
    assert _files(out) == before


def test_a_diverged_runs_end_of_run_block_without_metrics_is_missing(copies, tmp_path):
    """A diverged model's end-of-run block holds only why it has no metrics
    (``credit_quality_error``) and its drift: the results file's ``dfa.diagnostics`` was
    that one string, and the manifest did not list it as missing. Now it does, with why."""
    from creditaudit.records import save_record
    from creditaudit.records.run_parts import EndOfRun

    folder, runs = copies
    record = load_record(folder / runs["full"].run_id)
    error = "parameter embed.weight holds NaN/Inf: credit-quality metrics are undefined"
    record.diagnostics = EndOfRun(drift=record.diagnostics.drift, credit_quality_error=error)
    save_record(tmp_path / "runs" / record.run_id, record)
    shutil.copytree(folder / runs["bp"].run_id, tmp_path / "runs" / runs["bp"].run_id)
    result = export(tmp_path / "runs", tmp_path / "out")
    entry = next(e for e in result.written if e["path"].endswith("results_synthetic.json"))
    assert entry["missing"] == ["state_bridge", "credit_bridge", "dfa.diagnostics"]
    assert f"{record.run_id} measured none: {error}" in entry["needs"]
    assert "end_of_run=false" not in entry["needs"]


def test_epochs_without_diagnostics_are_named_in_the_manifest(tmp_path, single_thread):
    """A run measured every 3rd epoch filled the snapshot files with entries holding no
    ``hidden_norms`` (as recorded: never 0 or NaN), unmarked, so the original scripts failed
    on a KeyError with no word why. The manifest and the output now name those epochs."""
    from creditaudit.config import RunConfig
    from creditaudit.run.trainer import train

    config = RunConfig().replace(**{**TINY, "method.name": "dfa", "optim.epochs": 3,
                                    "diagnostics.every": 3, "diagnostics.protocol_every": 3,
                                    "run.out_dir": str(tmp_path / "runs")})
    record = train(config).record
    result = export(tmp_path / "runs", tmp_path / "out")
    note = (f"{record.run_id} has no diagnostics at epochs 1, 2 (diagnostics.every=3): those "
            "entries hold no hidden_norms")
    snapshot = load(tmp_path / "out", "snapshot_evolution_v2/snapshot_evolution_s42.json")
    assert ["hidden_norms" in e for e in snapshot["dfa_log"]] == [True, False, False, True]
    entries = {e["path"].split("/")[1]: e for e in manifest(tmp_path / "out")["written"]}
    assert entries["snapshot_evolution_v2"]["unmeasured"]["dfa_log"].startswith(note)
    assert entries["dfa_residual_penalty"]["unmeasured"]["log"].startswith(note)
    assert "unmeasured" not in entries["synthetic"]  # its log lists hold no measures
    assert f"dfa_log: {note}" in result.format()


def test_a_legacy_diverged_record_is_not_said_to_end_on_a_finite_epoch(copies, tmp_path):
    """A diverged run's record written before final.from_epoch (schema 1–3) holds the
    numbers of the epoch that overflowed: the note says so, not that epoch 2 was finite."""
    from creditaudit.files import strict_json
    from creditaudit.records.copies import final_from_entry

    folder, runs = copies
    record = load_record(folder / runs["diverged"].run_id)
    assert record.final.from_epoch == 1
    legacy = record.to_dict()
    legacy["schema"] = "creditaudit.run/3"
    legacy["final"] = final_from_entry(record.log[-1], 2).to_dict()
    run_dir = tmp_path / "runs" / record.run_id
    run_dir.mkdir(parents=True)
    (run_dir / RECORD_FILE).write_text(strict_json.dumps(legacy))
    assert load_record(run_dir).numbers_epoch == 2
    result = export(tmp_path / "runs", tmp_path / "out")
    note = (f"{record.run_id} diverged in epoch 2; its numbers are of epoch 2, whose "
            "evaluation was not finite")
    entries = [e for e in manifest(tmp_path / "out")["written"] if e["runs"]]
    assert entries and all(v.startswith(note) for e in entries for v in e["diverged"].values())
    assert "its last finite epoch is 2" not in result.format()


def test_runs_no_file_can_hold_are_listed_with_why(tmp_path, capsys, single_thread):
    """Own-loop Recorder runs of creditaudit's own ResidualMLP wrote 0 files, and every
    skipped file advised `creditaudit experiment audit_table` without a word on why the runs
    present did not count: each is now listed, in the output and the manifest, with why."""
    import torch

    from creditaudit import Recorder, rule
    from creditaudit.models import ResidualMLP

    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    y = torch.arange(64) % 4
    for method in ("bp", "dfa"):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            network = ResidualMLP(8, 16, 4, 2)
        with Recorder(rule(method, network), x, y, out=tmp_path / "runs", progress=False,
                      config={"optim.epochs": 1, "diagnostics.end_of_run": False}) as rec:
            rec.epoch(0)
            rec.epoch(1)
    assert main(["export", str(tmp_path / "runs"), str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    entries = manifest(tmp_path / "out")["not_exported"]
    assert not manifest(tmp_path / "out")["written"] and len(entries) == 2
    own_loop = "trained in its own loop (creditaudit.Recorder), its network ResidualMLP"
    for entry in entries:
        assert entry["reason"].startswith(own_loop)
        assert entry["reason"].endswith("the original study's layout holds only runs "
                                        "creditaudit trained itself (creditaudit train or "
                                        "experiment) of bp, dfa, fa or the bridges on "
                                        "ResidualMLP (with or without "
                                        "out_ln), ViT-Mini or StudentNet, with a residual "
                                        "stream, every block trainable, real labels, "
                                        "the rule's default options and feedback drawn "
                                        "from the run seed")
        assert f"  not exported {entry['run_id']}: {entry['reason']}" in printed
    [dfa] = [e for e in entries if e["run_id"].startswith("dfa-")]
    assert "; feedback drawn from method.feedback_seed=0, not the run seed:" in dfa["reason"]
    assert printed.startswith("read 2 finished run records (0 of them of the layout's kind)")


def test_a_run_of_a_rule_the_layout_has_no_file_of_is_listed_with_why(copies, tmp_path,
                                                                       capsys):
    """An EP run (or a plugin rule's, or frozen's) fills no file of the layout, and the
    export said nothing of it: 'read 0 finished run records; wrote 0 file(s)'. It is now
    listed under not_exported, and the first line counts it as read."""
    from creditaudit.config import RunConfig
    from creditaudit.run.trainer import train

    root = tmp_path / "runs"
    ep = train(RunConfig().replace(**{**TINY, "method.name": "ep", "optim.epochs": 1,
                                      "run.out_dir": str(root)})).record
    capsys.readouterr()
    assert main(["export", str(root), str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    [listed] = manifest(tmp_path / "out")["not_exported"]
    assert listed["run_id"] == ep.run_id
    assert listed["reason"].startswith("rule ep, which has no file in the layout (it holds "
                                       "bp, dfa, fa, state-bridge, credit-bridge): ")
    assert printed.startswith("read 1 finished run record (0 of them of the layout's kind)")


def test_the_advice_for_data_no_installed_dataset_loads_names_no_command(copies, tmp_path):
    """``export --dataset teacher-student`` of a folder with a Recorder run on data its loop
    named so advised ``creditaudit experiment audit_table --dataset teacher-student``, which
    refuses the name (no such dataset): the advice says no experiment trains it."""
    from creditaudit.records import save_record

    folder, runs = copies
    record = load_record(folder / runs["full"].run_id)
    record.config.data.name = "teacher-student"  # as a Recorder's data="teacher-student"
    save_record(tmp_path / "runs" / record.run_id, record)
    result = export(tmp_path / "runs", tmp_path / "out", dataset="teacher-student")
    needs = [e["needs"] for e in (*result.skipped, *result.written)
             if "results_teacher-student" in e["path"] and e.get("needs")]
    assert needs
    for text in needs:
        assert "--dataset teacher-student" not in text, text
        assert "no experiment trains it: teacher-student is no dataset installed here" in text


def test_a_run_of_other_rule_options_fills_no_file(copies, tmp_path):
    """A DFA run with method.feedback_scale=100 (an ablation) of the recipe, seed and λ of
    the default DFA run filled the study's dfa_log and dfa keys in its place (the smaller
    run id), the default run listed as 'a copy of the run of' it that 'fills as much': the
    original files name a run by rule and seed alone, and its scripts read the rule as the
    study trained it. Such a run now fills no file and is listed with why."""
    from creditaudit.config import RunConfig
    from creditaudit.run.trainer import train

    folder, runs = copies
    root = tmp_path / "runs"
    for key in ("bp", "full"):
        shutil.copytree(folder / runs[key].run_id, root / runs[key].run_id)
    scaled = train(RunConfig().replace(**{**TINY, "method.name": "dfa",
                                          "method.feedback_scale": 100.0,
                                          "run.out_dir": str(root)})).record
    assert scaled.recipe_key == runs["full"].recipe_key and scaled.seed == runs["full"].seed
    result = export(root, tmp_path / "out")
    for entry in result.written:
        assert scaled.run_id not in entry["runs"].values()
        assert "left_out" not in entry
    snapshot = next(e for e in result.written if "snapshot_evolution_s42" in e["path"])
    assert snapshot["runs"]["dfa_log"] == runs["full"].run_id
    [listed] = manifest(tmp_path / "out")["not_exported"]
    assert listed["run_id"] == scaled.run_id
    assert listed["reason"].startswith("rule options other than its defaults "
                                       "(method.feedback_scale=100.0 where the default is "
                                       "1.0): ")


def test_a_run_no_file_took_is_listed_with_why(copies, tmp_path, capsys):
    """A DFA run of another recipe (1 epoch) beside the copies' family, and a BP run with a
    penalty, were read ('of the layout's kind') but neither filled a file nor was named in
    the output or the manifest: the researcher saw 'skipped …: needs …' for runs they had.
    Each is now listed under not_exported with why."""
    from creditaudit.config import RunConfig
    from creditaudit.run.trainer import train

    folder, runs = copies
    root = tmp_path / "runs"
    for key in ("bp", "fa", "full"):
        shutil.copytree(folder / runs[key].run_id, root / runs[key].run_id)
    longer = train(RunConfig().replace(**{**TINY, "method.name": "dfa", "optim.epochs": 1,
                                          "diagnostics.end_of_run": False,
                                          "run.out_dir": str(root)})).record
    penalised = train(RunConfig().replace(**{**TINY, "method.name": "bp", "method.penalty": 0.01,
                                             "diagnostics.end_of_run": False,
                                             "run.out_dir": str(root)})).record
    capsys.readouterr()
    assert main(["export", str(root), str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    listed = {e["run_id"]: e["reason"] for e in manifest(tmp_path / "out")["not_exported"]}
    assert set(listed) == {longer.run_id, penalised.run_id}
    assert listed[longer.run_id].startswith(
        f"of another recipe than {runs['full'].run_id} (optim.epochs: 1 vs 2), whose family "
        "fills the files it could fill")
    assert listed[penalised.run_id].startswith("no file of the layout holds bp with λ=0.01 on "
                                               "resmlp")
    for run_id, reason in listed.items():
        assert f"  not exported {run_id}: {reason}" in printed


def test_a_run_that_did_not_finish_is_named_not_dropped(copies, tmp_path, capsys):
    """A run that failed (or was interrupted, or still runs) was left out of every count and
    list: 'read 0 finished run records; wrote 0 file(s)' and every file 'skipped: needs …',
    not a word of the run the folder held. It is now listed, in the output and under the
    manifest's unfinished, with its status and how far it got."""
    import torch

    from creditaudit import Recorder, rule
    from creditaudit.models import ResidualMLP

    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    y = torch.arange(64) % 4
    network = ResidualMLP(8, 16, 4, 2)
    with pytest.raises(RuntimeError, match="loop broke"), \
            Recorder(rule("dfa", network), x, y, out=tmp_path / "runs", progress=False,
                     config={"optim.epochs": 3, "diagnostics.end_of_run": False}) as rec:
        rec.epoch(0)
        rec.epoch(1)
        raise RuntimeError("loop broke")
    [run_dir] = (tmp_path / "runs").iterdir()
    failed = load_record(run_dir)
    assert failed.status == "failed"
    assert main(["export", str(tmp_path / "runs"), str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert manifest(tmp_path / "out")["unfinished"] == [
        {"run_id": failed.run_id, "status": "failed", "epochs": "1 of 3"}]
    assert (f"  not finished {failed.run_id}: failed (1 of 3 epochs done): only a completed "
            "or diverged run fills a file; export again once it has finished") in printed


def test_an_unreadable_record_is_named_once(copies, tmp_path, capsys, caplog, plant):
    """A broken record.json in a sweep folder was named twice by `creditaudit export`: in
    the readers' warning and again (its path twice over) in the printed list. Now the
    warning names it, with why; the output counts it and the manifest lists it."""
    folder = tmp_path / "sweep"
    shutil.copytree(copies[0], folder)
    broken = sorted(folder.glob(f"*/{RECORD_FILE}"))[0]
    plant(broken, '{"broken')
    with caplog.at_level("WARNING"):
        assert main(["export", str(folder), str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    said = [r.getMessage() for r in caplog.records] + [captured.out, captured.err]
    assert sum(text.count(str(broken)) for text in said) == 1, said
    assert "is truncated or not JSON" in " ".join(said)
    assert "left out 1 unreadable record (named in the warnings above" in captured.out
    assert [str(broken) in entry for entry in manifest(tmp_path / "out")["unreadable"]] == [True]
