"""A Recorder whose ``data=`` names a dataset plugin runs the plugin's code (its options,
identity and ``load()``, to check the evaluation rows are its test samples), so the plugin
is a guest as in a command's run: checked at the door before it loads (its checks kept in
the record), and what its code raises past the door — an exception or ``sys.exit`` — or
loads wrong is named as the plugin's, in one line; never passed through raw, nor ending the
caller's process."""

from __future__ import annotations

import pytest
import torch

from creditaudit import Recorder, adapt, rule
from creditaudit.config import bind
from creditaudit.data import dataset_spec
from creditaudit.errors import GuestError
from door_support import Net
from plugin_support import one_module_plugin

DATASETS = '''
import torch
from creditaudit.data import Dataset, GeneratedDataset
from creditaudit.data.registry import GeneratedOptions


class Mixture(GeneratedDataset[GeneratedOptions]):
    """Well behaved at the door's tiny sizes (40 training samples); spoil() past them."""

    name, label = "rec-mixture", "mixture"

    def input_shape(self):
        return (8,)

    def n_classes(self):
        return 4

    def provenance(self, seed):
        o = self.options
        return {"generator": self.name,
                "args": {"n_train": o.n_train, "n_test": o.n_test, "seed": seed}}

    def spoil(self, x):
        return x

    def load(self, seed):
        generator = torch.Generator().manual_seed(seed)
        n, cut = self.options.n_train + self.options.n_test, self.options.n_train
        y = torch.randint(0, 4, (n,), generator=generator)
        x = torch.randn(n, 8, generator=generator) + y[:, None].float()
        if cut > 40:
            x = self.spoil(x)
        return Dataset(self.name, x[:cut], y[:cut], x[cut:], y[cut:], n_classes=4)


class Raising(Mixture):
    name = "rec-raising"

    def spoil(self, x):
        raise ValueError("no such shard")


class Exiting(Mixture):
    name = "rec-exiting"

    def spoil(self, x):
        raise SystemExit(3)


class NaNs(Mixture):
    name = "rec-nans"

    def spoil(self, x):
        x[0, 0] = float("nan")
        return x


class Held(Mixture):
    name = "rec-held"

    def load(self, seed):
        data = super().load(seed)
        data.test_x, data.test_y = data.train_x[:20], data.train_y[:20]
        return data
'''
ENTRIES = "\n".join(f"rec-{name.lower()} = rec_datasets:{name}" for name in (
    "Mixture", "Raising", "Exiting", "NaNs", "Held"))
ORIGIN = "one-module==0.1.0"
SIZES = {"n_train": 64, "n_test": 32}


def record_on(name: str, out, **sizes: int) -> Recorder:  # noqa: ANN001
    """A Recorder evaluating on the test split of rec-mixture (seed 0), naming ``name``."""
    spec = dataset_spec("rec-mixture")
    data = spec(bind(spec, "data", **SIZES)).load(0)
    torch.manual_seed(0)
    model = adapt(Net(), ["stem", "b1"], example=data.test_x[:8])
    return Recorder(rule("bp", model), data.test_x, data.test_y, out=out, progress=False,
                    data={"name": name, "data_seed": 0, **SIZES, **sizes},
                    config={"run.seed": 0})


@pytest.fixture
def plugins(tmp_path):
    with one_module_plugin(tmp_path / "site", "creditaudit.datasets", ENTRIES,
                           {"rec_datasets": DATASETS}):
        yield


@pytest.mark.parametrize(("name", "says"), [
    ("rec-raising", "raised ValueError: no such shard (at rec_datasets.py:"),
    ("rec-exiting", "called sys.exit(3) (at rec_datasets.py:"),
    ("rec-nans", "loaded data creditaudit cannot use: the training samples of rec-nans hold "
                 "NaN or infinite values"),
], ids=["raises", "exits", "nan"])
def test_what_a_dataset_plugin_does_past_the_door_is_named_as_the_plugins(
        plugins, tmp_path, name, says):
    """Before: the plugin's ValueError and SystemExit passed through the Recorder raw (a
    sys.exit in a plugin ended the user's script), and what it loaded wrong was a
    LoadedDataError that did not name it."""
    with pytest.raises(GuestError) as error:
        record_on(name, tmp_path / "runs")
    message = str(error.value)
    assert message.startswith(f"dataset plugin '{name}' ({ORIGIN}) "), message
    assert says in message, message
    assert "\n" not in message


def test_a_dataset_plugin_is_checked_at_the_door_before_a_recorder_loads_it(plugins,
                                                                            tmp_path):
    """Before: a Recorder never put a dataset plugin through the door: one whose test split
    is its training split was taken, and the record held no checks for it."""
    with pytest.raises(GuestError, match=r"'rec-held' \(one-module==0\.1\.0\) fails the "
                                         r"conformance check test_split_is_held_out"):
        record_on("rec-held", tmp_path / "held")
    rec = record_on("rec-mixture", tmp_path / "runs")
    data = rec.record.environment["components"]["data"]
    assert data["origin"] == ORIGIN and "test_split_is_held_out" in data["checks"]
