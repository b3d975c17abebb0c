"""A dataset whose ``load()`` returns other data from one call to the next while its
provenance — and so the run id and the data fingerprint — stays the same.

It declares itself generated from its arguments, but every call also reads an integer from
``data.draw_file`` (left out of its provenance: the lie) and draws its arrays from it, as a
loader that reshuffles or re-augments on each call would. The tests edit that file between
runs to stand for such a draw.
"""

from dataclasses import dataclass
from pathlib import Path

import torch

from creditaudit.config import opt
from creditaudit.data import Dataset, GeneratedDataset
from creditaudit.data.registry import GeneratedOptions


@dataclass
class DriftingOptions(GeneratedOptions):
    dim: int = opt(8, "input dimension", min=1)
    draw_file: str = opt("draw.txt", "file holding the integer each load() draws from",
                         role="place")


class DriftingData(GeneratedDataset):
    name = "data-drifting"
    label = "drifting data"
    Options = DriftingOptions

    @classmethod
    def input_shape(cls, options):
        return (options.dim,)

    @classmethod
    def provenance(cls, options, seed):
        return {"generator": "data-drifting", "version": 1,
                "args": {"n_train": options.n_train, "n_test": options.n_test,
                         "dim": options.dim, "seed": seed}}

    @classmethod
    def load(cls, options, seed):
        draw = int(Path(options.draw_file).read_text().strip())
        generator = torch.Generator().manual_seed(seed * 1000 + draw)
        n = options.n_train + options.n_test
        x = torch.randn(n, options.dim, generator=generator)
        y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
        return Dataset(cls.name, x[:options.n_train], y[:options.n_train],
                       x[options.n_train:], y[options.n_train:], n_classes=10,
                       provenance=cls.provenance(options, seed))
