"""Every run path checks the reference gradient when it starts: ``train`` (``--arch module:``
factories included), resume and the :class:`creditaudit.Recorder` refuse a model whose
backward is not the gradient of its forward (a BioTorch-converted network, a
``torch.autograd.Function`` whose backward doubles the gradient) in one line naming the
module, before any file is written; with the opt-in they record where the check failed, and
every output — record, audit, report, figures' data, export — shows the run unverified and
every cosine, Γ and (b) marked. A healthy run records how its reference was verified and
trains the same weights as without the check; records written before the check existed read
as not checked. The guests are tests/guest_pkg/creditaudit_guests/ref_factories.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from creditaudit import Recorder, RunConfig, adapt, load_record, rule
from creditaudit.cli import main
from creditaudit.errors import RunRecordError
from creditaudit.figures.audit_panels import panel_points
from creditaudit.formatting import markdown_text
from creditaudit.measures.reference_check import ReferenceGradientError
from creditaudit.protocol import UNVERIFIED, UNVERIFIED_MARK
from creditaudit.records import CHECKPOINT_FILE, ReferenceState, comparable, load_checkpoint
from creditaudit.records.checkpoint import atomic_torch_save
from creditaudit.report import render
from creditaudit.results import RunIndex
from creditaudit.run.trainer import Trainer, train
from integrity_support import as_written
from plugin_support import GUESTS

pytestmark = pytest.mark.usefixtures("single_thread")

# Tiny runs on the generated teacher–student task: 16 inputs, one epoch, no end-of-run block.
TINY = {"data.name": "synthetic", "data.in_dim": 16, "data.n_train": 256, "data.n_test": 256,
        "diagnostics.eval_samples": 256, "diagnostics.end_of_run": False, "optim.epochs": 1,
        "optim.batch_size": 64, "run.progress": False}
FACTORY = "creditaudit_guests.ref_factories"
# (factory, its states, the module the refusal names, the opening words of the refusal)
GUEST_MODELS = {
    "biotorch": ("biotorch_fa", ["module.embed", "module.res"], "net.module.head",
                 "BioTorch fa layer `net.module.head` replaces the backward"),
    "doubled": ("doubled_backward", ["embed", "res"], "net.res.f.2",
                "the backward of module `net.res.f.2` (Doubled) is not the gradient"),
}


@pytest.fixture
def guests(monkeypatch):
    """The guest package importable (as on PYTHONPATH), forgotten afterwards."""
    monkeypatch.syspath_prepend(str(GUESTS.folder))
    yield
    GUESTS.forget()


def needs_biotorch(name: str) -> None:
    if name == "biotorch" and not os.environ.get("CI"):  # CI must run it, never skip it
        pytest.importorskip("biotorch.module.biomodule")


def guest_config(name: str, out: Path, **overrides) -> RunConfig:
    factory, states, _, _ = GUEST_MODELS[name]
    return RunConfig().replace(**{**TINY, "model.arch": "module",
                                  "model.factory": f"{FACTORY}:{factory}",
                                  "model.states": states, "run.out_dir": str(out),
                                  **overrides})


def cli_train(name: str, out: Path, *extra: str) -> list[str]:
    factory, states, _, _ = GUEST_MODELS[name]
    return ["train", "--arch", f"module:{FACTORY}:{factory}", "--dataset", "synthetic",
            "--set", f"model.states={json.dumps(states)}", "--out", str(out), "-q",
            *(f"--set={k}={json.dumps(v)}" for k, v in TINY.items()
              if k not in ("data.name", "run.progress")), *extra]


# --- refused -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", GUEST_MODELS)
def test_train_refuses_a_backward_that_is_not_the_gradient_in_one_line(name, guests, tmp_path,
                                                                       capsys):
    needs_biotorch(name)
    assert main(cli_train(name, tmp_path)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"creditaudit: error: {GUEST_MODELS[name][3]}"), err
    assert err.endswith("set diagnostics.allow_unverified_reference = true "
                        "(--allow-unverified-reference) to train it with every cosine, Γ and "
                        "(b) marked unverified"), err
    assert not list(tmp_path.iterdir())  # refused before the run's folder was written


@pytest.mark.parametrize("name", GUEST_MODELS)
def test_the_recorder_refuses_it_too(name, guests, tmp_path):
    needs_biotorch(name)
    factory, states, where, opening = GUEST_MODELS[name]
    net = getattr(__import__(FACTORY, fromlist=[factory]), factory)()
    model = adapt(net, states, input_shape=(16,))
    x, y = torch.randn(64, 16), torch.randint(0, 10, (64,))
    with pytest.raises(ReferenceGradientError) as error:
        Recorder(rule("dfa", model), x, y, out=tmp_path, name="r")
    message = str(error.value)
    assert message.startswith(opening) and "\n" not in message and error.value.where == where
    assert message.endswith("pass Recorder(..., allow_unverified_reference=True) to record it "
                            "with every cosine, Γ and (b) marked unverified")
    assert not list(tmp_path.iterdir())
    # allowed: the record says where the check failed, and the verdict says unverified
    rec = Recorder(rule("dfa", model), x, y, out=tmp_path, name="r",
                   allow_unverified_reference=True)
    rec.epoch(0, test_acc=0.1)
    record = load_record(tmp_path / "r")
    assert record.config.diagnostics.allow_unverified_reference is True
    assert (record.reference.verified, record.reference.how, record.reference.where) == (
        False, "failed", where)
    assert record.reference.detail.startswith(opening)
    rec.epoch(1, test_acc=0.1)
    record = rec.finish()
    assert record.protocol.verdict == UNVERIFIED and record.log[-1].verdict == UNVERIFIED


# --- allowed: every output marks it ---------------------------------------------------------
@pytest.mark.parametrize("name", GUEST_MODELS)
def test_an_allowed_run_is_unverified_in_every_output(name, guests, tmp_path, capsys):
    needs_biotorch(name)
    runs = tmp_path / "runs"
    assert main(cli_train(name, runs, "--allow-unverified-reference")) == 0
    summary = capsys.readouterr().out
    (run_dir,) = runs.iterdir()
    record = load_record(run_dir)
    where = GUEST_MODELS[name][2]
    assert record.reference.how == "failed" and record.reference.where == where
    assert record.protocol.verdict == UNVERIFIED
    line = next(row for row in summary.splitlines() if row.startswith(record.method))
    assert f"{record.deep_cos:+.3f} {UNVERIFIED_MARK}" in line
    assert f"unverified: reference gradient failed its check at `{where}`" in line

    # audit: the run was trained with the opt-in, so its model is audited the same way
    for form in ("text", "md", "latex", "json"):
        assert main(["audit", str(run_dir), "--format", form, "-q", "--no-metrics"]) == 0
        out = capsys.readouterr().out
        if form == "json":
            report = json.loads(out)
            assert report["verdict"] == UNVERIFIED
            assert report["metadata"]["reference_check"]["where"] == where
            continue
        said = f"unverified: reference gradient failed its check at `{where}`"
        assert (markdown_text(said) if form == "md" else said) in out  # md: record text escaped
        assert_marked(out, form)

    # report: the audit table, the template, the HTML colour
    assert main(["report", str(runs), "--out", str(tmp_path / "report")]) == 0
    capsys.readouterr()
    markdown = (tmp_path / "report" / "report.md").read_text()
    row = next(r for r in markdown.splitlines() if r.startswith(f"| {record.run_id} |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    header = next(r for r in markdown.splitlines() if r.startswith("| run |"))
    column = dict(zip([c.strip() for c in header.strip("|").split("|")], cells))
    for key in ("deep cos", "Γ (samples then layers)", "(b)"):
        assert column[key].endswith(UNVERIFIED_MARK), (key, column[key])
    assert column["verdict"].startswith("unverified: reference gradient failed")
    page = (tmp_path / "report" / "report.html").read_text()
    assert '<td class="unverified">unverified: reference gradient failed' in page

    # figures' data: fig6 colours the run unverified and draws (b) hollow
    _, points = panel_points([(r, RunIndex.from_dir(runs).protocol_report(r))
                              for r in RunIndex.from_dir(runs).runs])
    assert {p["kind"] for ps in points.values() for p in ps} == {"unverified"}
    assert all(p["hollow"] for p in points["b"]) and not any(p["hollow"] for p in points["a"])

    # export: the original layout cannot mark a number, so the run fills no file
    assert main(["export", str(runs), str(tmp_path / "export")]) == 0
    capsys.readouterr()
    manifest = json.loads((tmp_path / "export" / "export_manifest.json").read_text())
    assert [u["run_id"] for u in manifest["unverified"]] == [record.run_id]
    assert not any(record.run_id in e["runs"].values() for e in manifest["written"])


def assert_marked(text: str, form: str) -> None:
    """Every cosine, Γ and (b) value of a rendered report carries the mark."""
    lines = text.splitlines()
    if form == "text":
        b = next(line for line in lines if line.strip().startswith("(b)"))
        gamma = next(line for line in lines if line.startswith("Γ:"))
        layers = lines[lines.index(next(x for x in lines if "layer" in x and "cos" in x)) + 1:]
        cos = [line for line in layers if line.strip() and line.strip()[0].isdigit()]
        assert UNVERIFIED_MARK in b and cos and all(UNVERIFIED_MARK in c for c in cos)
        assert gamma.count(UNVERIFIED_MARK) == 4
    elif form == "md":
        b = next(line for line in lines if line.startswith("| (b) |"))
        assert UNVERIFIED_MARK in b
        rows = [line for line in lines if line.startswith("| 0 |") or line.startswith("| 1 |")]
        assert rows and all(UNVERIFIED_MARK in row for row in rows)
        gamma = [line for line in lines if line.startswith(("| layers_then", "| samples_then",
                                                            "| pooled", "| deep_only"))]
        assert len(gamma) == 4 and all(UNVERIFIED_MARK in line for line in gamma)
    else:
        row = next(line for line in lines if line.startswith(("bp", "dfa")))
        cells = row.split(" & ")
        assert cells[3].endswith(UNVERIFIED_MARK) and cells[5].endswith(UNVERIFIED_MARK)


# --- healthy runs ---------------------------------------------------------------------------
def test_a_healthy_run_records_how_and_trains_the_same_weights(tmp_path, monkeypatch):
    """The check changes nothing of training: weights and every recorded number are those
    of the same run with the check taken out."""
    config = RunConfig().replace(**{**TINY, "model.d": 16, "model.n_blocks": 2,
                                    "run.out_dir": str(tmp_path / "a")})
    checked = train(config)
    assert checked.record.reference.verified and checked.record.reference.how == "states"
    assert checked.record.reference.detail.startswith("∂CE/∂h_l agrees with float64")

    import creditaudit.run.trainer as training

    stub = ReferenceState(verified=True, how="states", detail=checked.record.reference.detail)
    monkeypatch.setattr(training, "reference_at_start", lambda *a, **k: stub)
    unchecked = train(config.replace(**{"run.out_dir": str(tmp_path / "b")}))
    for (name, p), q in zip(checked.model.state_dict().items(),
                            unchecked.model.state_dict().values()):
        assert torch.equal(p, q), name
    assert comparable(checked.record) == comparable(unchecked.record)


def test_resume_keeps_a_correct_reference_block(tmp_path, kill_run_at):
    """Killed after epoch 1 and resumed: the same record as the whole run, reference block
    included; a checkpoint written before the check existed gets the check of the model."""
    config = RunConfig().replace(**{**TINY, "model.d": 16, "model.n_blocks": 2,
                                    "optim.epochs": 2})
    whole = train(config.replace(**{"run.out_dir": str(tmp_path / "whole")}))
    cut = config.replace(**{"run.out_dir": str(tmp_path / "cut")})
    kill_run_at(cut, epoch=2)
    run_dir = next((tmp_path / "cut").iterdir())
    path = run_dir / CHECKPOINT_FILE
    state = load_checkpoint(path)
    del state["record"]["reference"]  # as an older version wrote it
    atomic_torch_save(path, state)
    resumed = train(cut, resume=True)
    assert resumed.record.reference == whole.record.reference
    assert resumed.record.reference.verified
    assert comparable(resumed.record) == comparable(whole.record)


def test_resume_refuses_a_model_whose_backward_changed(guests, tmp_path, kill_run_at,
                                                       monkeypatch):
    """Resume re-checks the model as built: the plain factory's run, resumed with a
    doubled backward in its residual block's forward (the same module tree), is refused in
    one line; resumed with the doubled factory in its place (another module tree: an extra
    module) it is refused as another network before any check runs."""
    config = guest_config("doubled", tmp_path, **{"model.factory": f"{FACTORY}:plain",
                                                  "optim.epochs": 2})
    kill_run_at(config, epoch=2)
    import creditaudit_guests.ref_factories as factories

    with monkeypatch.context() as patched:
        patched.setattr(factories, "plain", factories.doubled_backward)
        with pytest.raises(RunRecordError, match="builds another network than the run "
                                                 "trained"):
            train(config, resume=True)
    monkeypatch.setattr(factories.Residual, "forward",
                        lambda self, h: h + factories.DoubledGradient.apply(self.f(h)))
    with pytest.raises(ReferenceGradientError, match="net.res"):
        train(config, resume=True)


def test_stacked_and_swept_runs_check_too(guests, tmp_path, monkeypatch, capsys):
    """A refusal in a stack comes before any run of it writes a file; a sweep records each
    refused run as failed, with the one line, and goes on."""
    from creditaudit.run.stacked import train_stacked

    config = guest_config("doubled", tmp_path / "stack", **{"method.name": "dfa"})
    with pytest.raises(ReferenceGradientError):
        train_stacked([config, config.replace(**{"run.seed": 1})])
    assert not (tmp_path / "stack").exists()
    Trainer(config.replace(**{"diagnostics.allow_unverified_reference": True}))  # allowed

    import tomli_w

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(GUESTS.folder), *filter(None, [os.environ.get("PYTHONPATH")])]))
    base: dict = {}
    for key, value in config.to_dict().items():
        base[key] = {k: v for k, v in value.items() if v is not None}
    base["run"].pop("out_dir")
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(tomli_w.dumps({"base": base, "grid": {"run.seed": [1, 2]}}))
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "swept"), "-q"]) == 1
    capsys.readouterr()
    records = [load_record(d) for d in (tmp_path / "swept").iterdir() if d.is_dir()]
    assert len(records) == 2 and all(r.status == "failed" for r in records)
    assert all(r.error.startswith("ReferenceGradientError: the backward of module "
                                  "`net.res.f.2` (Doubled)") for r in records)
    assert all(not r.reference.verified and "stopped before its model was checked"
               in r.reference.detail for r in records)


# --- old records ----------------------------------------------------------------------------
def strip_reference(run_dir: Path):
    """The run's record as written before the check existed (no ``reference`` block)."""
    raw = json.loads((run_dir / "record.json").read_text())
    del raw["reference"]
    (run_dir / "record.json").write_text(as_written(raw, digest=False))
    return load_record(run_dir)


