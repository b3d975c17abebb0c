"""A Recorder ends each trained epoch of the rule as ``creditaudit train`` does.

A Credit Bridge trains its first ⌈warmup_fraction × optim.epochs⌉ epochs with DFA credit;
in a loop of the user's own, the epochs the Recorder records are the only epochs the rule
hears of. Without them the warm-up never ended (the whole loop trained DFA under the name
credit-bridge) and the record held none of the rule's per-epoch fields.
"""

from __future__ import annotations

import pytest
import torch

from creditaudit import Recorder, rule
from creditaudit.errors import ConfigError, GuestError
from creditaudit.methods.credit_bridge import CreditBridge
from creditaudit.models import ResidualMLP
from creditaudit.records import load_record

pytestmark = pytest.mark.usefixtures("single_thread")

OFF = {"diagnostics.end_of_run": False}


def bridge(**options):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = ResidualMLP(8, 16, 4, 2)
    return rule("credit-bridge", model, **options)


def data(n: int = 64):
    generator = torch.Generator().manual_seed(3)
    return torch.randn(n, 8, generator=generator), torch.randint(0, 4, (n,),
                                                                 generator=generator)


def test_the_warm_up_ends_after_its_share_of_the_loop_and_the_record_says_so(tmp_path):
    credit = bridge(warmup_fraction=0.5)
    x, y = data()
    optimizer = torch.optim.AdamW(credit.trainable_parameters(), lr=1e-3)
    warm = []
    with Recorder(credit, x, y, out=tmp_path, name="cb", progress=False,
                  config={"optim.epochs": 2, **OFF}) as rec:
        rec.epoch(0)
        for epoch in (1, 2):
            warm.append(credit.in_warmup())
            credit.train_step(x, y, optimizer)
            rec.epoch(epoch)
    assert warm == [True, False]  # ⌈0.5 × 2⌉ = 1 epoch of DFA credit, as `train` gives
    log = load_record(tmp_path / "cb").log
    assert [entry.extras.get("bridge_warmup") for entry in log] == [None, 1.0, 0.0]
    assert all("bridge_consistency_error" in entry.extras for entry in log[1:])


def test_a_warm_up_needs_the_loop_length_and_every_epoch(tmp_path):
    x, y = data()
    with pytest.raises(ConfigError, match=r"credit-bridge: method.warmup_fraction=0.2 .*"
                                          r"config=\{'optim.epochs': N\}"):
        Recorder(bridge(), x, y, out=tmp_path, name="no-length", progress=False, config=OFF)
    # without a warm-up the bridge does not read the run's length
    Recorder(bridge(warmup_fraction=0.0), x, y, out=tmp_path, name="none", progress=False,
             config=OFF).epoch(1)
    rec = Recorder(bridge(), x, y, out=tmp_path, name="skips", progress=False,
                   config={"optim.epochs": 4, **OFF})
    rec.epoch(1)
    with pytest.raises(ConfigError, match="epoch=3 skips epoch 2: credit-bridge ends each "
                                          "epoch .* record every epoch"):
        rec.epoch(3)


def test_extras_of_the_rules_own_names_are_refused(tmp_path):
    x, y = data()
    rec = Recorder(bridge(), x, y, out=tmp_path, name="clash", progress=False,
                   config={"optim.epochs": 2, **OFF})
    with pytest.raises(ConfigError, match=r"extras \['bridge_warmup'\] are credit-bridge's "
                                          "own per-epoch fields"):
        rec.epoch(1, extras={"bridge_warmup": 1.0, "mine": 2.0})


def test_an_epoch_retried_after_a_refusal_keeps_the_rules_fields(tmp_path):
    """The rule's epoch was ended before the user's extras were refused; the retried
    epoch(1) ended it again, with no step since: the record said state_pred_error NaN, and
    a Credit Bridge's epoch 1 bridge_warmup 0.0 (its sums restarted), for a trained epoch."""
    x, y = data()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = ResidualMLP(8, 16, 4, 2)
    for credit, field in ((rule("state-bridge", model), "state_pred_error"),
                          (bridge(warmup_fraction=0.5), "bridge_warmup")):
        optimizer = torch.optim.AdamW(credit.trainable_parameters(), lr=1e-3)
        rec = Recorder(credit, x, y, out=tmp_path, name=credit.name, progress=False,
                       config={"optim.epochs": 2, **OFF})
        credit.train_step(x, y, optimizer)
        with pytest.raises(ConfigError, match="own per-epoch fields"):
            rec.epoch(1, extras={field: 1.0})
        kept = rec.epoch(1, extras={"mine": 1.0}).extras
        assert kept["mine"] == 1.0 and kept[field] == kept[field]  # not NaN
        if field == "bridge_warmup":
            assert kept[field] == 1.0  # its one step was a warm-up step
        assert load_record(tmp_path / credit.name).log[-1].extras == kept


def test_extras_that_are_no_mapping_of_names_are_refused_in_one_line(tmp_path):
    """A list of pairs raised AttributeError from inside epoch(); keys 1 and "1" were both
    written as "1", one of the two numbers lost."""
    x, y = data()
    rec = Recorder(bridge(warmup_fraction=0.0), x, y, out=tmp_path, name="pairs",
                   progress=False, config=OFF)
    with pytest.raises(ConfigError, match=r"^extras must be a mapping of names to numbers, "
                                          r".* got list$"):
        rec.epoch(0, extras=[("val_acc", 0.9)])
    with pytest.raises(ConfigError, match=r"^extras key 1 \(int\) is not a name: "):
        rec.epoch(0, extras={1: 0.1, "1": 0.2})
    with pytest.raises(ConfigError, match=r"^extras key ' ' is not a name: "):
        rec.epoch(0, extras={" ": 0.1})  # it was logged as the bare tag "train/ "
    assert rec.epoch(0, extras={"1": 0.2}).extras == {"1": 0.2}


