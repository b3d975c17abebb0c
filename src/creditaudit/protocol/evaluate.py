"""Running the protocol on precomputed gradients, and the report it gives.

:func:`evaluate_protocol` turns :class:`~creditaudit.measures.gradients.StateGradients`
(what training and :func:`creditaudit.audit.diagnose.diagnose` already have) into a
:class:`DiagnosticReport`: the four diagnostics, the verdict, and — when a credit is given —
the per-layer cosine table and Γ under its four aggregations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from creditaudit.descriptions import EpochMeasures
from creditaudit.errors import ConfigError
from creditaudit.files import strict_json
from creditaudit.measures.alignment import gamma_aggregations, layer_cosine_table
from creditaudit.measures.gradients import StateGradients, median_norms, zero_gradient_stats
from creditaudit.protocol.checks import (
    HEADLINE_GAMMA,
    NOT_EVALUATED,
    DiagnosticResult,
    Thresholds,
    unfounded,
)
from creditaudit.protocol.diagnostics import Evidence
from creditaudit.protocol.verdicts import Judgement, Protocol, judge, statuses_of
from creditaudit.scalar_values import recordable_number

CreditFn = Callable[[Tensor, Tensor], list[Tensor]]


@dataclass
class DiagnosticReport:
    """The protocol's outcome on one model and evaluation set.

    ``hidden_norms[l]``: median per-sample ‖h_l‖; ``grad_norms[l]``: median per-sample ‖g_l‖
    in the 1/128 scale convention (science.md §2), l = 0 … L. ``diagnostics``: (a)–(d) in order.
    ``layer_cosines``/``gamma``: present when a credit was given; ``metrics``: the
    credit-quality block when asked for; ``metadata``: model, method, n samples, thresholds,
    accuracies and whatever the caller added (dataset, seeds, epoch, …).
    """

    hidden_norms: list[float]
    grad_norms: list[float]
    diagnostics: list[DiagnosticResult]
    verdict: str
    fired: list[str]
    not_evaluated: list[str]
    layer_cosines: list[dict[str, Any]] | None = None
    gamma: dict[str, float] | None = None
    metrics: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def diagnostic(self, id_: str) -> DiagnosticResult:
        """The result of the diagnostic whose id is ``id_`` (KeyError if the report has
        none)."""
        for result in self.diagnostics:
            if result.id == id_:
                return result
        raise KeyError(id_)

    @property
    def reference(self) -> dict[str, Any] | None:
        """The reference gradient's check (``metadata["reference_check"]``: verified, how,
        detail, where), or None when the report's maker did not say."""
        return self.metadata.get("reference_check")

    @property
    def judgement(self) -> Judgement:
        """The verdict, its words and its colour, from the diagnostics' statuses and the
        reference's check (:func:`~creditaudit.protocol.verdicts.judge`)."""
        return judge(statuses_of(self.diagnostics), self.reference)

    def rejudge(self) -> None:
        """Set :attr:`verdict`, :attr:`fired` and :attr:`not_evaluated` again after a
        diagnostic's result or the reference check changed."""
        judged = self.judgement
        self.verdict = judged.verdict
        self.fired, self.not_evaluated = list(judged.fired), list(judged.not_evaluated)

    @property
    def verdict_text(self) -> str:
        """``"needs walk-back (a)(b)"``, ``"trustworthy"`` (all evaluated, none fired),
        ``"no walk-back in (a)–(c); (d) not evaluated"`` or ``"unverified: …"``
        (:attr:`judgement`)."""
        return self.judgement.text

    @property
    def headline_gamma(self) -> float | None:
        return None if self.gamma is None else self.gamma.get(HEADLINE_GAMMA)

    # --- serialisation --------------------------------------------------------------------
    def to_dict(self, *, norms: bool = True) -> dict[str, Any]:
        """A JSON-able dict (floats may be NaN/inf: :meth:`to_json` writes them as strict
        JSON, null plus a ``non_finite`` mark). ``norms=False`` leaves out the per-layer norms
        (a run record stores them once, in the epoch's entry)."""
        out = {
            "verdict": self.verdict,
            "fired": list(self.fired),
            "not_evaluated": list(self.not_evaluated),
            "diagnostics": {r.id: r.to_dict() for r in self.diagnostics},
            "hidden_norms": list(self.hidden_norms),
            "grad_norms": list(self.grad_norms),
            "layer_cosines": self.layer_cosines,
            "gamma": self.gamma,
            "metrics": self.metrics,
            "metadata": self.metadata,
        }
        if not norms:
            del out["hidden_norms"], out["grad_norms"]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, hidden_norms: list[float] | None = None,
                  grad_norms: list[float] | None = None) -> DiagnosticReport:
        """Rebuild a report from :meth:`to_dict` output (e.g. a run record's protocol block,
        whose norms come from the epoch's entry: ``hidden_norms``/``grad_norms``)."""
        results = [DiagnosticResult(**r) for r in data["diagnostics"].values()]
        verdict, fired, skipped = data["verdict"], data["fired"], data["not_evaluated"]
        if any(unfounded(r.status, r.value) for r in results):
            # written before statistics were checked: a pass without a number is none
            results = [_not_evaluated(r) if unfounded(r.status, r.value) else r
                       for r in results]
            judged = judge(statuses_of(results), data.get("metadata", {}).get("reference_check"))
            verdict, fired, skipped = judged.verdict, list(judged.fired), list(judged.not_evaluated)
        return cls(
            hidden_norms=list(data.get("hidden_norms", hidden_norms or [])),
            grad_norms=list(data.get("grad_norms", grad_norms or [])),
            diagnostics=results, verdict=verdict, fired=fired, not_evaluated=skipped,
            layer_cosines=data.get("layer_cosines"), gamma=data.get("gamma"),
            metrics=data.get("metrics"), metadata=data.get("metadata", {}),
        )

    def to_json(self, indent: int | None = 1) -> str:
        """Strict JSON (no NaN/Infinity tokens; see :mod:`creditaudit.files.strict_json`)."""
        return strict_json.dumps(self.to_dict(), indent=indent)

    @property
    def thresholds(self) -> Thresholds:
        return Thresholds.as_recorded(self.metadata.get("thresholds", {}))

    def __str__(self) -> str:
        """The verdict in words; :func:`creditaudit.report.render` gives the full tables."""
        return self.verdict_text


