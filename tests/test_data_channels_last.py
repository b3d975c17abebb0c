"""Images given channels-last, (N, H, W, C), are refused with the fix that fits them —
permute them to (N, C, H, W) — not advice that would have them trained as H-channel images
(one mean and std per row of pixels) or blame the data folder."""

from __future__ import annotations

import pytest
import torch

from creditaudit.config import bind
from creditaudit.data import Dataset, GeneratedDataset, load_dataset
from creditaudit.data.registry import GeneratedOptions
from creditaudit.errors import LoadedDataError


class ChannelsLast(GeneratedDataset[GeneratedOptions]):
    """Grey 8×8 images loaded as (N, 8, 8, 1), declared as ``declared``."""

    name, label = "channels-last", "Channels last"
    declared: tuple[int, ...] = (8, 8, 1)

    def input_shape(self):
        return self.declared

    def n_classes(self):
        return 2

    def provenance(self, seed):
        options = self.options
        return {"generator": self.name, "version": 1,
                "args": {"n_train": options.n_train, "n_test": options.n_test, "seed": seed}}

    def load(self, seed):
        options, generator = self.options, torch.Generator().manual_seed(seed)
        n = options.n_train + options.n_test
        x = torch.randint(0, 256, (n, 8, 8, 1), dtype=torch.uint8, generator=generator)
        y = torch.randint(0, 2, (n,), generator=generator)
        cut = options.n_train
        return Dataset(self.name, x[:cut], y[:cut], x[cut:], y[cut:], n_classes=2,
                       mean=(0.5,), std=(0.25,), provenance=self.provenance(seed))


class DeclaredChannelsFirst(ChannelsLast):
    name, declared = "declared-channels-first", (1, 8, 8)


@pytest.mark.parametrize("cls,says", [
    (ChannelsLast, "channels-last loaded 8-channel images with mean=(0.5,) and std=(0.25,): "
                   "mean/std need one value per channel (8), got 1 and 1; its images look "
                   "channels-last, (N, H, W, 1): give images as (N, C, H, W)"),
    (DeclaredChannelsFirst, "the training samples of declared-channels-first have shape "
                            "(8, 8, 1), but declared-channels-first declares (1, 8, 8): give "
                            "images as (N, C, H, W) — x.permute(0, 3, 1, 2)"),
], ids=["declared-channels-last", "declared-channels-first"])
def test_channels_last_images_are_refused_with_their_fix(cls, says):
    options = bind(cls, "data", n_train=40, n_test=20)
    with pytest.raises(LoadedDataError) as error:
        load_dataset(options, seed=0, spec=cls(options))
    assert str(error.value).startswith(says), error.value


class TinyChannelsFirst(ChannelsLast):
    """Grey 3×3 images, channels-first (N, 1, 3, 3), given a 3-value mean and std."""

    name, declared = "tiny-channels-first", (1, 3, 3)

    def load(self, seed):
        options, generator = self.options, torch.Generator().manual_seed(seed)
        n = options.n_train + options.n_test
        x = torch.randint(0, 256, (n, 1, 3, 3), dtype=torch.uint8, generator=generator)
        y = torch.randint(0, 2, (n,), generator=generator)
        cut = options.n_train
        return Dataset(self.name, x[:cut], y[:cut], x[cut:], y[cut:], n_classes=2,
                       mean=(0.5,) * 3, std=(0.25,) * 3, provenance=self.provenance(seed))


def test_channels_first_images_as_wide_as_the_mean_are_not_told_they_look_channels_last():
    """3×3 grey images given a colour mean: the last side equals the mean's length, and the
    hint said "its images look channels-last, (N, H, W, 3)" of (N, 1, 3, 3) arrays. The
    layout is ambiguous: the fix asks for one value per declared channel first, and names
    the permutation only as the fix of channels-last arrays."""
    options = bind(TinyChannelsFirst, "data", n_train=40, n_test=20)
    with pytest.raises(LoadedDataError) as error:
        load_dataset(options, seed=0, spec=TinyChannelsFirst(options))
    assert str(error.value) == (
        "tiny-channels-first loaded 1-channel images with mean=(0.5, 0.5, 0.5) and "
        "std=(0.25, 0.25, 0.25): mean/std need one value per channel (1), got 3 and 3; set "
        "mean and std, one value per channel (1) of the [0, 1]-scaled pixels (a FileDataset: "
        "its class attributes mean and std; a Dataset built by hand: Dataset(..., mean=..., "
        "std=...)); or, if they are channels-last images (N, H, W, 3), give images as (N, C, "
        "H, W) — x.permute(0, 3, 1, 2) of (N, H, W, C) arrays — and declare input_shape() "
        "(C, H, W)")
