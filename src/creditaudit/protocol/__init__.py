"""The four-diagnostic protocol (science.md §5): can a run's headline numbers be trusted?

=====  ===============================  =============================================  ==========
id     name                             statistic                                      fires when
=====  ===============================  =============================================  ==========
(a)    residual-stream scale            max growth of median ‖h‖: per block            > 50
                                        ‖h_{l+1}‖/‖h_l‖, and ‖h_0‖ since initialisation
(b)    reference validity               median per-sample ‖g_L‖ (1/128 scale)          < 1e-7
(c)    cross-batch direction stability  mean pairwise cos of K ≥ 8 batch-mean g at L//2 > 0.30
(d)    depth utility                    headline acc − frozen-blocks acc (pp)          < 2.0
=====  ===============================  =============================================  ==========

The protocol is data (:mod:`.diagnostics`): each diagnostic is a registered class, and a
plugin diagnostic joins the four when a config lists it. The verdict (:mod:`.verdicts`) is
*needs walk-back* (naming the fired ones) when any fires, *trustworthy* only when all were
evaluated and none fired, and *incomplete* otherwise — printed as "no walk-back in (a)–(c);
(d) not evaluated" — or *unverified* when the reference gradient failed its check and the run
was allowed to go on (:func:`judge`, the one function behind every verdict shown). A
diagnostic that cannot be evaluated (no frozen accuracy, too few evaluation batches,
non-finite values) is reported as *not evaluated* — never as passed.

:func:`creditaudit.audit.diagnose.diagnose` runs the protocol on a live model (a contract model,
or any ``nn.Module`` with a states function); :func:`evaluate_protocol` runs it on precomputed
:class:`~creditaudit.measures.gradients.StateGradients` (what training already has);
:mod:`.records` judges run records again (e.g. (d) against the frozen runs of a recipe).
Norms follow science.md §2: per-sample L2 over the feature axis, median over samples,
gradients as (1/128)·∂CE_i/∂h_l.
"""

from creditaudit.protocol.checks import (
    CAUSE_FLOOR,
    CAUSE_LN,
    CAUSE_NO_PATH,
    CAUSE_SATURATION,
    CAUSE_SATURATION_NO_LN,
    CAUSE_WEAK_HEAD,
    FIRED,
    HEADLINE_GAMMA,
    INCOMPLETE,
    NO_FROZEN_REASON,
    NOT_EVALUATED,
    PASSED,
    TRUSTWORTHY,
    WALK_BACK,
    DiagnosticResult,
    Thresholds,
    block_growths,
    cross_batch_stability,
    embed_growth,
    margin_pp,
)
from creditaudit.protocol.diagnostics import (
    DepthUtility,
    DirectionStability,
    Evidence,
    ProtocolDiagnostic,
    ReferenceValidity,
    ResidualStreamScale,
    default_names,
    protocol,
)
from creditaudit.protocol.diagnostics import (
    # (d) on two accuracies, as re-judging a record against a frozen baseline needs
    # (``trained=False``: a run's epoch 0): the one function, under its exported name.
    depth_utility as depth_utility_diagnostic,
)
from creditaudit.protocol.evaluate import CreditFn, DiagnosticReport, evaluate_protocol
from creditaudit.protocol.verdicts import (
    KINDS,
    UNVERIFIED,
    UNVERIFIED_MARK,
    Judgement,
    Protocol,
    in_order,
    judge,
    labels,
    statuses_of,
    verdict_of,
    verdict_phrase,
)

__all__ = [
    "CAUSE_FLOOR", "CAUSE_LN", "CAUSE_NO_PATH", "CAUSE_SATURATION", "CAUSE_SATURATION_NO_LN",
    "CAUSE_WEAK_HEAD", "FIRED", "HEADLINE_GAMMA", "INCOMPLETE", "NO_FROZEN_REASON",
    "NOT_EVALUATED", "PASSED",
    "TRUSTWORTHY", "WALK_BACK", "CreditFn", "DiagnosticReport", "DiagnosticResult",
    "Thresholds", "Evidence", "ProtocolDiagnostic", "Protocol", "protocol", "default_names",
    "ResidualStreamScale", "ReferenceValidity", "DirectionStability", "DepthUtility",
    "block_growths", "embed_growth", "margin_pp", "cross_batch_stability",
    "depth_utility_diagnostic", "evaluate_protocol", "in_order", "labels", "statuses_of",
    "verdict_of", "verdict_phrase", "judge", "Judgement", "KINDS", "UNVERIFIED", "UNVERIFIED_MARK",
]
