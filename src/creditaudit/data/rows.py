"""Are given arrays samples of a dataset's test split? What a record may claim about them;
and is a test split held out from the training split at all (:func:`shared_samples`)?

A run recorded from a user's own loop (:class:`creditaudit.Recorder`) that names a dataset
creditaudit knows is stamped with that dataset's identity, so its evaluation arrays must be
test samples of it as loaded: :func:`check_test_rows` refuses them otherwise. The arrays
reach the Recorder model-ready — normalised by the user's own constants, flattened or not,
in any order, any subset — so rows are compared up to a per-sample, per-channel affine map:
each channel of each sample is centred and scaled to unit norm (what any
``(x − mean) / std`` normalisation leaves unchanged), and a row matches a test sample when
the cosine of the two standardised rows is within :data:`MATCH_TOLERANCE` of 1 and the
labels are equal. Two different natural images almost never come that close; an augmented
(cropped, flipped, noised) or unrelated row does not.

Cost: candidates are found in 16 random directions, then four per row compared in full.
For 1280 rows against Fashion-MNIST's 10 000 test images (784 values each) it took 1.3 s
on this project's 2 shared cores under a load average of 6 (3.4 s under 19; comparing every
pair in full took 2.5 s under 6), besides loading the dataset (0.6 s).

A test split held out only in its bytes — the training rows with a little noise added — is
caught by :func:`near_copies`: a sample of the test rows that are no exact copy (those are
counted over the whole split: rows of discrete features repeat honestly) is compared with
every training row, and a row lying far nearer to a training row of its own label than
training rows lie to each other (:data:`NEAR_RATIO` of their median nearest-neighbour
distance) is a near copy. Honest test rows lie about as far from the training split as its
rows from each other (measured, the smallest ratio of 256 sampled test rows: Fashion-MNIST
0.46, MNIST 0.29, optdigits and scikit-learn's digits 0.50, MNIST-1D 0.68, the
teacher–student task 0.91, uniform CIFAR-shaped images 0.98; under 0.2: none, but 2 % of the
teacher's rows at ``in_dim=2`` and 11 % at ``in_dim=1``, so a split of few test rows is
refused only on more near copies than chance gives: :func:`by_chance`), a copy with ±1 grey
level of noise at 0.02 and ±8 levels at 0.11, features plus 1e-6 noise at ~0. Distances are
float64 (in float32 the matrix-product form of ``cdist`` lost neighbours 5e-5 apart at norms
~1). Cost: one pass over the training split, :data:`NEAR_SAMPLE` test and as many training
rows compared with each — for Fashion-MNIST's 60 000 images 0.14 s on this project's 2 idle
cores (0.23 s on one thread; the exact check 0.08 s).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from creditaudit.data.dataset import Dataset
from creditaudit.errors import DataError

# A row matches a test sample when the cosine of the standardised rows is ≥ 1 − this
# (float32 round-off of a 3072-value product is ~1e-6; distinct images stay far below).
MATCH_TOLERANCE = 1e-4
CHUNK = 2048  # samples standardised and compared at a time (bounded memory)
PROJECTIONS = 16  # random directions the candidates are found in
CANDIDATES = 4  # nearest test samples compared in full (duplicates in a test split exist)
# The share of test samples that may also be training samples (exact duplicates of input and
# label): real datasets hold a few, a test split that is (part of) the training split more.
HELD_OUT_SHARE = 0.5
# A test row nearer than this share of the training split's median nearest-neighbour
# distance to a training row of its label is a near copy of it (see the module docstring).
NEAR_RATIO = 0.2
NEAR_SAMPLE = 32  # test rows checked for near copies, and training rows giving the scale
# The share of an honest split's test rows that may lie that near by chance (features of one
# dimension: 13–21 % measured, the teacher at n_train 2–60 000), and how rarely the near
# copies counted may come from it before a split is refused: 1 of 1 or 3 of 5 near rows is
# chance, 5 of 5 or 17 of 32 is not (so ≤ 4 test rows never decide).
NEAR_CHANCE = 0.25
NEAR_FALSE_ALARM = 1e-3
# The conformance check of it, by its name (what a dataset declares in expected_failures
# when its inputs repeat by design).
HELD_OUT_CHECK = "test_split_is_held_out"


def shared_samples(train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor) -> int:
    """How many test samples ``(test_x[i], test_y[i])`` are also training samples: the same
    input bytes and the same label (x: ``(N, …)``, y: ``(N,)``)."""
    return int(_shared_mask(train_x, train_y, test_x, test_y).sum())


def _shared_mask(train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor) -> Tensor:
    """``(N_test,)`` bool: whether each test sample is also a training sample (bytes and
    label)."""
    seen = set(_sample_keys(train_x, train_y))
    return torch.tensor([key in seen for key in _sample_keys(test_x, test_y)],
                        dtype=torch.bool)


def near_copies(train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor
                ) -> tuple[int, int]:
    """(near copies, test rows checked): of up to :data:`NEAR_SAMPLE` test rows drawn at
    random (a fixed draw of its own generator: the global RNGs are left alone), how many lie
    within :data:`NEAR_RATIO` × the typical distance between training rows (the median, over
    as many drawn training rows, of the distance to their nearest other training row) of a
    training row with the same label. x: ``(N, …)`` of any real dtype, y: ``(N,)``; (0, 0)
    with fewer than 2 training rows or no finite scale (nothing to compare with)."""
    n_train, n_test = int(train_x.shape[0]), int(test_x.shape[0])
    if n_train < 2 or n_test == 0:
        return 0, 0
    generator = torch.Generator().manual_seed(0)
    tests = torch.randperm(n_test, generator=generator)[:NEAR_SAMPLE]
    trains = torch.randperm(n_train, generator=generator)[:NEAR_SAMPLE]
    train_rows = train_x.detach().reshape(n_train, -1)
    queries = torch.cat([_float_rows(test_x.detach()[tests.to(test_x.device)]),
                         _float_rows(train_rows[trains.to(train_x.device)])])
    # in float64, centred on the drawn training rows: cdist's matrix-product form loses
    # distances that are small beside the rows' norms (float32 lost the teacher's in_dim=1
    # neighbours, 5e-5 apart at norms ~1, and read 56 of 64 honest rows as copies)
    centre = queries[tests.numel():].mean(dim=0)
    queries -= centre
    nearest = torch.full((queries.shape[0],), math.inf, dtype=queries.dtype)
    which = torch.zeros(queries.shape[0], dtype=torch.long)
    drawn = torch.arange(tests.numel(), queries.shape[0])  # the training queries' rows
    for start in range(0, n_train, CHUNK):
        distance = torch.cdist(queries, _float_rows(train_rows[start:start + CHUNK]) - centre)
        own = trains - start  # a drawn training row is not its own neighbour
        inside = (own >= 0) & (own < distance.shape[1])
        distance[drawn[inside], own[inside]] = math.inf
        closest, at = distance.min(dim=1)
        closer = closest < nearest
        nearest[closer], which[closer] = closest[closer], at[closer] + start
    scale = nearest[tests.numel():].median()
    if not bool(torch.isfinite(scale)):
        return 0, 0
    labels = train_y.detach().cpu()[which[:tests.numel()]]
    near = (nearest[:tests.numel()] <= NEAR_RATIO * scale) & (
        labels == test_y.detach().cpu()[tests])
    return int(near.sum()), int(tests.numel())


def by_chance(near: int, checked: int) -> float:
    """The probability that ``near`` or more of ``checked`` honest test rows lie that near a
    training row by chance, each with probability :data:`NEAR_CHANCE` (a binomial tail): a
    split of few test rows says little (its only row of one-dimensional features is near with
    probability ~1/5, and was refused)."""
    return sum(math.comb(checked, k) * NEAR_CHANCE ** k * (1 - NEAR_CHANCE) ** (checked - k)
               for k in range(max(near, 0), checked + 1))


def _float_rows(x: Tensor) -> Tensor:
    """``x`` ``(N, …)`` as float64 rows ``(N, D)`` on the CPU."""
    return x.reshape(x.shape[0], -1).to("cpu", torch.float64)


def held_out_problem(train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor, *,
                     files: str | None = None) -> str | None:
    """Why the test split is not held out — more than :data:`HELD_OUT_SHARE` of its samples
    are also training samples (:func:`shared_samples`), or those and near copies of them
    (:func:`near_copies` of the others, the share of the test rows checked, and more than
    chance gives: :func:`by_chance` under :data:`NEAR_FALSE_ALARM`) — as a sentence with its
    fix; None when it is. ``files``: how a data folder's files the test split was read from
    are named (e.g. "the t10k files"): the sentence names them and asks for the held-out
    split in that folder; None: it asks for code that loads the held-out split."""
    if files is None:
        samples, same, fix = "test samples (inputs and labels)", "", (
            ": the test accuracy would measure memorisation, not generalisation; load the "
            "held-out split as the test split (a dataset whose inputs repeat by design "
            f"declares {HELD_OUT_CHECK} in expected_failures)")
    else:
        samples, same, fix = f"test samples ({files})", " (same image and label)", (
            ", so the test accuracy would measure memorisation: put the held-out test split "
            "there")
    exact = _shared_mask(train_x, train_y, test_x, test_y)
    shared, n_test = int(exact.sum()), int(test_x.shape[0])
    if shared > HELD_OUT_SHARE * n_test:
        return f"{shared} of the {n_test} {samples} are also training samples{same}{fix}"
    # the exact copies are counted above, over the whole split (data of discrete features
    # repeats honestly: bag-of-words rows); the near ones among the others, by a sample
    others = (~exact).nonzero().flatten()
    near, checked = near_copies(train_x, train_y, test_x[others.to(test_x.device)],
                                test_y[others.to(test_y.device)])
    share = shared / n_test + (near / checked * others.numel() / n_test if checked else 0.0)
    if share > HELD_OUT_SHARE and by_chance(near, checked) < NEAR_FALSE_ALARM:
        return (f"{near} of {checked} test samples checked"
                + (f" ({files})" if files is not None else "")
                + " are near copies of training samples (a training sample of the same label "
                f"within {NEAR_RATIO:g} × the typical distance between neighbouring training "
                "samples, e.g. the training samples with a little noise added)"
                + (f", besides {shared} of the {n_test} that are training samples{same}"
                   if shared else "") + fix)
    return None


def _sample_keys(x: Tensor, y: Tensor) -> list[tuple[int, int]]:
    """One hash per sample: of its input's bytes (read as bytes: numpy has no bfloat16), and
    its label."""
    rows = x.detach().cpu().reshape(x.shape[0], math.prod(x.shape[1:])).contiguous()
    rows = rows.view(torch.uint8).numpy()
    return [(hash(row.tobytes()), int(label)) for row, label in zip(rows, y.tolist())]


def standardised(x: Tensor, channels: int) -> Tensor:
    """(N, D) float32 rows of ``x`` ``(N, …)``: each of the ``channels`` equal slices of a
    row centred and scaled to unit norm, the row then divided by √channels (unit norm
    overall; a constant channel contributes zeros)."""
    rows = x.detach().to("cpu", torch.float32).reshape(x.shape[0], channels, -1)
    rows = rows - rows.mean(dim=2, keepdim=True)
    norms = torch.linalg.vector_norm(rows, dim=2, keepdim=True)
    rows = torch.where(norms > 0, rows / norms.clamp_min(1e-30), torch.zeros_like(rows))
    return rows.reshape(x.shape[0], -1) / math.sqrt(channels)


def check_test_rows(dataset: Dataset, x: Tensor, y: Tensor, label: str) -> None:
    """DataError (one line) unless every ``(x[i], y[i])`` is a sample of ``dataset``'s test
    split (up to normalisation; see the module docstring). ``x``: ``(N, …)`` with as many
    values per sample as the dataset's (flattened or not); ``y``: ``(N,)`` labels;
    ``label``: how the message names the dataset."""
    shape = dataset.input_shape
    values = math.prod(shape)
    if x.dim() < 1 or math.prod(x.shape[1:]) != values:
        raise DataError(f"eval_x holds samples of shape {tuple(x.shape[1:])}, but {label} "
                        f"samples are {shape} ({values} values): pass samples of its test split")
    channels = shape[0] if len(shape) == 3 else 1  # images: per colour channel
    rows, labels = standardised(x, channels), y.detach().to("cpu")
    # Candidates first, by nearness in a few random directions (a sample and its copy
    # coincide there; cheap), then each candidate compared in full.
    directions = torch.randn(values, PROJECTIONS, generator=torch.Generator().manual_seed(0))
    test_x, test_y = dataset.test_x, dataset.test_y.to("cpu")
    projected = torch.cat([standardised(test_x[i:i + CHUNK], channels) @ directions
                           for i in range(0, test_x.shape[0], CHUNK)])
    matched = torch.zeros(rows.shape[0], dtype=torch.bool)
    for i in range(0, rows.shape[0], CHUNK):
        part = rows[i:i + CHUNK]
        distance = torch.cdist(part @ directions, projected)
        near = distance.topk(min(CANDIDATES, projected.shape[0]), largest=False).indices
        for j in range(near.shape[1]):
            candidate = standardised(test_x[near[:, j].to(test_x.device)], channels)
            same = (part * candidate).sum(dim=1) >= 1.0 - MATCH_TOLERANCE
            constant = (part.abs().sum(dim=1) == 0) & (candidate.abs().sum(dim=1) == 0)
            matched[i:i + CHUNK] |= (same | constant) & (test_y[near[:, j]] == labels[i:i + CHUNK])
    missing = (~matched).nonzero().flatten()
    if missing.numel():
        raise DataError(
            f"data names {label}, but {missing.numel()} of {rows.shape[0]} evaluation samples "
            f"(e.g. row {int(missing[0])}) are no sample of its test split as loaded with "
            "these options (same values up to normalisation, same label): pass rows of that "
            "test split, or name data of your own (data='my-data')")


__all__ = ["check_test_rows", "standardised", "MATCH_TOLERANCE", "HELD_OUT_SHARE",
           "shared_samples", "near_copies", "held_out_problem",
           "HELD_OUT_CHECK", "NEAR_RATIO", "NEAR_SAMPLE", "NEAR_CHANCE", "NEAR_FALSE_ALARM",
           "by_chance"]
