"""Batched transforms and the in-memory loader: exact values, determinism, RNG hygiene."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from creditaudit.data.loader import InMemoryLoader
from creditaudit.data.transforms import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    normalize,
    random_crop_flip,
)


def _images(n: int = 16, c: int = 3, h: int = 8, w: int = 6, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, c, h, w), generator=g, dtype=torch.uint8)


def test_normalize_matches_hand_computation() -> None:
    x = torch.tensor([[[[0, 255]], [[51, 102]], [[128, 7]]]], dtype=torch.uint8)  # (1,3,1,2)
    out = normalize(x, CIFAR10_MEAN, CIFAR10_STD)
    assert out.dtype == torch.float32 and out.shape == (1, 3, 1, 2)
    for c in range(3):
        for j in range(2):
            want = (x[0, c, 0, j].item() / 255.0 - CIFAR10_MEAN[c]) / CIFAR10_STD[c]
            assert out[0, c, 0, j].item() == pytest.approx(want, abs=1e-6)


def test_normalize_rejects_wrong_channel_count() -> None:
    with pytest.raises(ValueError, match="per channel"):
        normalize(_images(c=1), CIFAR10_MEAN, CIFAR10_STD)


def test_crop_with_zero_padding_never_shifts() -> None:
    x = _images()
    g = torch.Generator().manual_seed(3)
    out = random_crop_flip(x, g, padding=0)
    g = torch.Generator().manual_seed(3)
    torch.randint(0, 1, (16,), generator=g)
    torch.randint(0, 1, (16,), generator=g)
    flip = torch.rand(16, generator=g) < 0.5
    assert 0 < int(flip.sum()) < 16  # both branches are exercised
    assert torch.equal(out[~flip], x[~flip])
    assert torch.equal(out[flip], x[flip].flip(-1))


def test_crop_flip_equals_manual_window_of_padded_image() -> None:
    x = _images(n=32)
    pad = 4
    out = random_crop_flip(x, torch.Generator().manual_seed(11), padding=pad)
    g = torch.Generator().manual_seed(11)
    rows = torch.randint(0, 2 * pad + 1, (32,), generator=g)
    cols = torch.randint(0, 2 * pad + 1, (32,), generator=g)
    flip = torch.rand(32, generator=g) < 0.5
    padded = F.pad(x, (pad, pad, pad, pad))
    h, w = x.shape[-2:]
    for b in range(32):
        window = padded[b, :, rows[b] : rows[b] + h, cols[b] : cols[b] + w]
        want = window.flip(-1) if flip[b] else window
        assert torch.equal(out[b], want), b
    # With 32 draws from 9 offsets the shift varies, so a no-op crop would have failed above.
    assert len(set(rows.tolist())) > 1 and len(set(cols.tolist())) > 1
    assert out.dtype == torch.uint8 and out.shape == x.shape


def test_crop_pads_with_zeros_at_extreme_offset() -> None:
    x = torch.full((64, 1, 5, 5), 200, dtype=torch.uint8)
    out = random_crop_flip(x, torch.Generator().manual_seed(0), padding=2)
    # Some sample is shifted, so some zeros appear; no value other than 0 or 200 may appear.
    assert set(out.unique().tolist()) == {0, 200}


def test_crop_flip_is_deterministic_per_seed_and_varies_across_seeds() -> None:
    x = _images(n=64)
    a = random_crop_flip(x, torch.Generator().manual_seed(5))
    b = random_crop_flip(x, torch.Generator().manual_seed(5))
    c = random_crop_flip(x, torch.Generator().manual_seed(6))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_crop_flip_empty_batch() -> None:
    x = _images(n=0)
    assert random_crop_flip(x, torch.Generator()).shape == x.shape


def test_crop_flip_works_on_float_input() -> None:
    x = _images().float()
    out = random_crop_flip(x, torch.Generator().manual_seed(1), padding=0)
    assert out.dtype == torch.float32 and out.shape == x.shape


# ---------------------------------------------------------------------------------------------
# loader


def _labels(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.int64)


def test_loader_shuffle_covers_every_index_once() -> None:
    n = 103
    x = torch.arange(n, dtype=torch.float32)[:, None].repeat(1, 4)
    loader = InMemoryLoader(x, _labels(n), 10, shuffle=True, generator=torch.Generator())
    assert len(loader) == 11 and loader.n_samples == n
    seen = []
    for xb, yb in loader:
        assert torch.equal(xb[:, 0].long(), yb)  # rows stay paired with their labels
        seen += yb.tolist()
    assert sorted(seen) == list(range(n))
    assert seen != list(range(n))


def test_loader_epochs_draw_fresh_permutations_and_replay_from_seed() -> None:
    n = 50
    x = torch.randn(n, 3)

    def epochs(seed: int) -> list[list[int]]:
        loader = InMemoryLoader(
            x, _labels(n), 7, shuffle=True, generator=torch.Generator().manual_seed(seed)
        )
        return [[i for _, yb in loader for i in yb.tolist()] for _ in range(2)]

    first, second = epochs(1)
    assert first != second
    assert epochs(1) == [first, second]


def test_loader_without_shuffle_keeps_order_and_drop_last() -> None:
    n = 25
    x = torch.randn(n, 2)
    loader = InMemoryLoader(x, _labels(n), 10, shuffle=False, drop_last=True)
    batches = list(loader)
    assert len(loader) == len(batches) == 2
    assert torch.equal(torch.cat([b[0] for b in batches]), x[:20])  # features unchanged


def test_loader_images_augment_normalise_flatten() -> None:
    x = _images(n=20, c=3, h=8, w=8)
    y = _labels(20)
    loader = InMemoryLoader(
        x,
        y,
        8,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
        augment=True,
        mean=CIFAR10_MEAN,
        std=CIFAR10_STD,
        flatten=True,
    )
    batches = list(loader)
    assert [b[0].shape for b in batches] == [(8, 192), (8, 192), (4, 192)]
    assert all(b[0].dtype == torch.float32 for b in batches)

    # Replaying the generator draws by hand reproduces the first batch exactly.
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(20, generator=g)
    idx = perm[:8]
    want = normalize(random_crop_flip(x[idx], g), CIFAR10_MEAN, CIFAR10_STD).reshape(8, -1)
    assert torch.equal(batches[0][1], y[idx])
    assert torch.equal(batches[0][0], want)


def test_loader_images_without_stats_scale_to_unit_interval() -> None:
    x = _images(n=4)
    ((xb, _),) = list(InMemoryLoader(x, _labels(4), 4, shuffle=False))
    assert torch.equal(xb, x.float() / 255)


@pytest.mark.parametrize("stats", [True, False], ids=["normalised", "scaled"])
def test_images_become_inputs_in_the_default_dtype_models_are_built_in(stats: bool) -> None:
    """A caller's float64 default dtype builds float64 models, and features must be float64
    then: images come out of the loader (and of normalize()) in it too (they were float32,
    and a float64 run on any image dataset stopped at its first forward with torch's
    'mat1 and mat2 must have the same dtype'), to float64 rounding of the formula."""
    x = _images(n=6, c=3, h=4, w=4)
    given = {"mean": CIFAR10_MEAN, "std": CIFAR10_STD} if stats else {}
    exact = x.double() / 255
    if stats:
        exact = (exact - torch.tensor(CIFAR10_MEAN, dtype=torch.float64).view(1, -1, 1, 1)) \
            / torch.tensor(CIFAR10_STD, dtype=torch.float64).view(1, -1, 1, 1)
    torch.set_default_dtype(torch.float64)
    try:
        ((xb, _),) = list(InMemoryLoader(x, _labels(6), 6, shuffle=False, **given))
        inputs = [xb, normalize(x, CIFAR10_MEAN, CIFAR10_STD)] if stats else [xb]
    finally:
        torch.set_default_dtype(torch.float32)
    for got in inputs:
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, exact, rtol=0, atol=1e-13)
    ((xb32, _),) = list(InMemoryLoader(x, _labels(6), 6, shuffle=False, **given))
    assert xb32.dtype == torch.float32  # float32 models' inputs, as before


def test_loader_same_seed_same_batches_and_global_rng_untouched() -> None:
    x = _images(n=40, h=8, w=8)
    y = _labels(40)

    def run(seed: int) -> list[torch.Tensor]:
        loader = InMemoryLoader(
            x,
            y,
            16,
            shuffle=True,
            generator=torch.Generator().manual_seed(seed),
            augment=True,
            mean=CIFAR10_MEAN,
            std=CIFAR10_STD,
        )
        return [t for batch in loader for t in batch]

    state = torch.get_rng_state()
    a = run(9)
    assert torch.equal(torch.get_rng_state(), state)
    b = run(9)
    assert all(torch.equal(p, q) for p, q in zip(a, b))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"shuffle": True}, "generator"),
        ({"shuffle": False, "augment": True}, "generator"),
        ({"shuffle": False, "mean": (0.5,)}, "both mean and std"),
        ({"shuffle": False, "mean": CIFAR10_MEAN, "std": CIFAR10_STD}, "per channel"),
    ],
)
def test_loader_rejects_bad_image_options(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        InMemoryLoader(_images(n=4, c=1), _labels(4), 2, **kwargs)


def test_loader_rejects_augment_on_features() -> None:
    with pytest.raises(ValueError, match="augment"):
        InMemoryLoader(
            torch.randn(4, 3),
            _labels(4),
            2,
            shuffle=False,
            augment=True,
            generator=torch.Generator(),
        )


def test_loader_rejects_mismatched_labels() -> None:
    with pytest.raises(ValueError, match="y must be"):
        InMemoryLoader(torch.randn(4, 3), _labels(5), 2, shuffle=False)
