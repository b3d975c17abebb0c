"""A Recorder whose ``data=`` names a dataset plugin runs the plugin's code (its options,
identity and ``load()``, to check the evaluation rows are its test samples): what that code
raises — an exception or ``sys.exit`` — is named as the plugin's, in one line, as a
command's run names it; never passed through raw, nor ending the caller's process."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from creditaudit import Recorder, adapt, rule
from creditaudit.errors import GuestError
from plugin_support import one_module_plugin

X = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
Y = torch.randint(0, 4, (32,), generator=torch.Generator().manual_seed(2))

DATASETS = '''
import torch
from creditaudit.data import GeneratedDataset
from creditaudit.data.registry import GeneratedOptions


class Raising(GeneratedDataset[GeneratedOptions]):
    name, label = "rec-raising", "raising"

    def input_shape(self):
        return (8,)

    def n_classes(self):
        return 4

    def provenance(self, seed):
        return {"generator": self.name, "args": {"seed": seed}}

    def load(self, seed):
        raise ValueError("no such shard")


class Exiting(Raising):
    name, label = "rec-exiting", "exiting"

    def load(self, seed):
        raise SystemExit(3)


class NaNs(Raising):
    name, label = "rec-nans", "NaN features"

    def load(self, seed):
        from creditaudit.data import Dataset
        x = torch.full((8, 8), float("nan"))
        y = torch.zeros(8, dtype=torch.long)
        return Dataset(self.name, x, y, x, y, n_classes=4)
'''
ENTRIES = ("rec-raising = rec_datasets:Raising\nrec-exiting = rec_datasets:Exiting\n"
           "rec-nans = rec_datasets:NaNs")
ORIGIN = "one-module==0.1.0"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.b1, self.head = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.b1(torch.relu(self.stem(x)))))


@pytest.mark.parametrize(("name", "says"), [
    ("rec-raising", "raised ValueError: no such shard (at rec_datasets.py:"),
    ("rec-exiting", "called sys.exit(3) (at rec_datasets.py:"),
    ("rec-nans", "loaded data creditaudit cannot use: the training samples of rec-nans hold "
                 "NaN or infinite values"),
], ids=["raises", "exits", "nan"])
def test_what_a_dataset_plugin_raises_for_a_recorder_is_named_as_the_plugins(
        tmp_path, name, says):
    """Before: the plugin's ValueError and SystemExit passed through the Recorder raw (a
    sys.exit in a plugin ended the user's script), and what it loaded wrong was a
    LoadedDataError that did not name it."""
    with one_module_plugin(tmp_path / "site", "creditaudit.datasets", ENTRIES,
                           {"rec_datasets": DATASETS}):
        torch.manual_seed(0)
        model = adapt(Net(), ["stem", "b1"], example=X[:8])
        with pytest.raises(GuestError) as error:
            Recorder(rule("bp", model), X, Y, out=tmp_path / "runs", progress=False,
                     data={"name": name, "n_train": 8, "n_test": 8})
    message = str(error.value)
    assert message.startswith(f"dataset plugin '{name}' ({ORIGIN}) "), message
    assert says in message, message
    assert "\n" not in message
