"""The outside battery (#34): bad inputs on every surface a guest or a user reaches —
plugins (rule, architecture, dataset, diagnostic), ``module`` factories, the Python API
(``adapt``, ``rule``, ``Recorder``, ``diagnose``) and the config/command-line values that
reach guests — each ends in exactly one of three outcomes:

- REFUSED: a CreditAuditError (exit 2) whose message is ONE line, ``creditaudit: error: …``
  on the command line, without a traceback, naming the guest where the fault is the guest's;
- CORRECT: the run completes and its record holds the right numbers (a valid-but-odd input);
- MARKED: the run completes and its record marks what could not be verified (reference
  gradient unverified, a diagnostic not evaluated).

Anything else — "internal error", a traceback, another exit code, a refusal of several
lines, a silent exit 0 whose record claims what it cannot — fails its case. The cases are
one table (:data:`CASES`); the last test counts them per surface and outcome (the counts
printed go into the issue's closing note). Every run is tiny: synthetic or door-mixture
data, d = 16, one epoch, a few hundred samples, end_of_run off. The guests live in
tests/guest_pkg/creditaudit_guests/battery_*.py (and the older door_*/data_* ones).
"""

from __future__ import annotations

import json
import math
import textwrap
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from torch import nn

from creditaudit import Recorder, adapt, diagnose, rule
from creditaudit.cli import main
from creditaudit.errors import CreditAuditError
from creditaudit.protocol import NOT_EVALUATED, UNVERIFIED
from creditaudit.records import RECORD_FILE, load_record
from creditaudit.registry import reload_plugins
from door_support import ORIGIN
from integrity_support import sweep_toml
from plugin_support import GUESTS
from sweep_files import TINY_SWEEP_BASE

pytestmark = pytest.mark.usefixtures("single_thread")

REFUSED, CORRECT, MARKED = "refused", "correct", "marked"
PLUGIN, MODULE, API, CONFIG = "plugin", "module factory", "python api", "config/cli"
BUILT_IN_DIAGNOSTICS = {"a", "b", "c", "d"}

# The tiny run: 256 training samples, one epoch, d = 16, two blocks.
TINY = {"data.n_train": 256, "data.n_test": 128, "model.d": 16, "model.n_blocks": 2,
        "optim.epochs": 1, "optim.batch_size": 64, "diagnostics.eval_samples": 128,
        "diagnostics.end_of_run": False, "diagnostics.frozen_acc": 0.0,
        "run.progress": False}
SYNTHETIC = {"data.name": "synthetic", "data.in_dim": 16}
MIXTURE = {"data.name": "door-mixture"}
FACTORIES = "creditaudit_guests.battery_factories"
MODULE_RUN = {**SYNTHETIC, "model.d": None, "model.n_blocks": None,
              "model.states": ["embed", "b1", "b2"]}


# --- outcomes --------------------------------------------------------------------------------
@dataclass
class Outcome:
    """What one case ended in: ``kind`` (REFUSED, CORRECT, MARKED, or what went wrong),
    the refusal's line, the records a run wrote and what the API returned."""

    kind: str
    line: str = ""
    records: list = field(default_factory=list)
    value: object = None
    stdout: str = ""
    stderr: str = ""
    ctx: object = None  # the case's Ctx (set by the test), for checks that run a twin

    def __str__(self) -> str:
        return f"{self.kind}: {self.line or self.stderr[-1500:]}"


def marks_of(record) -> list[str]:  # noqa: ANN001 - a RunRecord
    """What a record marks unverified: the reference gradient, an unverified verdict, a
    guest's diagnostic not evaluated."""
    marks = []
    if record.reference is not None and record.reference.verified is False:
        marks.append(f"reference {record.reference.how} at {record.reference.where}")
    if record.status == "diverged":
        marks.append("diverged: no accuracy or cosine claimed")
    if record.protocol.verdict == UNVERIFIED:
        marks.append("verdict unverified")
    report = (record.protocol.report if record.protocol else None) or {}
    for name, result in report.get("diagnostics", {}).items():
        if name not in BUILT_IN_DIAGNOSTICS and result["status"] == NOT_EVALUATED:
            marks.append(f"{name} not evaluated")
    return marks


def of_records(records: list, **extra) -> Outcome:
    """A completed command: MARKED when any record marks something, CORRECT otherwise."""
    if not records:
        return Outcome("exit 0 without a record", **extra)
    marked = any(marks_of(r) for r in records)
    return Outcome(MARKED if marked else CORRECT, records=records, **extra)


def of_command(rc: int, out: str, err: str, where: Path) -> Outcome:
    lines = err.strip().splitlines()
    if "Traceback" in out + err:
        return Outcome("traceback", stdout=out, stderr=err)
    if "internal error" in err:
        return Outcome("internal error", line=lines[-1], stdout=out, stderr=err)
    if rc == 2:
        errors = [line for line in lines if line.startswith("creditaudit: error: ")]
        if len(errors) != 1 or errors[0] != lines[-1]:
            return Outcome("refusal not one line", stdout=out, stderr=err)
        return Outcome(REFUSED, line=lines[-1], stdout=out, stderr=err)
    if rc != 0:
        return Outcome(f"exit {rc}", stdout=out, stderr=err)
    records = [load_record(p.parent) for p in sorted(where.rglob(RECORD_FILE))]
    return of_records(records, stdout=out, stderr=err)


def of_call(call: Callable[[], object]) -> Outcome:
    """The Python API: a one-line CreditAuditError is REFUSED; a returned record or report
    is judged by its marks; a returned object of another kind is CORRECT (the case's own
    check says whether it is right)."""
    try:
        value = call()
    except CreditAuditError as err:
        text = str(err)
        return Outcome(REFUSED if "\n" not in text else "refusal not one line", line=text)
    except Exception as err:  # noqa: BLE001 - any other exception is the failure observed
        return Outcome(f"raised {type(err).__name__}", line=str(err)[:500])
    if hasattr(value, "reference") and hasattr(value, "protocol"):
        return of_records([value], value=value)
    if hasattr(value, "verdict") and hasattr(value, "reference"):
        reference = value.reference or {}
        undefined = [c for c in value.to_dict()["layer_cosines"] or [] if not c["defined"]]
        marked = (value.verdict == UNVERIFIED or reference.get("verified") is False
                  or bool(undefined))
        return Outcome(MARKED if marked else CORRECT, value=value)
    return Outcome(CORRECT, value=value)


# --- the context each case runs in -------------------------------------------------------------
class Ctx:
    """A case's folder, its installed guests and its captured command line."""

    def __init__(self, tmp_path: Path, capsys, monkeypatch) -> None:  # noqa: ANN001
        self.tmp, self.capsys, self.monkeypatch = tmp_path, capsys, monkeypatch
        self.out = tmp_path / "runs"
        self.site = GUESTS.install(tmp_path / "site", only=[])
        monkeypatch.syspath_prepend(str(self.site))

    def install(self, *names: str) -> None:
        GUESTS.install(self.site, only=names)
        reload_plugins()

    def cli(self, *args: str) -> Outcome:
        self.capsys.readouterr()
        rc = main([str(a) for a in args])
        out, err = self.capsys.readouterr()
        return of_command(rc, out, err, self.out)


