"""The fresh-B null: how much deep alignment random feedback gives by chance (science.md §6).

A feedback rule's deep cosine only means something against the distribution of the same
statistic under feedback matrices the network never trained with. This module recomputes
the deep cosine with ``n`` fresh draws of the rule's feedback (same shapes, same scale) and
reports where the training matrices' value sits in that distribution.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import Tensor

from creditaudit.deep_layers import deep_mean
from creditaudit.errors import ConfigError
from creditaudit.measures.alignment import ReferenceDirections
from creditaudit.measures.epoch import rule_credits
from creditaudit.measures.gradients import state_gradients
from creditaudit.measures.progress import Clock, Say, StageProgress
from creditaudit.methods.base import CreditRule
from creditaudit.models.contract import summary_vectors

DEFAULT_NULL_SEED = 7919


def has_feedback(rule: object) -> bool:
    """True for rules with fixed random feedback (``feedback_kind == "fixed_random"``)."""
    return getattr(rule, "feedback_kind", "none") == "fixed_random"


def fresh_feedback_null(rule: CreditRule, x: Tensor, y: Tensor, n: int = 20,
                        seed: int = DEFAULT_NULL_SEED, *, grads: list[Tensor] | None = None,
                        credits: list[Tensor] | None = None, chunk: int | None = None,
                        progress: Say | None = None, clock: Clock = time.perf_counter
                        ) -> dict[str, Any]:
    """Deep cosine with ``n`` freshly drawn feedback sets vs the training feedback.

    ``x`` ``(N, …)`` inputs, ``y`` ``(N,)`` labels. The fresh feedback comes from the rule's
    own :meth:`~creditaudit.methods.CreditRule.draw_feedback` (same shapes and scale as its
    training feedback), with a generator seeded by ``seed``: the global RNG is never
    touched. The rule's own feedback is restored afterwards, also when a draw fails
    (:meth:`~creditaudit.methods.CreditRule.using_feedback`). ``grads``: the reference
    gradients' summaries on ``x`` when already computed (any positive scale per sample);
    ``credits``: the training feedback's credit summaries on ``x`` when already computed.

    ``chunk``: samples per pass (default all N at once). Each chunk draws the same ``n``
    feedback sets again from a generator seeded ``seed``, so the cosines, taken over all N
    samples at the end, do not depend on it. ``progress`` (e.g. ``print``) gets the
    samples done and the ETA at most every ``PROGRESS_SECONDS``.

    Returns ``{"mean", "std", "values", "training_value", "z", "n", "seed"}``: mean and
    (unbiased, n−1) std of the deep cosine over the draws, every draw's value, the deep
    cosine with the training matrices, and z = (training − mean) / std (NaN when std = 0).
    Raises ConfigError for rules without fixed random feedback (BP, frozen, bridges).
    """
    if not has_feedback(rule):
        raise ConfigError(f"method {getattr(rule, 'name', type(rule).__name__)!r} has no "
                          "fixed random feedback: the fresh-feedback null applies to rules "
                          "whose feedback is drawn once and never trained (FA, DFA, …)")
    if n < 2:
        raise ConfigError(f"the fresh-B null needs n >= 2 draws for a spread, got n={n}")
    # Cosines are scale-free, so the 1/128-scaled gradients serve as the reference as-is.
    if grads is None:
        grads = state_gradients(rule.model.forward_states, x, y).grads
    reference = ReferenceDirections(grads)
    if credits is None:
        credits = rule_credits(rule, x, y)
    training_value = deep_mean(reference.cosines(credits))
    total = int(x.shape[0])
    chunk = total if chunk is None else max(1, chunk)
    progress_ = StageProgress(progress, "fresh-feedback null", total, clock=clock)
    summaries: list[list[list[Tensor]]] = [[] for _ in range(n)]  # draw → chunk → layers
    for start in range(0, total, chunk):
        xb, yb = x[start:start + chunk], y[start:start + chunk]
        generator = torch.Generator().manual_seed(seed)
        draws = (rule.draw_feedback(generator) for _ in range(n))
        for index, draw_credits in enumerate(rule.credits_under(xb, yb, draws)):
            summaries[index].append([summary_vectors(a) for a in draw_credits])
        progress_.update(min(start + chunk, total), clock())
    values = [deep_mean(reference.cosines(_joined(parts))) for parts in summaries]
    tensor = torch.tensor(values, dtype=torch.float64, device="cpu")
    mean, std = float(tensor.mean()), float(tensor.std(unbiased=True))
    z = (training_value - mean) / std if std > 0 and math.isfinite(std) else float("nan")
    return {"mean": mean, "std": std, "values": values, "training_value": training_value,
            "z": z, "n": n, "seed": seed}


def _joined(parts: list[list[Tensor]]) -> list[Tensor]:
    """Per layer, the chunks' summaries one after another (one chunk: as it is)."""
    if len(parts) == 1:
        return parts[0]
    return [torch.cat([p[layer] for p in parts]) for layer in range(len(parts[0]))]
