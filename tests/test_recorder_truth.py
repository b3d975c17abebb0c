"""A Recorder records what it was told and what it measured, and marks the rest as not
recorded; a dataset it names must be the data it evaluates on; its errors name the
arguments the caller passed.

- a plain AdamW loop with no scheduler, told only the learning rate: the record does not say
  ``optim.schedule: cosine`` or ``weight_decay: 0.01`` (the config's defaults) — it lists them
  under ``not_recorded``, reports print "not recorded", and recipes compare them as unknown;
- a subset told in ``data=`` is recorded; the evaluation set's size is the one measured on;
- ``data={"name": "mnist", …}`` with arrays that are not samples of MNIST's test split is
  refused in one line (they were stamped with the IDX files' fingerprint), rows of it are
  accepted in any order and any normalisation; a class count the dataset contradicts too.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch
from torch import nn

from creditaudit import Recorder, adapt, rule
from creditaudit.audit.checkpoint import frozen_accuracy
from creditaudit.config import RunConfig
from creditaudit.data import load_dataset
from creditaudit.errors import ConfigError, CreditAuditError, DataError
from creditaudit.records import RECORD_FILE, load_record
from creditaudit.records.compare import recipe_difference
from creditaudit.report import format_run_summary
from creditaudit.report.tables import audit_row, run_settings
from creditaudit.results import RunIndex
from integrity_support import as_written, write_idx_dataset

pytestmark = pytest.mark.usefixtures("single_thread")

OFF = {"diagnostics.end_of_run": False}


class Flat(nn.Module):
    """An MLP on flattened 28×28 images: two states and a head."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Flatten(), nn.Linear(784, 16))
        self.b = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.b(self.a(x)))


def bound(example: torch.Tensor, classes: int = 10):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = Flat(classes)
    return rule("dfa", adapt(net, ["a", "b"], example=example))


@pytest.fixture(scope="module")
def mnist(tmp_path_factory):
    """Tiny MNIST-layout IDX files (64 + 32 images) and their test split as loaded."""
    folder = write_idx_dataset(tmp_path_factory.mktemp("idx"))
    config = RunConfig().replace(**{"data.name": "mnist", "data.data_dir": str(folder)})
    return folder, load_dataset(config.data, seed=0)


def random_set(n: int = 32):
    generator = torch.Generator().manual_seed(5)
    return torch.randn(n, 784, generator=generator), torch.randint(0, 10, (n,),
                                                                  generator=generator)


def test_a_plain_loop_records_only_what_it_was_told(tmp_path):
    x, y = random_set()
    with Recorder(bound(x), x, y, out=tmp_path, name="told", data="my-images",
                  config={"optim.lr": 3e-4, **OFF}) as rec:
        rec.epoch(0)
        rec.epoch(1, test_acc=0.5)
    record = load_record(tmp_path / "told")
    unknown = set(record.not_recorded)
    assert {"optim.schedule", "optim.weight_decay", "optim.batch_size", "run.seed",
            "run.precision", "data.train_subset", "data.random_targets"} <= unknown
    assert not unknown & {"optim.lr", "optim.epochs", "data.name", "diagnostics.eval_samples",
                          "method.name", "model.arch"}
    assert record.config.optim.lr == 3e-4 and record.epochs == 1
    assert record.config.diagnostics.eval_samples == 32  # what it measured on, not 1280
    settings = run_settings(record)
    assert settings["optim.schedule"] == settings["optim.weight_decay"] == "not recorded"
    assert settings["optim.lr"] == "0.0003"
    # told the subset and the schedule: recorded
    with Recorder(bound(x), x, y, out=tmp_path, name="subset",
                  data={"name": "my-images", "train_subset": 20000},
                  config={"optim.lr": 3e-4, "optim.schedule": "constant",
                          "optim.weight_decay": 0.0, **OFF}) as rec:
        rec.epoch(1, test_acc=0.5)
    told = load_record(tmp_path / "subset")
    assert told.config.data.train_subset == 20000 and told.config.optim.schedule == "constant"
    assert not {"data.train_subset", "optim.schedule", "optim.weight_decay"} \
        & set(told.not_recorded)
    assert recipe_difference(record, told) is not None  # unknown ≠ told, whatever the value
    # a record without the field (written before it existed) reads as all recorded
    raw = json.loads((tmp_path / "told" / RECORD_FILE).read_text())
    del raw["not_recorded"]
    (tmp_path / "told" / RECORD_FILE).write_text(as_written(raw, digest=False))
    assert load_record(tmp_path / "told").not_recorded == []


