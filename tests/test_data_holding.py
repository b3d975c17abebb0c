"""Arrays a dataset loads that hold their values in an unusual way: refused in one line when
no value can be read (a sparse layout, the meta device) — not torch's own error from inside
creditaudit's checks, blamed on the plugin — and identified by their values when they can
(an inference-mode tensor, which keeps no version counter).
"""

from __future__ import annotations

import pytest
import torch

from creditaudit import RunConfig
from creditaudit.data import Dataset, check_loaded
from creditaudit.data.identity import tensor_digest
from creditaudit.errors import LoadedDataError
from creditaudit.run.plan import plan_run
from door_support import TINY
from plugin_support import one_module_plugin

pytestmark = pytest.mark.usefixtures("single_thread")


class _Spec:
    """What check_loaded asks of a dataset: its name, sample shape and classes."""

    name = "tiny"

    def input_shape(self) -> tuple[int, ...]:
        return (3,)

    def n_classes(self) -> int:
        return 2


def _data() -> Dataset:
    x, y = torch.arange(18.0).reshape(6, 3), torch.arange(6) % 2
    return Dataset("tiny", x[:4], y[:4], x[4:], y[4:], n_classes=2)


@pytest.mark.parametrize(("array", "how", "says"), [
    ("train_x", lambda a: a.to_sparse(), "the training samples of tiny are a sparse tensor "
                                         "(torch.sparse_coo), but every batch is indexed from "
                                         "dense arrays: give dense tensors (.to_dense())"),
    ("train_y", lambda a: a.to_sparse(), "the training labels of tiny are a sparse tensor"),
    ("test_x", lambda a: a.to("meta"), "the test samples of tiny are on the meta device, "
                                       "which holds shapes but no values: give tensors "
                                       "holding the data (on the CPU)"),
    ("test_y", lambda a: a.to("meta"), "the test labels of tiny are on the meta device"),
], ids=["sparse-samples", "sparse-labels", "meta-samples", "meta-labels"])
def test_arrays_holding_no_readable_values_are_refused_in_one_line(array, how, says):
    """Before: torch's NotImplementedError (a screen of backends) or 'Tensor.item() cannot
    be called on meta tensors', raised from creditaudit's finiteness and label checks."""
    data = _data()
    setattr(data, array, how(getattr(data, array)))
    with pytest.raises(LoadedDataError) as error:
        check_loaded(_Spec(), data)
    assert str(error.value).startswith(says), str(error.value)
    assert "\n" not in str(error.value)


def test_inference_tensors_are_digested_on_every_call():
    """They keep no version counter: content_digest raised torch's RuntimeError (a
    traceback when a run planned on them), and cannot cache their digest."""
    with torch.inference_mode():
        data = _data()
    plain = _data()
    assert data.content_digest() == plain.content_digest()
    with torch.inference_mode():
        data.test_x[0, 0] = -1.0  # an edit no version counter sees
    assert data.content_digest() != plain.content_digest()


DATASET = '''
import torch
from creditaudit.data import Dataset, GeneratedDataset
from creditaudit.data.registry import GeneratedOptions


class Inference(GeneratedDataset[GeneratedOptions]):
    name, label = "inference-data", "inference-mode arrays"

    def input_shape(self):
        return (8,)

    def n_classes(self):
        return 4

    def provenance(self, seed):
        o = self.options
        return {"generator": self.name, "version": 1,
                "args": {"n_train": o.n_train, "n_test": o.n_test, "seed": seed}}

    def load(self, seed):
        generator = torch.Generator().manual_seed(seed)
        n, cut = self.options.n_train + self.options.n_test, self.options.n_train
        with torch.inference_mode():
            y = torch.randint(0, 4, (n,), generator=generator)
            x = torch.randn(n, 8, generator=generator) + y[:, None].float()
        return Dataset(self.name, x[:cut], y[:cut], x[cut:], y[cut:], n_classes=4,
                       provenance=self.provenance(seed))
'''


def test_a_plugin_loading_inference_tensors_is_identified_by_their_values(tmp_path):
    """Before: ``RuntimeError: Inference tensors do not track version counter`` from
    content_digest, an internal error with a traceback, when the run's record was made."""
    with one_module_plugin(tmp_path / "site", "creditaudit.datasets",
                           "inference-data = inference_data:Inference",
                           {"inference_data": DATASET}):
        config = RunConfig().replace(**{**TINY, "data.name": "inference-data",
                                        "run.out_dir": str(tmp_path / "runs")})
        plan = plan_run(config)
        identity = plan.data_identity()
        data = plan.load_data()
        assert identity.arrays_sha256 == tensor_digest(
            data.train_x.clone(), data.train_y.clone(), data.test_x.clone(),
            data.test_y.clone())