def test_old_records_of_a_model_from_outside_read_as_not_checked(guests, tmp_path):
    config = guest_config("doubled", tmp_path, **{"model.factory": f"{FACTORY}:plain",
                                                   "diagnostics.frozen_acc": 0.0})
    old = strip_reference(train(config).run_dir)
    assert (old.reference.verified, old.reference.how) == (False, "not checked")
    assert old.reference.detail == ("reference not checked (recorded before creditaudit "
                                    "checked it)")
    report = RunIndex.from_dir(tmp_path).protocol_report(old)
    assert report.judgement.verdict == "incomplete"
    assert report.judgement.text.endswith("; reference not checked (recorded before "
                                          "creditaudit checked it)")
    b = next(line for line in render(report, "text").splitlines()
             if line.strip().startswith("(b)"))
    assert UNVERIFIED_MARK in b


def test_old_records_of_creditaudits_own_models_keep_their_verdict(tmp_path):
    """A record written before the check, of a built-in architecture (its backward is autograd
    through creditaudit's own modules), says so and reads as it did: same verdict, no mark."""
    config = RunConfig().replace(**{**TINY, "model.d": 16, "model.n_blocks": 2,
                                    "diagnostics.frozen_acc": 0.0,
                                    "run.out_dir": str(tmp_path)})
    result = train(config)
    checked = RunIndex.from_dir(tmp_path).protocol_report(load_record(result.run_dir))
    old = strip_reference(result.run_dir)
    assert (old.reference.verified, old.reference.how) == (False, "built-in")
    assert "creditaudit architecture" in old.reference.detail
    report = RunIndex.from_dir(tmp_path).protocol_report(old)
    assert report.judgement.text == checked.judgement.text
    assert UNVERIFIED_MARK not in render(report, "text")