def flags(ctx: Ctx, settings: dict) -> list[str]:
    """``--set`` flags of the tiny run with ``settings`` (None drops a key)."""
    values = {**TINY, **settings, "run.out_dir": str(ctx.out)}
    return [item for key, value in values.items() if value is not None
            for item in ("--set", f"{key}={json.dumps(value)}")]


def train(*guests: str, args: tuple = (), **settings: object) -> Callable[[Ctx], Outcome]:
    """A tiny ``creditaudit train`` with ``guests`` installed (dotted keys as settings:
    pass them as a dict with ``**{"a.b": v}``)."""
    def act(ctx: Ctx) -> Outcome:
        ctx.install(*guests)
        return ctx.cli("train", *args, *flags(ctx, settings))
    return act


def plugin(*guests: str, **settings: object) -> Callable[[Ctx], Outcome]:
    """A tiny run on door-mixture with ``guests`` (and door-mixture) installed."""
    return train("door-mixture", *guests, **{**MIXTURE, **settings})


def factory(name: str, *args: str, **settings: object) -> Callable[[Ctx], Outcome]:
    """A tiny run of ``--arch module:creditaudit_guests.battery_factories:NAME``."""
    return train(args=("--arch", f"module:{FACTORIES}:{name}", *args),
                 **{**MODULE_RUN, **settings})


def sweep(body: str, *flags_: str, guests: tuple[str, ...] = (), **base: object
          ) -> Callable[[Ctx], Outcome]:
    """``creditaudit sweep`` of a tiny sweep file ([base] of tests/sweep_files.py with
    ``base``; None drops a key) with door-mixture and ``guests`` installed."""
    def act(ctx: Ctx) -> Outcome:
        ctx.install("door-mixture", *guests)
        keys = {**TINY_SWEEP_BASE, **base, "run.out_dir": str(ctx.out)}
        path = ctx.tmp / "s.toml"
        path.write_text(sweep_toml({k: v for k, v in keys.items() if v is not None},
                                   textwrap.dedent(body)))
        return ctx.cli("sweep", path, *flags_)
    return act


def config_file(text: str, *args: str) -> Callable[[Ctx], Outcome]:
    def act(ctx: Ctx) -> Outcome:
        path = ctx.tmp / "run.toml"
        path.write_text(text.replace("OUT", str(ctx.out)))
        return ctx.cli("train", "--config", path, *args)
    return act


def api(call: Callable[[Ctx], object]) -> Callable[[Ctx], Outcome]:
    def act(ctx: Ctx) -> Outcome:
        return of_call(lambda: call(ctx))
    return act


# --- the Python API's model and data -----------------------------------------------------------
def guest(name: str) -> Callable[..., nn.Module]:
    """A factory of creditaudit_guests.battery_factories (importable inside a case)."""
    module = __import__(FACTORIES, fromlist=[name])
    return getattr(module, name)


def net(name: str = "good") -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return guest(name)()


STATES = ["embed", "b1", "b2"]
X = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))
Y = torch.randint(0, 10, (64,), generator=torch.Generator().manual_seed(2))


def adapted(name: str = "good"):
    return adapt(net(name), STATES, example=X)


def recorder(ctx: Ctx, x=X, y=Y, *, model=None, **kwargs):  # noqa: ANN001, ANN201
    bound = rule("dfa", model if model is not None else adapted())
    return Recorder(bound, x, y, out=ctx.out, **{"name": "run", "progress": False, **kwargs})


def recorded(ctx: Ctx, *accuracies: float, **kwargs):  # noqa: ANN201
    """A Recorder's finished record after one epoch per accuracy."""
    rec = recorder(ctx, **kwargs)
    for epoch, acc in enumerate(accuracies):
        rec.epoch(epoch, test_acc=acc)
    return rec.finish()


def propagates(kind: type[BaseException], call: Callable[[], object]) -> str:
    """``call`` raises ``kind`` itself, raised in the test's own code (its traceback's
    last frame is in this file), not wrapped; returns its ``repr`` with the frame's file."""
    with pytest.raises(kind) as raised:
        call()
    assert raised.type is kind and raised.value.__cause__ is None
    assert raised.traceback[-1].path == Path(__file__), raised.traceback[-1].path
    return f"{Path(raised.traceback[-1].path).name}: {raised.value}"


def nan_like(x: torch.Tensor, value: float = float("nan")) -> torch.Tensor:
    x = x.clone()
    x[3, 2] = value
    return x


