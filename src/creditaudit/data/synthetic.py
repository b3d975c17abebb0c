"""The synthetic teacher–student task (science.md §3): needs no download.

A fixed random teacher maps Gaussian inputs through ``depth`` layers with the nonlinearity
φ_α(z) = (1−α)·z + α·tanh(z); the label is the argmax of its 10 logits. α = 0 makes the
teacher linear (a linearly separable task), α = 1 a tanh network.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def phi_alpha(z: Tensor, alpha: float) -> Tensor:
    """φ_α(z) = (1−α)·z + α·tanh(z), elementwise."""
    return (1.0 - alpha) * z + alpha * torch.tanh(z)


class Teacher:
    """A fixed random MLP ``in_dim → width (×depth) → n_classes`` with φ_α hidden units.

    Weights are N(0, gain²/fan_in) so pre-activations have variance ≈ gain² for unit-variance
    inputs. Gain 1 (the default) is the standard fan-in scaling; on this task it puts a
    d=256 L=4 ResidualMLP trained by BP near science.md §8's band (≈ 0.71 at epoch 8 with
    50k samples). Gain 2 saturates the tanh units and makes the task much harder.
    """

    def __init__(
        self,
        in_dim: int,
        n_classes: int,
        *,
        width: int,
        depth: int,
        alpha: float,
        generator: torch.Generator,
        gain: float = 1.0,
    ) -> None:
        dims = [in_dim] + [width] * depth + [n_classes]
        self.alpha = alpha
        self.weights = [
            torch.randn(fan_in, fan_out, generator=generator) * (gain / fan_in**0.5)
            for fan_in, fan_out in zip(dims[:-1], dims[1:])
        ]

    def logits(self, x: Tensor) -> Tensor:
        """(N, in_dim) → (N, n_classes)."""
        h = x
        for w in self.weights[:-1]:
            h = phi_alpha(h @ w, self.alpha)
        return h @ self.weights[-1]


def make_teacher_student(
    *,
    n_train: int,
    n_test: int,
    in_dim: int,
    alpha: float,
    seed: int,
    n_classes: int = 10,
    teacher_width: int = 256,
    teacher_depth: int = 2,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Generate (train_x, train_y, test_x, test_y): float32 (N, in_dim) and int64 (N,).

    Deterministic per ``seed`` (its own generator; torch's global RNG is untouched). The
    teacher and the inputs use separate streams so that changing ``n_train`` does not change
    the teacher.
    """
    teacher_gen = torch.Generator().manual_seed(seed)
    input_gen = torch.Generator().manual_seed(seed + 1_000_003)
    teacher = Teacher(
        in_dim, n_classes, width=teacher_width, depth=teacher_depth, alpha=alpha,
        generator=teacher_gen,
    )
    x = torch.randn(n_train + n_test, in_dim, generator=input_gen)
    with torch.no_grad():
        y = teacher.logits(x).argmax(dim=1)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


GENERATOR = "creditaudit.data.make_teacher_student/1"  # bump when the generated arrays change


def synthetic_provenance(n_train: int, n_test: int, in_dim: int, alpha: float, seed: int,
                         teacher_width: int, teacher_depth: int) -> dict[str, Any]:
    """What determines the teacher–student arrays: ``{"generator", "args"}`` (``args`` are
    :func:`make_teacher_student`'s keyword arguments)."""
    return {"generator": GENERATOR,
            "args": {"n_train": n_train, "n_test": n_test, "in_dim": in_dim, "alpha": alpha,
                     "seed": seed, "teacher_width": teacher_width,
                     "teacher_depth": teacher_depth}}