def test_a_recorder_refuses_an_evaluation_set_size_it_did_not_measure(tmp_path):
    x, y = random_set()
    with pytest.raises(ConfigError, match="eval_x holds 32 samples"):
        Recorder(bound(x), x, y, out=tmp_path, config={"diagnostics.eval_samples": 1280})


def test_a_recorder_takes_numpy_numbers_and_refuses_a_key_given_twice(tmp_path):
    """``for seed in np.arange(3)``: run.seed=np.int64(0) was refused as "must be an
    integer", and data's train_subset=np.int64(…) too; a key given both nested and dotted
    kept one of the two values silently."""
    import numpy as np

    x, y = random_set()
    rec = Recorder(bound(x), x, y, out=tmp_path, name="np", progress=False,
                   data={"name": "mine", "train_subset": np.int64(24)},
                   config={"run.seed": np.int64(3), "optim": {"lr": np.float32(0.5)}, **OFF})
    assert rec.config.run.seed == 3 and type(rec.config.run.seed) is int
    assert rec.config.optim.lr == 0.5 and rec.config.data.train_subset == 24
    with pytest.raises(ConfigError, match=r"^config gives optim.lr twice \(0.001 and 0.002\): "
                                          r"give it once$"):
        Recorder(bound(x), x, y, out=tmp_path, name="twice", progress=False,
                 config={"optim": {"lr": 1e-3}, "optim.lr": 2e-3})
    assert not (tmp_path / "twice").exists()


@pytest.mark.parametrize(("config", "fix"), [
    ({"run.device": "cuda"}, "environment.device"),
    ({"run": {"threads": 7}}, "environment.torch_threads"),
    ({"run.device_data": "on"}, "your loop decides it"),
    ({"run.cuda_graphs": "off"}, "your loop decides it"),
    ({"run.out_dir": "elsewhere"}, "out="),
    ({"run.tensorboard": "tb"}, "your loop decides it"),
])
def test_a_recorder_refuses_run_options_it_does_not_apply(tmp_path, config, fix):
    """Where and how the loop ran is the loop's: the Recorder recorded run.device='cuda'
    beside a CPU model, run.threads=7 for a loop on 1 thread, an out_dir it did not write
    to, in one line each instead of claiming them."""
    x, y = random_set()
    key = next(iter(config)) if "." in next(iter(config)) else "run.threads"
    with pytest.raises(ConfigError, match=f"config sets {key}, which a Recorder does not "
                       "apply") as err:
        Recorder(bound(x), x, y, out=tmp_path, config={**OFF, **config})
    assert fix in str(err.value) and "\n" not in str(err.value)
    assert not any(tmp_path.iterdir())  # nothing written
    # what it applies is kept: the seed, the precision, the end-of-run memory
    rec = Recorder(bound(x), x, y, out=tmp_path, name="kept", progress=False, config={
        **OFF, "run.seed": 3, "diagnostics.end_of_run_memory_gb": 0.5})
    assert rec.config.run.seed == 3 and rec.config.diagnostics.end_of_run_memory_gb == 0.5


def test_a_named_dataset_must_be_the_data_evaluated_on(mnist, tmp_path):
    folder, data = mnist
    named = {"name": "mnist", "data_dir": str(folder)}
    x, y = random_set()
    with pytest.raises(DataError) as error:
        Recorder(bound(x), x, y, out=tmp_path, name="unrelated", data=named, config=OFF)
    assert "are no sample of its test split" in str(error.value)
    assert "\n" not in str(error.value) and not (tmp_path / "unrelated").exists()
    # rows of the test split: any order, any subset, the dataset's or another normalisation
    order = torch.randperm(32, generator=torch.Generator().manual_seed(1))[:24]
    ready = data.prepare(data.test_x[order], flatten=True)
    plain = (data.test_x[order].float() / 255.0).flatten(1)
    for name, rows in (("normalised", ready), ("scaled", plain), ("images", ready.view(-1, 1,
                                                                                       28, 28))):
        rec = Recorder(bound(rows), rows, data.test_y[order], out=tmp_path, name=name,
                       data=named, config=OFF)
        checked = rec.record.data.provenance["evaluation_arrays"]
        assert "rows of the MNIST test split" in checked["checked"]
    # one label changed: not that sample any more
    labels = data.test_y[order].clone()
    labels[3] = (labels[3] + 1) % 10
    with pytest.raises(DataError, match="1 of 24 evaluation samples \\(e.g. row 3\\)"):
        Recorder(bound(ready), ready, labels, out=tmp_path, name="relabelled", data=named)
    # a model whose class count the dataset contradicts
    with pytest.raises(ConfigError, match="12 logits, but MNIST has 10 classes"):
        Recorder(bound(ready, classes=12), ready, data.test_y[order], out=tmp_path,
                 name="classes", data=named)