def test_extras_named_like_a_record_key_are_refused_in_one_line(tmp_path):
    """extras are written last, so one named like the entry's own key replaced it in
    record.json (the file said train_loss 9.0 where the loop said 0.5)."""
    x, y = data()
    rec = Recorder(bridge(warmup_fraction=0.0), x, y, out=tmp_path, name="keys",
                   progress=False, config=OFF)
    with pytest.raises(ConfigError, match=r"^extras 'train_loss': keys the record writes for "
                                          r"every epoch, .* give yours other names \(pass "
                                          r"train_loss=… as its own argument\)$"):
        rec.epoch(0, train_loss=0.5, extras={"train_loss": 9.0})
    for key in ("epoch", "lr", "seconds", "test_acc", "h_L_norm", "cos_per_layer", "verdict",
                "protocol", "extras"):
        with pytest.raises(ConfigError, match=f"^extras '{key}': keys the record writes"):
            rec.epoch(0, extras={key: 1.0})
    rec.epoch(0, train_loss=0.5, extras={"mine": 9.0})  # nothing was recorded before
    assert load_record(tmp_path / "keys").log[0].train_loss == 0.5


class LoudBridge(CreditBridge):
    """A user's own rule class whose per-epoch values take the record's names."""

    def end_epoch(self, epoch, n_epochs):  # noqa: ANN001
        return {**super().end_epoch(epoch, n_epochs), "lr": 5.0, "test_loss": 0.0}


def test_a_rules_per_epoch_values_named_like_a_record_key_are_refused(tmp_path):
    loud = bridge(warmup_fraction=0.0)
    loud.__class__ = LoudBridge  # the same rule, of the user's own class
    x, y = data()
    rec = Recorder(loud, x, y, out=tmp_path, name="loud", progress=False, config=OFF)
    rec.epoch(0)
    with pytest.raises(GuestError, match=r"^credit rule .*LoudBridge \(your own class\): "
                                         r"end_epoch\(\) returned per-epoch values named "
                                         r"'lr', 'test_loss', keys the epoch entry writes "
                                         r"itself, .* give them other names; an error in its "
                                         r"code"):
        rec.epoch(1, test_loss=1.0)


def test_extras_of_numpy_and_tensor_numbers_are_kept_and_others_refused(tmp_path):
    """A numpy scalar other than float64 (float32, int64) was refused as no number though
    the record holds it faithfully; a tensor with grad and NaN are kept as floats too."""
    import numpy as np

    x, y = data()
    rec = Recorder(bridge(warmup_fraction=0.0), x, y, out=tmp_path, name="numbers",
                   progress=False, config=OFF)
    for value in ("high", [1.0], torch.ones(2), True):
        with pytest.raises(ConfigError, match=r"^extras\['mine'\] must be a number, got "):
            rec.epoch(0, extras={"mine": value})
    weight = torch.tensor(2.0, requires_grad=True)
    rec.epoch(0, extras={"f32": np.float32(0.5), "i64": np.int64(3), "grad": weight * 2,
                         "nan": float("nan")})
    extras = load_record(tmp_path / "numbers").log[0].extras
    assert extras["f32"] == 0.5 and extras["i64"] == 3.0 and extras["grad"] == 4.0
    assert extras["nan"] != extras["nan"]


def test_a_recorder_on_a_rule_another_recorder_took_since_records_no_more_epochs(tmp_path):
    """Each Recorder ends the rule's epochs: two recording one loop ended each epoch twice,
    and the second recorded the bridge's errors as NaN (no step since the first ended it).
    The last Recorder created on the rule records it; the one before is refused in one line
    (re-running a notebook's cell that creates the Recorder takes the rule over)."""
    credit = bridge(warmup_fraction=0.0)
    x, y = data()
    optimizer = torch.optim.AdamW(credit.trainable_parameters(), lr=1e-3)
    first = Recorder(credit, x, y, out=tmp_path, name="first", progress=False, config=OFF)
    second = Recorder(credit, x, y, out=tmp_path, name="second", progress=False, config=OFF)
    credit.train_step(x, y, optimizer)
    entry = second.epoch(1)
    assert entry.extras["bridge_consistency_error"] == entry.extras["bridge_consistency_error"]
    with pytest.raises(ConfigError, match=r"^Recorder 'second' was created on this "
                                          r"credit-bridge rule since, .* one Recorder"):
        first.epoch(1)
    assert load_record(tmp_path / "first").log == []
    second.finish()
    with pytest.raises(ConfigError, match="Recorder 'second' was created"):
        first.epoch(1)  # second ended epoch 1: first would end it again


def test_a_0d_numpy_array_is_a_number(tmp_path):
    """``np.array(0.5)`` (what ``np.asarray`` of a loop's accuracy gives) was refused as no
    number though numpy scalars and one-element tensors were taken."""
    import numpy as np

    x, y = data()
    rec = Recorder(bridge(warmup_fraction=0.0), x, y, out=tmp_path, name="arrays",
                   progress=False, config=OFF)
    entry = rec.epoch(0, test_acc=np.array(0.5), test_loss=np.array([1.5], dtype=np.float32),
                      extras={"mine": np.array(3)})
    assert (entry.acc_eval, entry.test_loss, entry.extras["mine"]) == (0.5, 1.5, 3.0)
    with pytest.raises(ConfigError, match=r"^extras\['two'\] must be a number, got ndarray"):
        rec.epoch(1, extras={"two": np.array([1.0, 2.0])})