def _not_evaluated(result: DiagnosticResult) -> DiagnosticResult:
    """A stored result whose status its statistic cannot carry, read as not evaluated."""
    why = unfounded(result.status, result.value)
    return DiagnosticResult(result.id, result.name, None, result.threshold, NOT_EVALUATED,
                            f"{why} (it said {result.status!r}: {result.reason})",
                            {**result.details, "claimed": result.status})


# --- running it ---------------------------------------------------------------------------
def check_fraction(name: str, value: float | None) -> float | None:
    """``value`` as a float; a one-line ConfigError naming ``name`` unless it is None or an
    accuracy fraction in [0, 1]: a Python or numpy number, or a one-element tensor or array
    (what a loop's ``(pred == y).float().mean()`` gives; :func:`recordable_number`, as the
    Recorder takes them)."""
    if value is None:
        return None
    number = recordable_number(value)
    if number is None or not 0 <= number <= 1:
        raise ConfigError(f"{name}={value!r} must be an accuracy fraction in [0, 1] "
                          "(e.g. 0.349 for 34.9%)")
    return float(number)


def evaluate_protocol(sg: StateGradients, *, headline_acc: float | None,
                      frozen_acc: float | None, thresholds: Thresholds | None = None,
                      terminal_ln: bool | None = None, credits: Sequence[Tensor] | None = None,
                      metrics: dict[str, Any] | None = None,
                      metadata: dict[str, Any] | None = None,
                      protocol: Protocol | None = None,
                      measures: EpochMeasures | None = None,
                      reference: dict[str, Any] | None = None,
                      initial_hidden_norms: Sequence[float] | None = None,
                      trained: bool = True) -> DiagnosticReport:
    """The protocol's diagnostics from precomputed per-sample states and gradients.

    ``sg``: :class:`StateGradients` on the evaluation set (``(N, d)`` summaries, gradients
    in the 1/128 convention); ``measures``: the epoch's :class:`EpochMeasures` of the same
    set when they are at hand (their norms are used, not recomputed); ``headline_acc`` /
    ``frozen_acc``: test accuracies as fractions (None → (d) not evaluated);
    ``terminal_ln``: whether the model ends in a LayerNorm (None = unknown, used only to
    name (b)'s cause); ``credits``: optional ``(N, d)`` credit summaries per layer for the
    per-layer cosine table and Γ; ``protocol``: the diagnostics and their thresholds
    (default: the four built-ins with ``thresholds``, default the calibrated ones; given
    both, they must agree — a one-line ConfigError names a threshold they set apart);
    ``reference``: how the reference gradient of ``sg`` was checked (a check's
    ``to_dict()``; kept as ``metadata["reference_check"]`` and judged with the diagnostics
    — None: not stated);
    ``initial_hidden_norms``: the median ‖h_l‖ of the same network at initialisation on the
    same set, which lets (a) judge the segment before h_0; ``trained``: False for a network
    before any training step (a run's epoch 0), on which (d) — every diagnostic whose
    ``before_training`` is False — is not evaluated. Pure: no autograd, no RNG.
    """
    headline_acc = check_fraction("headline_acc", headline_acc)
    frozen_acc = check_fraction("frozen_acc", frozen_acc)
    if protocol is None:
        protocol = Protocol.default(thresholds)
    thresholds = protocol.agreeing(thresholds)  # what it judges by is what the report says
    if measures is None:
        hidden, grads = median_norms(sg.states), median_norms(sg.grads)
        zero_fraction, nonzero_median = zero_gradient_stats(sg.grads[-1])
    else:
        hidden = list(measures.hidden_norms)
        grads = list(measures.bp_grad_norms_per_sample_med)
        zero_fraction, nonzero_median = (measures.g_L_zero_fraction,
                                         measures.g_L_nonzero_median)
    evidence = Evidence(hidden_norms=hidden, grad_norms=grads, g_L_zero_fraction=zero_fraction,
                        g_L_nonzero_median=nonzero_median, grads=sg.grads, logits=sg.logits,
                        labels=sg.labels, losses=sg.losses,
                        headline_acc=headline_acc, frozen_acc=frozen_acc,
                        terminal_ln=terminal_ln,
                        initial_hidden_norms=(None if initial_hidden_norms is None
                                              else list(initial_hidden_norms)),
                        trained=trained)
    results = protocol.evaluate(evidence)
    meta = {"n_samples": int(sg.states[0].shape[0]), "layout": sg.layout,
            "terminal_ln": terminal_ln, "headline_acc": headline_acc, "frozen_acc": frozen_acc,
            "headline_gamma_aggregation": HEADLINE_GAMMA, "thresholds": thresholds.to_dict(),
            "protocol": protocol.to_dict()}
    meta.update(metadata or {})
    if reference is not None:
        meta["reference_check"] = dict(reference)
    table = gamma = None
    if credits is not None:
        table = layer_cosine_table(list(credits), sg.grads, thresholds.grad_floor)
        gamma = gamma_aggregations(list(credits), sg.grads)
    report = DiagnosticReport(hidden_norms=hidden, grad_norms=grads, diagnostics=results,
                              verdict="", fired=[], not_evaluated=[], layer_cosines=table,
                              gamma=gamma, metrics=metrics, metadata=meta)
    report.rejudge()
    return report
