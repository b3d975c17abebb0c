"""The end-of-run metrics of a run (a report's or record's ``metrics``) in a few plain lines:
credit quality against its controls (cosines, perturbation ρ, nudging, the fresh-feedback
null) and EP's relaxation. The protocol's renderings (:mod:`creditaudit.report.protocol`)
print them below the diagnostics::

    from creditaudit.report import metrics_lines
    print("\n".join(metrics_lines(report.metrics)))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from creditaudit.descriptions.fields import finite_number
from creditaudit.formatting import fmt
from creditaudit.protocol import Judgement


def metrics_lines(metrics: dict[str, Any] | None, judged: Judgement | None = None
                  ) -> list[str]:
    """A few plain lines summarising the credit-quality block, controls beside each metric;
    with ``judged``, the cosines and the fresh-feedback null (cosines too) are marked when
    the reference gradient is not verified."""
    if not metrics:
        return []

    def mark(text: str) -> str:
        return judged.mark(text) if judged is not None else text

    def row(values: Sequence[float] | None, spec: str = "+.3f") -> str:
        return "[" + ", ".join(fmt(v, spec) for v in values or []) + "]"

    lines = ep_convergence_lines(metrics)
    if "bp_cosine" not in metrics:  # only a rule's own fields (audit --no-metrics)
        return lines
    lines += ["credit quality (controls: BP positive, random negative):",
              f"  cos per layer   {mark(row(metrics.get('bp_cosine')))}  random "
              f"{row(metrics.get('cosine_controls', {}).get('random'))}"]
    if "perturbation_rho" in metrics:
        from creditaudit.measures.perturbation import MEASURABLE_BP_RHO

        controls = metrics.get("rho_controls", {})
        bp_rho = controls.get("bp") or []
        # A layer whose ρ the record marks not measurable — its BP control below the bar,
        # or no ρ of the credit at all (NaN: records from before that mark say it only so)
        # — is shown as such, not as a number a reader would take for the credit's.
        measurable = metrics.get("rho_measurable") or []
        invalid = [layer for layer, value in enumerate(metrics["perturbation_rho"])
                   if (layer < len(measurable) and not measurable[layer])
                   or finite_number(value) is None]
        rho = ["invalid" if layer in invalid else fmt(value, "+.3f")
               for layer, value in enumerate(metrics["perturbation_rho"])]
        lines.append(f"  ρ per layer     [{', '.join(rho)}]  BP "
                     f"{row(controls.get('bp'))}  random {row(controls.get('random'))}")
        unresolved = [layer for layer in invalid if not (
            layer < len(bp_rho) and (finite_number(bp_rho[layer]) or 0.0) >= MEASURABLE_BP_RHO)]
        undefined = [layer for layer in invalid if layer not in unresolved]
        if unresolved:
            lines.append(
                f"  ρ invalid at layer {', '.join(map(str, unresolved))}: there even the "
                f"reference gradient as credit (the BP control) scores ρ < "
                f"{MEASURABLE_BP_RHO:g}, so either the working precision does not resolve "
                "the loss changes or the reference is not the model's gradient; ρ says "
                "nothing about the credit there")
        if undefined:
            lines.append(
                f"  ρ invalid at layer {', '.join(map(str, undefined))}: the credit there "
                "predicts no loss change (it is zero at every sample, as at a block the "
                "rule leaves untrained), so it has no correlation to measure — not a ρ of 0")
    for eta, deltas in metrics.get("nudging", {}).items():
        bp = metrics.get("nudging_controls", {}).get("bp", {}).get(eta)
        lines.append(f"  nudging η={eta}  Δ {row(deltas, '+.2e')}  BP {row(bp, '+.2e')}")
        # Δ per deep layer 1 … L: NaN with the BP control's NaN is not measurable
        unresolved = [str(layer) for layer, (value, control)
                      in enumerate(zip(deltas or [], bp or []), start=1)
                      if finite_number(value) is None and finite_number(control) is None]
        if unresolved:
            lines.append(
                f"  nudging η={eta} not measurable at layer {', '.join(unresolved)}: there "
                "even the BP step changes the loss by less than the working precision "
                "resolves, so no Δ there says anything about the credit — not a Δ of 0")
    null = metrics.get("fresh_b_null")
    if null:  # a key a record lacks (or an undefined value) is shown as —
        lines.append(f"  fresh-B null    deep cos {mark(fmt(null.get('training_value'), '+.4f'))}"
                     " (training B) vs "
                     f"{fmt(null.get('mean'), '+.4f')} ± {fmt(null.get('std'), '.4f')} over "
                     f"{fmt(null.get('n'), '')} draws (z = {fmt(null.get('z'), '.1f')})")
    return lines


def ep_convergence_lines(metrics: dict[str, Any]) -> list[str]:
    """EP's relaxation: ‖∇_ρF‖ end/start in the audited epoch and the end-of-run cosine of
    EP's weight update with BP's (overall and per module writing h_0 … h_L)."""
    lines = []
    if "ep_relax_grad_ratio" in metrics:
        ratio = metrics["ep_relax_grad_ratio"]
        lines.append(f"EP relaxation: ‖∇_ρF‖ end/start {fmt(ratio)} (epoch mean; the "
                     "credits' relative error to first order), back-off in "
                     f"{fmt(metrics.get('ep_backoff_fraction'), '.0%')} of steps")
        if isinstance(ratio, (int, float)) and ratio > 1.0:
            lines.append("  the nudged phase ended farther from equilibrium than it started: "
                         "the credits that trained the blocks were not EP's estimate (the "
                         "default method.ep_solver=residual-cg, more method.ep_steps, or "
                         "train in a mode without batch-coupled layers)")
        elif ratio == 1.0:
            lines.append("  no relaxation moved a state: every nudged phase returned the free "
                         "states, so every credit was 0 and no block trained (a smaller "
                         "method.ep_beta or method.ep_step_size)")
    if "ep_update_cos" in metrics:
        layers = ", ".join(fmt(v, ".4f") for v in metrics.get("ep_update_cos_layers") or [])
        lines.append(f"EP weight update vs BP: cos {fmt(metrics['ep_update_cos'], '.4f')} "
                     f"(embed, blocks: [{layers}]; float64, ‖∇_ρF‖ end/start "
                     f"{fmt(metrics.get('ep_eval_relax_grad_ratio'))})")
    if "ep_update_error" in metrics:
        lines.append(f"EP weight update vs BP: not measured ({metrics['ep_update_error']})")
    return lines