@pytest.mark.parametrize("block,fragment", [
    ([], "reference must be an object, got list"),
    ({"verified": "yes", "how": "states", "detail": ""}, "reference.verified has the wrong"),
    ({"verified": True, "how": "guessed", "detail": ""}, "reference.how 'guessed' is not"),
    ({"verified": True, "how": "failed", "detail": ""}, "contradicts how 'failed'"),
    ({"verified": True, "how": "states", "detail": "", "x": 1}, "unexpected field 'x'"),
])
def test_a_forged_reference_block_is_refused_in_one_line(tmp_path, block, fragment):
    config = RunConfig().replace(**{**TINY, "model.d": 16, "model.n_blocks": 2,
                                    "optim.epochs": 0, "run.out_dir": str(tmp_path)})
    result = train(config)
    raw = json.loads((result.run_dir / "record.json").read_text())
    raw["reference"] = block
    (result.run_dir / "record.json").write_text(json.dumps(raw))
    with pytest.raises(RunRecordError) as error:
        load_record(result.run_dir)
    assert fragment in str(error.value) and "\n" not in str(error.value)


# creditaudit's own factories: every network of its own package that a `module` config names
OWN_FACTORIES = [
    ("creditaudit.study.experiments.literature_nets:lenet_mnist", {}, (1, 28, 28),
     ["pool1", "pool2", "relu3", "relu4"]),
    ("creditaudit.study.experiments.literature_nets:lenet_cifar", {}, (3, 32, 32),
     ["pool1", "pool2", "gap", "relu4"]),
    ("creditaudit.study.experiments.literature_nets:mnist1d_mlp", {"hidden": 12}, (40,),
     ["act1", "block2"]),
    ("creditaudit.study.experiments.literature_nets:mnist1d_cnn", {"channels": 4}, (40,),
     ["relu1", "relu2", "flatten"]),
    ("creditaudit.study.experiments.literature_nets:tanh_mlp", {"widths": [12, 12]}, (784,),
     ["acts.0", "acts.1"]),
    ("creditaudit.testing.zoo:resnet20", {}, (3, 32, 32),
     ["stem", "layer1.0", "layer1.2", "layer2.2", "layer3.2"]),
    ("creditaudit.testing.zoo:TransformerClassifier",
     {"image_shape": [1, 1, 40], "patch": [1, 4], "d": 16, "depth": 2, "heads": 2,
      "mlp_ratio": 2}, (40,), ["encoder.layers.0", "encoder.layers.1"]),
]