@pytest.mark.parametrize(("data", "config", "fragment", "absent"), [
    ("fashion-mnist", None, "data['data_dir']", "--data-dir"),
    ({"name": "synthetic", "in_dim": "x"}, None, "data['in_dim'] must be an integer", "data."),
    ({"name": "synthetic", "nope": 1}, None, "unknown key data['nope']", "data."),
    ({"name": "my-images", "train_subset": 0}, None, "data['train_subset']=0 is out of range",
     "data."),
    ("my-images", {"data.train_subset": 100},
     "config sets data.train_subset: give it in data=, e.g. data={'name': …, "
     "'train_subset': …}", "--"),
], ids=["no data folder", "bad option", "unknown option", "bad subset", "subset in config"])
def test_errors_name_the_arguments_the_caller_passed(tmp_path, data, config, fragment, absent):
    x, y = random_set()
    with pytest.raises(CreditAuditError) as error:
        Recorder(bound(x), x, y, out=tmp_path, name="x", data=data, config=config)
    message = str(error.value)
    assert fragment in message and absent not in message.replace(fragment, ""), message
    assert "\n" not in message


def recorded(out, name: str, method: str, ran: int, epochs: int = 3):
    """A Recorder run of ``method`` whose loop stopped after ``ran`` of ``epochs`` epochs."""
    x, y = random_set()
    bound_rule = bound(x)
    if method != "dfa":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            bound_rule = rule(method, adapt(Flat(), ["a", "b"], example=x))
    with Recorder(bound_rule, x, y, out=out, name=name,
                  config={"optim.epochs": epochs, **OFF}) as rec:
        rec.epoch(0)
        for epoch in range(1, ran + 1):
            rec.epoch(epoch, test_acc=0.1 * epoch)
        return rec.finish()


def test_a_frozen_run_stopped_early_is_no_baseline_and_reports_say_it_stopped(tmp_path,
                                                                            caplog):
    # a frozen run whose loop stopped at epoch 1 of 3: its readout trained a third as long,
    # so it is no baseline of (d) for the full runs of its recipe; the audit table says so
    full = recorded(tmp_path, "dfa-full", "dfa", 3)
    early = recorded(tmp_path, "frozen-early", "frozen", 1)
    assert early.stopped_early and full.recipe_key == early.recipe_key
    index = RunIndex.from_dir(tmp_path)
    assert index.records.frozen_baseline(full) is None
    rows = {row["run"]: row for row in (audit_row(index, run) for run in index.all_runs)}
    assert "(stopped early at epoch 1: finish() after epoch 1 of optim.epochs=3)" \
        in rows["frozen-early"]["acc"]
    assert rows["frozen-early"]["verdict"] == "no baseline of (d): stopped early"
    assert "stopped early" not in rows["dfa-full"]["acc"]
    # the sweep's table says it as the report's does (it said "no frozen baseline of (d)")
    assert "no baseline of (d): stopped early" in format_run_summary([early, full])
    # named as the audit's --frozen, it is taken, with a warning saying it stopped early
    with caplog.at_level(logging.WARNING):
        assert frozen_accuracy(str(tmp_path / "frozen-early"), full) == pytest.approx(0.1)
    assert "stopped early at epoch 1 of optim.epochs=3" in caplog.text
    # the whole frozen run of that recipe is its baseline
    recorded(tmp_path, "frozen-full", "frozen", 3)
    assert RunIndex.from_dir(tmp_path).records.frozen_baseline(full) == (pytest.approx(0.3), 1)