# --- the table ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One bad input: its id, surface, expected outcome, what runs it, the fragments its
    refusal must hold (or a check of a completed run's outcome) and, for a bug this battery
    found and src/ does not fix yet, the bug (the case is xfail, strict)."""

    id: str
    surface: str
    expect: str
    act: Callable[[Ctx], Outcome]
    says: tuple[str, ...] = ()
    check: Callable[[Outcome], None] | None = None
    bug: str | None = None


def C(id_: str, surface: str, expect: str, act, *says: str, check=None,  # noqa: ANN001, N802
      bug: str | None = None) -> Case:
    return Case(id_, surface, expect, act, says, check, bug)


def named(noun: str, name: str) -> str:
    """How a refusal names a plugin of creditaudit_guests."""
    return f"{noun} plugin {name!r} ({ORIGIN})"


def talk_on_stderr(words: str, twin: Callable[[Ctx], Outcome]) -> Callable[[Outcome], None]:
    """The guest's words went to stderr (stdout stays the command's own), and the run's
    numbers are those of ``twin``, the same run with a silent guest (or none)."""
    def check(outcome: Outcome) -> None:
        assert words in outcome.stderr and words not in outcome.stdout
        ran_right(outcome)
        same_numbers(outcome, twin)
    return check


def same_numbers(outcome: Outcome, twin: Callable[[Ctx], Outcome]) -> None:
    """``twin`` run in a folder of its own records the same per-epoch numbers."""
    ctx = outcome.ctx
    ctx.out = ctx.tmp / "twin"
    other = twin(ctx)
    assert other.kind == CORRECT, str(other)
    keys = ("train_loss", "test_acc", "test_loss", "hidden_norms", "cos_per_layer")
    (mine,), (theirs,) = outcome.records, other.records
    for a, b in zip(mine.log, theirs.log, strict=True):
        assert [a.value(k) for k in keys] == [b.value(k) for k in keys]


def ran_right(outcome: Outcome, epochs: int = 1) -> None:
    """A completed tiny run: every epoch recorded, accuracies and losses finite and in
    range, the reference verified, each cosine a cosine."""
    for record in outcome.records:
        assert record.status == "completed", record.status
        assert record.log[-1].epoch == epochs
        last = record.log[-1]
        assert 0.0 <= last.test_acc <= 1.0
        assert epochs == 0 or math.isfinite(last.train_loss)
        assert record.reference.verified is True, record.reference
        assert all(-1.0 - 1e-6 <= c <= 1.0 + 1e-6 for c in last.value("cos_per_layer")
                   if c is not None and math.isfinite(c))


def diverged(outcome: Outcome) -> None:
    """Recorded as diverged, claiming no cosine."""
    (record,) = outcome.records
    assert record.status == "diverged"
    assert all(c is None or math.isnan(c) for e in record.log
               for c in e.value("cos_per_layer"))


def reference_failed(where: str) -> Callable[[Outcome], None]:
    """The record says the reference check failed, and where."""
    def check(outcome: Outcome) -> None:
        (record,) = outcome.records
        assert record.reference.how == "failed", record.reference
        assert where in record.reference.detail + str(record.reference.where)
    return check


def arch(name: str) -> str:
    return named("architecture", name)


def data(name: str) -> str:
    return named("dataset", name)


def credit(name: str) -> str:
    return named("credit rule", name)


def diag(name: str) -> str:
    return named("protocol diagnostic", name)


PROTOCOL = ["a", "b", "c", "d"]
PLUGINS = [
    # the door's guests (tests/test_door*.py), run through this battery too
    C("arch door-twelve-logits", PLUGIN, REFUSED, plugin(
        "door-twelve-logits", **{"model.arch": "door-twelve-logits"}),
        arch("door-twelve-logits")),
    C("arch door-hidden-ln", PLUGIN, REFUSED, plugin(
        "door-hidden-ln", **{"model.arch": "door-hidden-ln"}), arch("door-hidden-ln")),
    C("arch door-build-raises", PLUGIN, REFUSED, plugin(
        "door-build-raises", **{"model.arch": "door-build-raises"}),
        arch("door-build-raises"), "KeyError"),
    C("arch door-chatty prints in forward", PLUGIN, CORRECT, plugin(
        "door-chatty", **{"model.arch": "door-chatty"}),
        check=talk_on_stderr("forward of a chatty model", plugin())),
    C("data door-mixture well-behaved", PLUGIN, CORRECT, plugin(), check=ran_right),
    C("data door-nan-features", PLUGIN, REFUSED, train(
        "door-nan-features", **{"data.name": "door-nan-features"}),
        data("door-nan-features")),
    C("data door-shifting", PLUGIN, REFUSED, train(
        "door-shifting", **{"data.name": "door-shifting"}), data("door-shifting")),
    C("data door-bad-labels", PLUGIN, REFUSED, train(
        "door-bad-labels", **{"data.name": "door-bad-labels"}), data("door-bad-labels"),
        "outside 0 … 3"),
    C("data door-load-raises", PLUGIN, REFUSED, train(
        "door-load-raises", **{"data.name": "door-load-raises"}),
        data("door-load-raises"), "OSError"),
    C("data data-drifting's option naming a file that is not there", PLUGIN, REFUSED, train(
        "data-drifting", **{"data.name": "data-drifting",
                            "data.draw_file": "/nonexistent/draw.txt"}),
      data("data-drifting"), "FileNotFoundError"),
    C("rule door-readout-liar", PLUGIN, REFUSED, plugin(
        "door-readout-liar", **{"method.name": "door-readout-liar"}),
        credit("door-readout-liar")),
    C("rule door-step-raises", PLUGIN, REFUSED, plugin(
        "door-step-raises", **{"method.name": "door-step-raises"}),
        credit("door-step-raises"), "RuntimeError"),
    *[C(f"diagnostic {name}", PLUGIN, REFUSED, plugin(
        name, **{"diagnostics.protocol": [*PROTOCOL, name]}), diag(name))
      for name in ("door_nan", "door_raises", "data_nan", "data_inf", "data_none",
                   "data_text")],
    # credit rules
    *[C(f"rule {name}", PLUGIN, REFUSED, plugin(name, **{"method.name": name}),
        credit(name), *says) for name, *says in [
        ("battery-nan-credits", "credit 0 is not finite"),
        ("battery-wrong-shape-credits", "credit 0 has shape (9, 7), its state (9, 8)"),
        ("battery-too-few-credits", "returned 3 credits for 4 states"),
        ("battery-credits-raise", "raised IndexError: the credit table is empty"),
        ("battery-credits-move-weights", "credits() changed embed.weight"),
        ("battery-step-returns-none", "'NoneType' object has no attribute 'finite'"),
        ("battery-step-exits", "called sys.exit('the step had enough')"),
        ("battery-init-raises", "raised TypeError: missing feedback_table"),
        ("battery-no-parameters", "optimizer got an empty parameter list")]],
    C("rule battery-talkative prints in its step", PLUGIN, CORRECT, plugin(
        "battery-talkative", **{"method.name": "battery-talkative"}),
        check=talk_on_stderr("a talkative step", plugin())),
    C("rule battery-scaled-credits (reports 3× the credit it trains with)", PLUGIN,
      REFUSED, plugin("battery-scaled-credits", **{"method.name": "battery-scaled-credits"}),
      credit("battery-scaled-credits"), "blocks_train_on_the_reported_credit"),
    # architectures
    *[C(f"arch {name}", PLUGIN, REFUSED, plugin(name, **{"model.arch": name}), arch(name),
        says) for name, says in [
        ("battery-returns-none", "'NoneType' object has no attribute"),
        ("battery-returns-linear", "'Linear' object has no attribute"),
        ("battery-nan-weights", "states_are_the_residual_chain"),
        ("battery-build-exits", "called sys.exit(4)"),
        ("battery-seeding", "builds under seeds 0 and 1 are identical"),
        ("battery-wrong-input", "builds_a_contract_model")]],
    C("arch battery-float64", PLUGIN, REFUSED, plugin(
        "battery-float64", **{"model.arch": "battery-float64"}), arch("battery-float64"),
      "builds_a_contract_model", "parameters must be float32", "is torch.float64"),
    # datasets
    *[C(f"data {name}", PLUGIN, REFUSED, train(name, **{"data.name": name}), data(name),
        says) for name, says in [
        ("battery-inf-features", "the training samples of battery-inf-features hold NaN or "
                                 "infinite values"),
        ("battery-float64-features", "torch.float64"),
        ("battery-integer-features", "torch.int64"),
        ("battery-float-labels", "the training labels of battery-float-labels are "
                                 "torch.float32, not int64"),
        ("battery-negative-labels", "run -1 … 2, outside 0 … 3"),
        ("battery-wrong-shape", "have shape (9,), but battery-wrong-shape declares (8,)"),
        ("battery-2d-labels", "have shape (40, 1) for 40 samples"),
        ("battery-more-classes", "loaded 6 classes but declares 4"),
        ("battery-short-labels", "have shape (39,) for 40 samples"),
        ("battery-returns-tuple", "load() returned a tuple, not a creditaudit.data.Dataset"),
        ("battery-load-returns-none", "load() returned a NoneType"),
        ("battery-load-exits", "called sys.exit('no more data')"),
        ("battery-seeds-global", "moved torch's global RNG"),
        ("battery-shape-raises", "raised AttributeError: no shape table"),
        # every label 0 of 4 classes: trained without a word before; refused like a dataset
        # declaring one class (nothing to tell apart)
        ("battery-one-class", "the training labels of battery-one-class are all 0 (of its 4 "
                              "classes)")]],
    C("data battery-talkative-data prints while loading", PLUGIN, CORRECT, train(
        "battery-talkative-data", **{"data.name": "battery-talkative-data"}),
        check=talk_on_stderr("loading talkative data", plugin())),
    # diagnostics
    *[C(f"diagnostic {name}", PLUGIN, REFUSED, plugin(
        name, **{"diagnostics.protocol": [*PROTOCOL, name]}), diag(name), says)
      for name, says in [
        ("battery_returns_none", "evaluate() returned a NoneType, not a DiagnosticResult"),
        ("battery_odd_status", "the status is 'great'"),
        ("battery_always_raises", "raised LookupError: no threshold table"),
        ("battery_exits", "called sys.exit(5)"),
        ("battery_list_value", "the value is a list, not a number")]],
    C("diagnostic battery_talkative prints", PLUGIN, CORRECT, plugin(
        "battery_talkative", **{"diagnostics.protocol": [*PROTOCOL, "battery_talkative"]}),
        check=talk_on_stderr("evaluating talkatively", plugin())),
    # a guest's options given values it cannot take
    C("diagnostic option of the wrong type", PLUGIN, REFUSED, plugin(
        "battery_talkative", **{"diagnostics.protocol": [*PROTOCOL, "battery_talkative"],
                                "diagnostics.battery_talkative.limit": "high"}),
        "diagnostics.battery_talkative.limit"),
    C("diagnostic option below its minimum", PLUGIN, REFUSED, plugin(
        "battery_talkative", **{"diagnostics.protocol": [*PROTOCOL, "battery_talkative"],
                                "diagnostics.battery_talkative.limit": -1.0}),
        "diagnostics.battery_talkative.limit"),
    C("dataset plugin given no training samples", PLUGIN, REFUSED, plugin(
        **{"data.n_train": 0}), "data.n_train"),
    C("dataset plugin given a negative test size", PLUGIN, REFUSED, plugin(
        **{"data.n_test": -5}), "data.n_test"),
    C("dataset plugin given an option it does not have", PLUGIN, REFUSED, plugin(
        **{"data.in_dim": 16}), "data.in_dim"),
    C("architecture plugin given width 0", PLUGIN, REFUSED, plugin(
        "door-chatty", **{"model.arch": "door-chatty", "model.d": 0}), "model.d"),
    C("rule plugin given an option it does not read", PLUGIN, REFUSED, plugin(
        "battery-talkative", **{"method.name": "battery-talkative",
                                "method.feedback_seed": 3}), "method.feedback_seed"),
]


def factory_named(name: str) -> str:
    return f"{FACTORIES}:{name}"


ALLOW = "--allow-unverified-reference"
MODULES = [
    C("factory good network", MODULE, CORRECT, factory("good"), check=ran_right),
    *[C(f"factory {name}", MODULE, REFUSED, factory(name), factory_named(name), *says)
      for name, *says in [
        ("returns_none", "None"), ("returns_tensor", "Tensor"),
        ("returns_function",), ("returns_class",), ("raises", "ValueError", "no such width"),
        ("exits_zero", "sys.exit(0)"), ("exits_text", "sys.exit('the factory gave up')"),
        ("nan_weights", "'b1.f.0.weight' holds NaN/Inf"), ("inf_bias", "'head.bias' holds"),
        ("float64", "with float64 parameters"),
        ("in_place_input", "changes its input batch in place"),
        ("skips_past_states", "is not a cut"), ("detached_head", "does not reach the output")]],
    C("factory no_parameters", MODULE, REFUSED, factory("no_parameters"),
      factory_named("no_parameters"), "nothing to train (it has no parameters)"),
    # refused in one line naming the network's class (the factory's return) and the fault
    C("factory three_classes", MODULE, REFUSED, factory("three_classes"),
      "Net returns 3 logits but the data has 10 classes", "model.args"),
    C("factory extra_dim", MODULE, REFUSED, factory("extra_dim"),
      "ExtraDim's output must be (batch, classes) logits"),
    # the fix is on the command line: a factory returning a wrapper (not adapt(): Python)
    C("factory tuple_out", MODULE, REFUSED, factory("tuple_out"), "TupleOut's output",
      "make the model factory", "tuple_out' return a module that wraps the network"),
    C("factory dict_out", MODULE, REFUSED, factory("dict_out"), "DictOut's output"),
    C("factory reuses_a_state", MODULE, REFUSED, factory("reuses_a_state"),
      "state 'b1' is called more than once"),
    C("factory NaN logits past the probe's batch", MODULE, MARKED,
      factory("nan_for_large_batches"), check=diverged),
    C("factory no_grad (every parameter frozen)", MODULE, REFUSED, factory("no_grad"),
      factory_named("no_grad"), "nothing to train",
      "parameters all have requires_grad=False"),
    C("factory seeding (seeds torch's global RNG)", MODULE, REFUSED, factory("seeding"),
      factory_named("seeding"), "initial_weights_follow_the_seed",
      "the factory reseeds torch, so initial weights ignore run.seed"),
    C("factory prints while building", MODULE, CORRECT, factory("prints"),
      check=talk_on_stderr("building a network", factory("good"))),
    C("factory returns one shared module on every call", MODULE, REFUSED, factory("shared"),
      factory_named("shared"), "returns the same network object on every call: return a new "
      "one"),
    C("factory with a module its forward never uses", MODULE, CORRECT,
      factory("with_unused_module"), check=ran_right),
    C("factory with dropout", MODULE, CORRECT, factory("with_dropout"), check=ran_right),
    C("factory with batch norm", MODULE, CORRECT, factory("with_batchnorm"),
      check=ran_right),
    C("factory whose head normalises, undeclared", MODULE, CORRECT, factory("head_ln"),
      check=ran_right),
    C("factory whose head normalises, declared away", MODULE, REFUSED, factory(
        "head_ln", **{"model.terminal_ln": False}), factory_named("head_ln"), "terminal_ln"),
    C("factory declaring a normalising head it lacks", MODULE, REFUSED, factory(
        "good", **{"model.terminal_ln": True}), factory_named("good"), "terminal_ln"),
    C("custom backward that clips the gradient", MODULE, REFUSED,
      factory("clamped_backward"), "is not the gradient", ALLOW),
    C("custom backward that clips, allowed", MODULE, MARKED,
      factory("clamped_backward", ALLOW),
      check=reference_failed("between h_2 and the logits")),
    C("custom backward that doubles (ref_factories)", MODULE, REFUSED, train(
        args=("--arch", "module:creditaudit_guests.ref_factories:doubled_backward"),
        **{**MODULE_RUN, "model.states": ["embed", "res"]}), "net.res.f.2", ALLOW),
    C("BioTorch fa layers", MODULE, REFUSED, factory(
        "biotorch_fa", **{"model.states": ["module.embed", "module.b1", "module.b2"]}),
        "BioTorch", ALLOW),
    C("BioTorch fa layers, allowed", MODULE, MARKED, factory(
        "biotorch_fa", ALLOW, **{"model.states": ["module.embed", "module.b1",
                                                   "module.b2"]}),
        check=reference_failed("net.module")),
    C("BioTorch usf layers", MODULE, REFUSED, factory(
        "biotorch_usf", **{"model.states": ["module.embed", "module.b1", "module.b2"]}),
        factory_named("biotorch_usf")),
    C("BioTorch frsf layers", MODULE, REFUSED, factory(
        "biotorch_frsf", **{"model.states": ["module.embed", "module.b1", "module.b2"]}),
        "BioTorch frsf layer", "replaces the backward", ALLOW),
    C("BioTorch backpropagation layers", MODULE, CORRECT, factory(
        "biotorch_backpropagation", **{"model.states": ["module.embed", "module.b1",
                                                        "module.b2"]}), check=ran_right),
    # states
    C("a state the network does not have", MODULE, REFUSED, factory(
        "good", **{"model.states": ["embed", "b1", "nope"]}), "nope"),
    C("no states", MODULE, REFUSED, factory("good", **{"model.states": []}),
      "model.states"),
    C("one state only", MODULE, REFUSED, factory("good", **{"model.states": ["embed"]}),
      "model.states"),
    C("a state named twice", MODULE, REFUSED, factory(
        "good", **{"model.states": ["embed", "b1", "b1"]}), "b1"),
    C("states out of order", MODULE, REFUSED, factory(
        "good", **{"model.states": ["embed", "b2", "b1"]}), "b2"),
    C("the logits as the last state (odd, valid)", MODULE, CORRECT, factory(
        "good", **{"model.states": ["embed", "b1", "head"]}), check=ran_right),
    C("a state inside a block's branch (not a cut)", MODULE, REFUSED, factory(
        "good", **{"model.states": ["embed", "b1.f.0", "b2"]}), "b1.f.0"),
    C("a block's branch as a state (not a cut)", MODULE, REFUSED, factory(
        "good", **{"model.states": ["embed", "b1.f", "b2"]}), "b1.f"),
    C("states that are not strings", MODULE, REFUSED, factory(
        "good", **{"model.states": [1, 2]}), "model.states"),
    # the factory's path and arguments
    C("a factory module that does not exist", MODULE, REFUSED, train(
        args=("--arch", "module:creditaudit_guests.no_such_module:good"), **MODULE_RUN),
        "no_such_module"),
    C("a factory callable that does not exist", MODULE, REFUSED, factory("no_such_net"),
      "no_such_net"),
    C("a factory path without a callable", MODULE, REFUSED, train(
        args=("--arch", f"module:{FACTORIES}"), **MODULE_RUN),
      f"--arch module:{FACTORIES} is a module"),  # the flag typed, not model.factory
    C("a factory that is not callable", MODULE, REFUSED, factory("STATES"), "STATES"),
    C("model.args the factory does not take", MODULE, REFUSED, factory(
        "good", **{"model.args.width": 16}), factory_named("good"), "width"),
    C("model.args of the wrong type", MODULE, REFUSED, factory(
        "good", **{"model.args.d": "wide"}), factory_named("good")),
    C("model.args for another input size", MODULE, REFUSED, factory(
        "good", **{"model.args.in_dim": 17}), "17", "model.args"),
    C("model.args for another class count", MODULE, REFUSED, factory(
        "good", **{"model.args.n_classes": 4}), "4"),
    C("model.none_args the factory does not take", MODULE, REFUSED, factory(
        "good", **{"model.none_args": ["weights"]}), factory_named("good"), "weights"),
    C("model.args of the right values (as the defaults)", MODULE, CORRECT, factory(
        "good", **{"model.args.d": 16, "model.args.in_dim": 16}), check=ran_right),
]


def is_adapted(outcome: Outcome) -> None:
    assert list(outcome.value.state_names) == STATES


def diagnosed_right(outcome: Outcome) -> None:
    report = outcome.value
    assert report.reference["verified"] is True
    assert {d.status for d in report.diagnostics} <= {"passed", "fired", NOT_EVALUATED}


def recorded_right(outcome: Outcome) -> None:
    (record,) = outcome.records
    assert [e.test_acc for e in record.log] == [0.1, 0.2] and record.status == "completed"
    assert record.reference.verified is True


def recorder_marked(outcome: Outcome) -> None:
    (record,) = outcome.records
    assert record.reference.verified is False and record.reference.how == "failed"


def odd(x: torch.Tensor) -> torch.Tensor:
    return x[:, :, None]


BIO_STATES = ["module.embed", "module.b1", "module.b2"]
APIS = [
    # adapt()
    C("adapt: a model that is not a module", API, REFUSED, api(
        lambda c: adapt("net", STATES, example=X)), "nn.Module"),
    C("adapt: a state the model lacks", API, REFUSED, api(
        lambda c: adapt(net(), ["embed", "nope"], example=X)), "nope"),
    C("adapt: states given as one string", API, REFUSED, api(
        lambda c: adapt(net(), "embed", example=X)), "states"),
    C("adapt: no states", API, REFUSED, api(lambda c: adapt(net(), [], example=X)),
      "states"),
    C("adapt: a state named twice", API, REFUSED, api(
        lambda c: adapt(net(), ["embed", "b1", "b1"], example=X)), "b1"),
    C("adapt: states out of order", API, REFUSED, api(
        lambda c: adapt(net(), ["embed", "b2", "b1"], example=X)), "b2"),
    C("adapt: the logits as the last state (odd, valid)", API, CORRECT, api(
        lambda c: adapt(net(), ["embed", "head"], example=X)),
      check=lambda o: o.value.state_names == ("embed", "head")),
    C("adapt: a state inside a branch", API, REFUSED, api(
        lambda c: adapt(net(), ["embed", "b1.f.0", "b2"], example=X)), "b1.f.0"),
    C("adapt: a readout the model lacks", API, REFUSED, api(
        lambda c: adapt(net(), STATES, "nohead", example=X)), "nohead"),
    C("adapt: neither example nor input_shape", API, REFUSED, api(
        lambda c: adapt(net(), STATES)), "example"),
    C("adapt: an example without its batch axis", API, REFUSED, api(
        lambda c: adapt(net(), STATES, example=X[0])), "example"),
    C("adapt: a boolean example", API, REFUSED, api(
        lambda c: adapt(net(), STATES, example=X > 0)), "example"),
    C("adapt: an example holding Inf", API, REFUSED, api(
        lambda c: adapt(net(), STATES, example=nan_like(X, math.inf))), "NaN/Inf"),
    C("adapt: an example holding NaN", API, REFUSED, api(
        lambda c: adapt(net(), STATES, example=nan_like(X))), "NaN/Inf"),
    C("adapt: a float64 example", API, REFUSED, api(
        lambda c: adapt(net(), STATES, example=X.double())), "float64"),
    C("adapt: a float64 model, float32 example", API, REFUSED, api(
        lambda c: adapt(net("float64"), STATES, example=X)), "float"),
    C("adapt: a negative input_shape", API, REFUSED, api(
        lambda c: adapt(net(), STATES, input_shape=(-16,))), "input_shape"),
    C("adapt: an input_shape of another size", API, REFUSED, api(
        lambda c: adapt(net(), STATES, input_shape=(9,))), "input_shape=(9,)"),
    C("adapt: terminal_ln not a bool", API, REFUSED, api(
        lambda c: adapt(net(), STATES, example=X, terminal_ln="yes")), "terminal_ln"),
    C("adapt: n_classes 0", API, REFUSED, api(
        lambda c: adapt(net(), STATES, example=X, n_classes=0)), "n_classes"),
    C("adapt: n_classes contradicted", API, REFUSED, api(
        lambda c: adapt(net(), STATES, example=X, n_classes=12)), "n_classes=12"),
    C("adapt: terminal LN declared away", API, REFUSED, api(
        lambda c: adapt(net("head_ln"), STATES, example=X, terminal_ln=False)),
      "terminal_ln=False"),
    C("adapt: NaN weights", API, REFUSED, api(
        lambda c: adapt(net("nan_weights"), STATES, example=X)), "b1.f.0.weight"),
    C("adapt: Inf bias", API, REFUSED, api(
        lambda c: adapt(net("inf_bias"), STATES, example=X)), "head.bias"),
    C("adapt: a forward returning a tuple", API, REFUSED, api(
        lambda c: adapt(net("tuple_out"), STATES, example=X)), "tuple"),
    C("adapt: a forward returning a dict", API, REFUSED, api(
        lambda c: adapt(net("dict_out"), STATES, example=X)), "dict"),
    C("adapt: 3-D logits", API, REFUSED, api(
        lambda c: adapt(net("extra_dim"), STATES, example=X)), "logits"),
    C("adapt: a skip past the states", API, REFUSED, api(
        lambda c: adapt(net("skips_past_states"), STATES, example=X)), "is not a cut"),
    C("adapt: a state run twice", API, REFUSED, api(
        lambda c: adapt(net("reuses_a_state"), STATES, example=X)), "b1"),
    C("adapt: BioTorch uSF", API, REFUSED, api(
        lambda c: adapt(net("biotorch_usf"), BIO_STATES, example=X)), "every forward"),
    C("adapt: a batch-norm network (odd, valid)", API, CORRECT, api(
        lambda c: adapt(net("with_batchnorm"), STATES, example=X)), check=is_adapted),
    C("adapt: the input_shape alone (odd, valid)", API, CORRECT, api(
        lambda c: adapt(net(), STATES, input_shape=(16,))), check=is_adapted),
    # rule()
    C("rule: an unknown name", API, REFUSED, api(lambda c: rule("nope", adapted())),
      "nope"),
    C("rule: a name that is not a string", API, REFUSED, api(lambda c: rule(3, adapted())),
      "3"),
    C("rule: a model that was not adapted", API, REFUSED, api(lambda c: rule("dfa", net())),
      "adapt"),
    C("rule: a fractional seed", API, REFUSED, api(
        lambda c: rule("dfa", adapted(), seed=1.5)), "seed=1.5"),
    C("rule: n_classes 0", API, REFUSED, api(lambda c: rule("dfa", adapted(), n_classes=0)),
      "n_classes"),
    C("rule: n_classes contradicting the model", API, REFUSED, api(
        lambda c: rule("dfa", adapted(), n_classes=5)), "5"),
    C("rule: an option it does not have", API, REFUSED, api(
        lambda c: rule("dfa", adapted(), gamma=3)), "gamma"),
    C("rule: an option of the wrong type", API, REFUSED, api(
        lambda c: rule("dfa", adapted(), penalty="x")), "penalty"),
    C("rule: a residual-only rule on an adapted model", API, REFUSED, api(
        lambda c: rule("ep", adapted())), "ep"),
    C("rule: a state-bridge on an adapted model", API, REFUSED, api(
        lambda c: rule("state-bridge", adapted())), "state-bridge"),
    # Recorder
    C("Recorder: a model instead of a rule", API, REFUSED, api(
        lambda c: Recorder(adapted(), X, Y, out=c.out, progress=False)), "rule"),
    C("Recorder: fewer labels than inputs", API, REFUSED, api(
        lambda c: recorder(c, y=Y[:10])), "eval_y"),
    C("Recorder: float labels", API, REFUSED, api(lambda c: recorder(c, y=Y.float())),
      "eval_y"),
    C("Recorder: 2-D labels", API, REFUSED, api(lambda c: recorder(c, y=Y[:, None])),
      "eval_y"),
    C("Recorder: negative labels", API, REFUSED, api(lambda c: recorder(c, y=Y - 1)),
      "eval_y"),
    C("Recorder: labels past the classes", API, REFUSED, api(
        lambda c: recorder(c, y=Y + 10)), "eval_y"),
    C("Recorder: NaN inputs", API, REFUSED, api(lambda c: recorder(c, x=nan_like(X))),
      "NaN/Inf"),
    C("Recorder: Inf inputs", API, REFUSED, api(
        lambda c: recorder(c, x=nan_like(X, -math.inf))), "NaN/Inf"),
    C("Recorder: 3-D inputs", API, REFUSED, api(lambda c: recorder(c, x=odd(X))),
      "eval_x"),
    C("Recorder: a run name that leaves the folder", API, REFUSED, api(
        lambda c: recorder(c, name="../escape")), "name"),
    C("Recorder: out is a file", API, REFUSED, api(
        lambda c: (c.tmp.joinpath("file").write_text("x"),
                   Recorder(rule("dfa", adapted()), X, Y, out=c.tmp / "file",
                            progress=False))), "file"),
    C("Recorder: data of the wrong kind", API, REFUSED, api(
        lambda c: recorder(c, data=3)), "data"),
    C("Recorder: config with an unknown key", API, REFUSED, api(
        lambda c: recorder(c, config={"optim": {"nope": 1}})), "nope"),
    C("Recorder: config of the wrong type", API, REFUSED, api(
        lambda c: recorder(c, config={"optim": {"lr": "fast"}})), "optim.lr"),
    C("Recorder: a backward that clips the gradient", API, REFUSED, api(
        lambda c: recorder(c, model=adapted("clamped_backward"))), "not the gradient"),
    C("Recorder: a backward that clips, allowed", API, MARKED, api(
        lambda c: recorded(c, 0.1, model=adapted("clamped_backward"),
                           allow_unverified_reference=True)), check=recorder_marked),
    C("Recorder: BioTorch fa", API, REFUSED, api(lambda c: recorder(
        c, model=adapt(net("biotorch_fa"), BIO_STATES, example=X))), "BioTorch"),
    C("Recorder: BioTorch fa, allowed", API, MARKED, api(lambda c: recorded(
        c, 0.1, model=adapt(net("biotorch_fa"), BIO_STATES, example=X),
        allow_unverified_reference=True)), check=recorder_marked),
    C("Recorder: an accuracy above 1", API, REFUSED, api(lambda c: recorded(c, 1.5)),
      "test_acc"),
    C("Recorder: a NaN accuracy", API, REFUSED, api(lambda c: recorded(c, math.nan)),
      "test_acc", "never NaN"),
    C("Recorder: an infinite training accuracy", API, REFUSED, api(
        lambda c: recorder(c).epoch(0, train_acc=math.inf)), "train_acc", "never NaN or Inf"),
    C("Recorder: a NaN loss (valid: a diverged run, kept and marked)", API, MARKED, api(
        lambda c: (lambda r: (r.epoch(0, test_acc=0.1, test_loss=math.nan),
                              r.finish())[1])(recorder(c)))),
    C("Recorder: an accuracy given as text", API, REFUSED, api(lambda c: recorded(c, "0.5")),
      "test_acc"),
    C("Recorder: epochs going backwards", API, REFUSED, api(
        lambda c: (lambda r: (r.epoch(1, test_acc=0.1), r.epoch(0, test_acc=0.1)))(
            recorder(c))), "epoch"),
    C("Recorder: an epoch after finish", API, REFUSED, api(
        lambda c: (lambda r: (r.epoch(0, test_acc=0.1), r.finish(),
                              r.epoch(1, test_acc=0.1)))(recorder(c))), "finish"),
    C("Recorder: a second run into the same folder", API, REFUSED, api(
        lambda c: (recorded(c, 0.1), recorder(c))), "overwrite"),
    C("Recorder: finish without an epoch", API, REFUSED, api(lambda c: recorded(c)),
      "epoch"),
    C("Recorder: two epochs of a plain network (valid)", API, CORRECT, api(
        lambda c: recorded(c, 0.1, 0.2)), check=recorded_right),
    # diagnose()
    C("diagnose: float labels", API, REFUSED, api(lambda c: diagnose(adapted(), X, Y.float())),
      "eval_y"),
    C("diagnose: fewer labels than inputs", API, REFUSED, api(
        lambda c: diagnose(adapted(), X, Y[:5])), "eval_y"),
    C("diagnose: negative labels", API, REFUSED, api(lambda c: diagnose(adapted(), X, Y - 1)),
      "eval_y"),
    C("diagnose: Inf inputs", API, REFUSED, api(
        lambda c: diagnose(adapted(), nan_like(X, math.inf), Y)), "NaN/Inf"),
    C("diagnose: a credit that is not callable", API, REFUSED, api(
        lambda c: diagnose(adapted(), X, Y, credit=3)), "credit= must be a CreditRule",
      "got int 3"),
    C("diagnose: credits of the wrong shape", API, REFUSED, api(
        lambda c: diagnose(adapted(), X, Y, credit=lambda x, y: [torch.zeros(2, 2)] * 3)),
      "credit"),
    C("diagnose: too few credits", API, REFUSED, api(
        lambda c: diagnose(adapted(), X, Y, credit=lambda x, y: [torch.zeros(64, 16)])),
      "credit"),
    C("diagnose: NaN credits (every cosine marked undefined)", API, MARKED, api(
        lambda c: diagnose(adapted(), X, Y, credit=lambda x, y: [
            torch.full((x.shape[0], 16), math.nan)] * 3)),
      check=lambda o: all(c["defined"] == 0.0 for c in o.value.to_dict()["layer_cosines"])),
    # the caller's own function, in the caller's process: its exception and traceback are
    # what helps them, so it propagates unchanged (a plugin's or a factory's is wrapped)
    C("diagnose: a credit function that raises (its own exception propagates)", API,
      CORRECT, api(lambda c: propagates(
          ZeroDivisionError, lambda: diagnose(adapted(), X, Y, credit=lambda x, y: 1 / 0))),
      check=lambda o: o.value.endswith("division by zero")),
    C("diagnose: an accuracy above 1", API, REFUSED, api(
        lambda c: diagnose(adapted(), X, Y, headline_acc=1.5)), "headline_acc"),
    C("diagnose: a negative frozen accuracy", API, REFUSED, api(
        lambda c: diagnose(adapted(), X, Y, frozen_acc=-1.0)), "frozen_acc"),
    C("diagnose: a protocol that is not one", API, REFUSED, api(
        lambda c: diagnose(adapted(), X, Y, protocol="abc")),
      "protocol= must be a creditaudit.protocol.Protocol", "got str 'abc'"),
    C("diagnose: a raw module, not adapted", API, REFUSED, api(
        lambda c: diagnose(net(), X, Y)), "has no forward_states", "states_fn"),
    C("diagnose: a backward that clips the gradient", API, REFUSED, api(
        lambda c: diagnose(adapted("clamped_backward"), X, Y)), "not the gradient"),
    C("diagnose: a backward that clips, unverified on request", API, MARKED, api(
        lambda c: diagnose(adapted("clamped_backward"), X, Y, verify_reference=False))),
    C("diagnose: a backward that clips, allowed", API, MARKED, api(
        lambda c: diagnose(adapted("clamped_backward"), X, Y,
                           allow_unverified_reference=True))),
    C("diagnose: a good model (odd: one class only)", API, CORRECT, api(
        lambda c: diagnose(adapted(), X, torch.zeros_like(Y))), check=diagnosed_right),
]


def audit(make: Callable[[Path], Path]) -> Callable[[Ctx], Outcome]:
    def act(ctx: Ctx) -> Outcome:
        return ctx.cli("audit", make(ctx.tmp), "-q", "--no-metrics")
    return act


def folder_with_record(text: str) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        run = tmp / "odd-run"
        run.mkdir()
        (run / RECORD_FILE).write_text(text)
        return run
    return make


MODULE_SWEEP = """
[grid]
"model.arch" = ["module"]
"method.name" = ["bp", "fa"]
"""
CONFIGS = [
    # sweeps whose [base] or grid a run's guest would not read or cannot take
    C("sweep: [base] width a preset architecture ignores", CONFIG, REFUSED, sweep(
        '[grid]\n"model.arch" = ["resmlp", "student"]\n', "--dry-run"), "model.d=16"),
    C("sweep: [base] in_dim a plugin dataset ignores", CONFIG, REFUSED, sweep(
        '[grid]\n"data.name" = ["synthetic", "door-mixture"]\n', "--dry-run"), "data.in_dim"),
    C("sweep: [base] model.args a factory refuses", CONFIG, REFUSED, sweep(
        MODULE_SWEEP, "--dry-run", **{"model.factory": f"{FACTORIES}:good",
                                      "model.states": STATES, "model.d": None,
                                      "model.n_blocks": None, "data.in_dim": 16,
                                      "model.args.width": 3}), factory_named("good")),
    C("sweep: a grid key that does not exist", CONFIG, REFUSED, sweep(
        '[grid]\n"model.nope" = [1, 2]\n', "--dry-run"), "model.nope"),
    C("sweep: an empty grid axis", CONFIG, REFUSED, sweep(
        '[grid]\n"method.name" = []\n', "--dry-run"), "method.name"),
    C("sweep: a grid rule that cannot train a factory's network", CONFIG, REFUSED, sweep(
        '[grid]\n"model.arch" = ["module"]\n"method.name" = ["bp", "ep"]\n', "--dry-run",
        **{"model.factory": f"{FACTORIES}:good", "model.states": STATES, "model.d": None,
           "model.n_blocks": None, "data.in_dim": 16}), "ep"),
    C("sweep: a grid plugin dataset that is not installed", CONFIG, REFUSED, sweep(
        '[grid]\n"data.name" = ["battery-absent"]\n', "--dry-run", **{"data.in_dim": None}),
      "battery-absent"),
    C("sweep: a grid over a liar plugin", CONFIG, REFUSED, sweep(
        '[grid]\n"data.name" = ["door-mixture", "door-nan-features"]\n', "--workers", "0",
        guests=("door-nan-features",), **{"data.in_dim": None}),
      data("door-nan-features"), "loads_what_it_declares"),
    C("sweep: a plugin grid that trains (odd: one axis value)", CONFIG, CORRECT, sweep(
        '[grid]\n"data.name" = ["door-mixture"]\n', "--workers", "0",
        **{"data.in_dim": None}), check=ran_right),
    # --set and flags that reach a component
    C("--set model.args on a built-in architecture", CONFIG, REFUSED, train(
        **{**SYNTHETIC, "model.args.d": 3}), "model.args"),
    C("--set model.factory without model.arch = module", CONFIG, REFUSED, train(
        **{**SYNTHETIC, "model.factory": f"{FACTORIES}:good"}), "model.factory"),
    C("--set model.states on a built-in architecture", CONFIG, REFUSED, train(
        **{**SYNTHETIC, "model.states": STATES}), "model.states"),
    C("--set a negative learning rate", CONFIG, REFUSED, train(
        **{**SYNTHETIC, "optim.lr": -1.0}), "optim.lr"),
    C("--set zero epochs (odd, valid: the initial network only)", CONFIG, CORRECT, train(
        **{**SYNTHETIC, "optim.epochs": 0}), check=lambda o: ran_right(o, epochs=0)),
    C("--set batch size 0", CONFIG, REFUSED, train(**{**SYNTHETIC, "optim.batch_size": 0}),
      "optim.batch_size"),
    C("--set an unknown diagnostic", CONFIG, REFUSED, train(
        **{**SYNTHETIC, "diagnostics.protocol": [*PROTOCOL, "zz"]}), "zz"),
    C("--set a penalty given as text", CONFIG, REFUSED, train(
        **{**SYNTHETIC, "method.penalty": "x"}), "method.penalty"),
    C("--set an unknown key", CONFIG, REFUSED, train(**{**SYNTHETIC, "optim.nope": 1}),
      "optim.nope"),
    C("--set without a value", CONFIG, REFUSED, lambda c: c.cli(
        "train", "--set", "optim.lr", "--out", c.out), "optim.lr"),
    C("--set a value that is not TOML", CONFIG, REFUSED, lambda c: c.cli(
        "train", "--set", "optim.lr=[1,", "--out", c.out), "optim.lr"),
    C("--method a plugin that is not installed", CONFIG, REFUSED, lambda c: c.cli(
        "train", "--method", "battery-absent", "--out", c.out), "battery-absent"),
    C("--dataset a plugin that is not installed", CONFIG, REFUSED, lambda c: c.cli(
        "train", "--dataset", "battery-absent", "--out", c.out), "battery-absent"),
    C("--arch a plugin that is not installed", CONFIG, REFUSED, lambda c: c.cli(
        "train", "--arch", "battery-absent", "--out", c.out), "battery-absent"),
    C("--threads 0", CONFIG, REFUSED, train(args=("--threads", "0"), **SYNTHETIC),
      "threads"),
    C("--data-dir for a generated dataset", CONFIG, REFUSED, train(
        args=("--data-dir", "/nonexistent"), **SYNTHETIC), "data"),
    C("a batch larger than the data (odd, valid)", CONFIG, CORRECT, train(
        **{**SYNTHETIC, "optim.batch_size": 1024}), check=ran_right),
    # config files
    C("--config a file that does not exist", CONFIG, REFUSED, lambda c: c.cli(
        "train", "--config", c.tmp / "absent.toml"), "absent.toml"),
    C("--config a file that is not TOML", CONFIG, REFUSED, config_file("[optim\nlr = 1\n"),
      "run.toml"),
    C("--config an unknown section", CONFIG, REFUSED, config_file(
        '[nope]\nx = 1\n[run]\nout_dir = "OUT"\n'), "nope"),
    C("--config a factory's model.args it refuses", CONFIG, REFUSED, config_file(
        f'[model]\narch = "module"\nfactory = "{FACTORIES}:good"\nstates = {STATES!r}\n'
        '[model.args]\ndepth = 3\n[data]\nin_dim = 16\nn_train = 256\nn_test = 128\n'
        '[optim]\nepochs = 1\n[diagnostics]\nend_of_run = false\n[run]\nout_dir = "OUT"\n'
        .replace("'", '"'), "-q"), factory_named("good"), "depth"),
    C("--config a record that is no record", CONFIG, REFUSED, lambda c: c.cli(
        "train", "--config", folder_with_record('{"schema": 999}')(c.tmp) / RECORD_FILE),
      RECORD_FILE),
    C("audit a folder without a run", CONFIG, REFUSED, audit(lambda tmp: tmp),
      "no run record at", "pass a run folder that holds record.json"),
    C("audit a record of another schema", CONFIG, REFUSED, audit(
        folder_with_record('{"schema": 999}')), "record"),
    C("audit a record that is a list", CONFIG, REFUSED, audit(folder_with_record("[]")),
      "record"),
]
CASES = PLUGINS + MODULES + APIS + CONFIGS


@pytest.fixture
def ctx(tmp_path, capsys, monkeypatch):
    context = Ctx(tmp_path, capsys, monkeypatch)
    yield context
    monkeypatch.undo()
    GUESTS.forget()
    reload_plugins()


def params() -> list:
    return [pytest.param(case, id=f"{case.surface}: {case.id}",
                         marks=[pytest.mark.xfail(strict=True, reason=case.bug,
                                                  raises=AssertionError)]
                         if case.bug else [])
            for case in CASES]


@pytest.mark.parametrize("case", params())
def test_a_bad_input_is_refused_in_one_line_or_runs_right_or_is_marked(case, ctx):
    outcome = case.act(ctx)
    outcome.ctx = ctx
    assert outcome.kind == case.expect, str(outcome)
    if case.expect == REFUSED:
        assert "internal error" not in outcome.line and "Traceback" not in outcome.stderr
        for fragment in case.says:
            assert fragment in outcome.line, (fragment, outcome.line)
    elif case.check is not None:
        case.check(outcome)
    if case.expect == MARKED and outcome.records:
        assert all(marks_of(r) for r in outcome.records)


def test_the_battery_holds_at_least_150_cases_on_every_surface(capsys):
    ids = [f"{c.surface}: {c.id}" for c in CASES]
    assert len(set(ids)) == len(ids), [i for i, n in Counter(ids).items() if n > 1]
    table = Counter((c.surface, c.expect) for c in CASES)
    with capsys.disabled():
        print("\noutside battery: cases per surface and expected outcome")
        for surface in (PLUGIN, MODULE, API, CONFIG):
            row = {kind: table[surface, kind] for kind in (REFUSED, CORRECT, MARKED)}
            print(f"  {surface:15} {sum(row.values()):4}  " +
                  "  ".join(f"{k} {v}" for k, v in row.items()))
        bugs = sum(1 for c in CASES if c.bug)
        print(f"  {'all':15} {len(CASES):4}  (xfail, bugs found: {bugs})")
    assert len(CASES) >= 150
    assert all(sum(table[s, k] for k in (REFUSED, CORRECT, MARKED)) >= 25
               for s in (PLUGIN, MODULE, API, CONFIG))