@pytest.mark.parametrize("factory,args,shape,states", OWN_FACTORIES,
                         ids=[f[0].rpartition(":")[2] for f in OWN_FACTORIES])
def test_creditaudits_own_factories_pass_the_reference_check(factory, args, shape, states):
    """What lets an old record of a `module` model built by a factory of creditaudit's own
    package keep its verdict (`built-in`): its backward is the gradient of its forward."""
    import pkgutil

    from creditaudit.run.results import reference_at_start

    torch.manual_seed(0)
    net = pkgutil.resolve_name(factory)(**args)
    x = torch.randn(6, *shape)
    model = adapt(net, states, example=x)
    y = torch.randint(0, 10, (6,))
    checked = reference_at_start(model, x, y, allow=False, fix="")
    assert checked.verified, checked


def test_old_records_of_a_factory_of_creditaudits_own_keep_their_verdict(tmp_path):
    """The literature experiment's networks and creditaudit.testing.zoo's reach runs through
    `model.arch = "module"` (here under the pre-0.2 spelling the literature records use); a
    record of one written before the check reads as built-in,
    a user's factory as not checked (test_old_records_of_a_model_from_outside_…)."""
    config = RunConfig().replace(**{**TINY, "data.in_dim": 784, "model.arch": "module",
                                    "model.factory": "creditaudit.experiments.literature_nets:"
                                                     "tanh_mlp",
                                    "model.args": {"widths": [8, 8]},
                                    "model.states": ["acts.0", "acts.1"],
                                    "diagnostics.frozen_acc": 0.0,
                                    "run.out_dir": str(tmp_path)})
    result = train(config)
    checked = RunIndex.from_dir(tmp_path).protocol_report(load_record(result.run_dir))
    old = strip_reference(result.run_dir)
    assert (old.reference.verified, old.reference.how) == (False, "built-in")
    report = RunIndex.from_dir(tmp_path).protocol_report(old)
    assert report.judgement.text == checked.judgement.text
    assert UNVERIFIED_MARK not in render(report, "text")