def _off_beat_loop(tmp_path, name: str, accuracies: tuple[float, ...]) -> Recorder:
    """A Recorder loop with ``protocol_every=3`` and no ``optim.epochs`` (frozen 0.10):
    epoch 0 at accuracy 0.1, then one step and one ``epoch()`` per accuracy; finished."""
    x, y = random_set()
    bound_rule = bound(x)
    optimizer = torch.optim.SGD(bound_rule.trainable_parameters(), lr=1e-3)
    config = {"diagnostics.protocol_every": 3, "diagnostics.frozen_acc": 0.1, **OFF}
    with Recorder(bound_rule, x, y, out=tmp_path, name=name, config=config) as rec:
        rec.epoch(0, test_acc=0.1)
        for epoch, acc in enumerate(accuracies, start=1):
            bound_rule.train_step(x, y, optimizer)
            rec.epoch(epoch, test_acc=acc)
            if epoch == len(accuracies) and epoch % 3:
                assert rec.record.log[-1].verdict is None  # not the protocol's epoch
    return rec


def test_a_loop_ending_off_the_protocol_beat_is_judged_at_its_last_epoch(tmp_path):
    """``protocol_every=3`` and no ``optim.epochs``: the loop's 4th epoch, its last, was
    never judged, and the record's verdict — (d) passed on epoch 3's accuracy 0.30 against
    the frozen 0.10 — stood beside the run's final accuracy 0.05 (−5 pp): "no walk-back"."""
    rec = _off_beat_loop(tmp_path, "off-beat", (0.3, 0.3, 0.3, 0.05))
    assert rec.record.log[-1].verdict is not None  # judged by finish(), not by epoch(4)
    record = load_record(tmp_path / "off-beat")
    assert [e.epoch for e in record.log if e.verdict is not None] == [3, 4]
    assert record.protocol.epoch == 4 and record.final_acc == 0.05
    assert record.log[-1].protocol["d"] == "fired" and record.protocol.fired == ["d"]


def test_an_off_beat_epochs_kept_gradients_go_before_the_next_epoch_is_measured(
        tmp_path, monkeypatch):
    """The state gradients an off-beat epoch keeps for finish() (its N×d per-sample
    gradients of every state) were still held while the next epoch measured its own: two
    sets at once, twice the peak memory the measurement needs, on a GPU the loop shares."""
    import gc
    import weakref

    from creditaudit.run import recorder as recorder_module

    measured = recorder_module.epoch_diagnostics
    taken: list[weakref.ref] = []
    alive_while_measuring: list[int] = []

    def watched(*args, **kwargs):
        gc.collect()
        alive_while_measuring.append(sum(ref() is not None for ref in taken))
        measures, sg = measured(*args, **kwargs)
        taken.append(weakref.ref(sg))
        return measures, sg

    monkeypatch.setattr(recorder_module, "epoch_diagnostics", watched)
    _off_beat_loop(tmp_path, "kept", (0.3, 0.3, 0.3, 0.3))
    assert alive_while_measuring == [0] * 5
    # and the last, off-beat epoch is still judged by finish()
    record = load_record(tmp_path / "kept")
    assert [e.epoch for e in record.log if e.verdict is not None] == [3, 4]


def test_an_eval_set_left_requiring_grad_is_recorded_as_data_without_a_warning(tmp_path):
    """Recorder(rule, x.requires_grad_(), y) printed torch's "Converting a tensor with
    requires_grad=True to a scalar" warning from the reference check (once per process,
    so in a process of its own here), and records what the same data not requiring grad
    gives."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import json, torch
        from torch import nn
        from creditaudit import Recorder, adapt, rule
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                            nn.Linear(8, 3))
        x, y = torch.randn(32, 6), torch.arange(32) % 3
        dfa = rule("dfa", adapt(net, ["1", "3"], example=x[:4]))
        records = []
        for name, eval_x in (("plain", x), ("asked", x.clone().requires_grad_())):
            rec = Recorder(dfa, eval_x, y, out={str(tmp_path)!r}, name=name, progress=False,
                           config={{"diagnostics.end_of_run": False}})
            rec.epoch(0)
            records.append(rec.finish().to_dict())
        a, b = (dict(r, config=None, run_id=None, environment=None, content_sha256=None)
                for r in records)
        for r in (a, b):  # what differs by name and wall clock
            r["created"] = r["updated"] = r["protocol"]["report"]["metadata"]["run_id"] = None
            for entry in r["log"]:
                entry["seconds"] = None
        print(json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
    assert "requires_grad" not in done.stderr, done.stderr
