"""Figure 3, penalty rescue and the 2×2 capacity-cost control.

(a) ‖h_L‖ (left axis) and ‖g_L‖ (right axis, with the 1e-7 floor) per epoch for vanilla DFA
and DFA with the residual-branch penalty λ (one note counts the runs whose ≤ 0 or NaN/inf
epochs a log axis cannot draw); (b) deep cos and deep ρ (means over layers
l ≥ 1, end of run) across conditions: vanilla DFA, each penalised DFA, the fresh-B null
(cosine only: every draw of every seed pooled), a random-credit negative control and the
BP-gradient positive control measured on the penalised models; error bars ± std across
seeds; (c) final accuracy of BP and DFA without and with the penalty, with the frozen-blocks
accuracy as a line.

All runs come from one recipe, so at paper scale the 30-epoch control runs are compared
with each other, not with the 100-epoch audit runs. (b), (c) and the frozen line show
end-of-run values: a run that stopped early is left out of their means (a line under the
figure names it); (a) draws the epochs it logged. A diverged run stays in those means with
the numbers of its last finite epoch, and a line under the figure names it and that epoch.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from creditaudit.figures.common import (
    PENALTY_COLORS,
    add_grid,
    floor_line,
    integer_x,
    legend_below,
    literal,
    log_panel_note,
    log_scale,
    mean_line,
    method_color,
    new_figure,
    notes_below,
    save_all,
    unique_handles,
)
from creditaudit.figures.runs import (
    choose_group,
    describe_recipe,
    epoch_mean_std,
    other_options_note,
    penalties,
    reference_verified,
    seed_runs,
)
from creditaudit.formatting import format_lambda
from creditaudit.records import RunRecord
from creditaudit.results import (
    RunIndex,
    deep_mean,
    diverged_note,
    full_length,
    mean_std,
    stopped_early_note,
)

NAME = "fig3_penalty"
TITLE = "Figure 3 — penalty rescue"
REFERENCE_PENALTY = 1e-2  # the λ of the 2×2 capacity-cost control, drawn when present
requirements = ("in one recipe: DFA without penalty, DFA with a penalty λ > 0 (--penalty, "
                "e.g. 0.01), BP without penalty, BP with the same λ, and frozen-blocks runs "
                "(--method frozen); ≥ 1 seed each. Every other DFA λ of that recipe adds a "
                "bar to panel (b).")


def headline_penalty(group: list[RunRecord]) -> float | None:
    """The λ > 0 that both DFA and BP ran with: 1e-2 when present, else the largest."""
    shared = [p for p in penalties(group, "dfa") if p > 0 and p in penalties(group, "bp")]
    if not shared:
        return None
    return REFERENCE_PENALTY if REFERENCE_PENALTY in shared else max(shared)


def _missing(group: list[RunRecord]) -> list[str]:
    out = []
    if not seed_runs(group, "dfa", 0.0):
        out.append("DFA runs without penalty (method dfa, λ = 0)")
    if not seed_runs(group, "bp", 0.0):
        out.append("BP runs without penalty (method bp, λ = 0)")
    if not seed_runs(group, "frozen", lambda p: True):
        out.append("frozen-blocks runs (method frozen)")
    if headline_penalty(group) is None:
        dfa = [p for p in penalties(group, "dfa") if p > 0]
        if not dfa:
            out.append("DFA runs with a penalty λ > 0 (e.g. --penalty 0.01)")
        else:
            out.append(f"BP runs with the penalty of the DFA runs (λ ∈ {dfa})")
    return out


def select(index: RunIndex) -> dict[str, object]:
    """The runs Figure 3 draws (one run per seed in each list)."""
    group = choose_group(index, TITLE, _missing)
    lam = headline_penalty(group)
    return {
        "penalty": lam,
        "dfa": seed_runs(group, "dfa", 0.0),
        "dfa_penalised": {p: seed_runs(group, "dfa", p)
                          for p in penalties(group, "dfa") if p > 0},
        "bp": seed_runs(group, "bp", 0.0),
        "bp_penalised": seed_runs(group, "bp", lam),
        "frozen": seed_runs(group, "frozen", lambda p: True),
    }


def ended(chosen: dict) -> dict:
    """``chosen`` (:func:`select`) with every list of runs cut to those that trained all
    their epochs (:func:`~creditaudit.results.full_length`): what end-of-run means
    average."""
    return {key: full_length(value) if isinstance(value, list)
            else {p: full_length(runs) for p, runs in value.items()}
            if isinstance(value, dict) else value
            for key, value in chosen.items()}


def conditions(chosen: dict) -> list[dict]:
    """Panel (b)'s bars: label, (cos mean, std), (ρ mean, std) — NaN where not measured —
    over the runs of ``chosen`` that trained all their epochs (:func:`ended`)."""
    chosen = ended(chosen)
    lam = chosen["penalty"]
    headline = chosen["dfa_penalised"][lam]
    rows = [{"label": "vanilla\nDFA", "key": "dfa",
             "cos": mean_std(r.deep_cos for r in chosen["dfa"]),
             "valid": all(r.deep_cos_valid is not False for r in chosen["dfa"])
             and reference_verified(chosen["dfa"]),
             "rho": mean_std(r.deep_rho for r in chosen["dfa"])}]
    for p, runs in chosen["dfa_penalised"].items():
        rows.append({"label": f"DFA\nλ={format_lambda(p)}", "key": f"dfa:{p:g}",
                     "cos": mean_std(r.deep_cos for r in runs),
                     "valid": all(r.deep_cos_valid is not False for r in runs)
                     and reference_verified(runs),
                     "rho": mean_std(r.deep_rho for r in runs)})
    draws = [v for r in headline
             for v in (r.diagnostics.fresh_b_null or {}).get("values", [])]
    rows.append({"label": f"fresh-B\nnull\nλ={format_lambda(lam)}", "key": "fresh_b_null",
                 "cos": mean_std(draws), "valid": reference_verified(headline),
                 "rho": (math.nan, math.nan)})

    def control(kind: str, metric: str) -> tuple[float, float]:
        block = "cosine_controls" if metric == "cos" else "rho_controls"
        return mean_std(deep_mean((getattr(r.diagnostics, block) or {}).get(kind))
                        for r in headline)

    rows.append({"label": "random\ncredit", "key": "random",
                 "cos": control("random", "cos"), "valid": reference_verified(headline),
                 "rho": control("random", "rho")})
    rows.append({"label": "BP grad\n(positive)", "key": "bp_control",
                 "cos": control("bp", "cos"), "valid": reference_verified(headline),
                 "rho": control("bp", "rho")})
    return rows


def build(index: RunIndex) -> dict[str, Figure]:
    chosen = select(index)
    lam = chosen["penalty"]
    fig, axes = new_figure(1, 3, figsize=(14, 5.0))
    fig.subplots_adjust(wspace=0.45)

    # (a) trajectories
    drawn = [*chosen["dfa"], *chosen["dfa_penalised"][lam]]  # (a)'s curves
    ax = axes[0, 0]
    ax2 = ax.twinx()
    pen_color = PENALTY_COLORS[0]
    for key, runs, color, name in (("vanilla", chosen["dfa"], method_color("dfa"), "vanilla DFA"),
                                   ("penalised", chosen["dfa_penalised"][lam], pen_color,
                                    f"DFA λ={lam:g}")):
        epochs, mean, std = epoch_mean_std(runs, "h_L_norm")
        mean_line(ax, epochs, mean, std, label=rf"{name} $\|h_L\|$", color=color, lw=1.5,
                  marker="o", ms=3, gid=f"a:h_L:{key}")
        epochs, mean, std = epoch_mean_std(runs, "g_L_norm")
        mean_line(ax2, epochs, mean, std, label=rf"{name} $\|g_L\|$", color=color, lw=1,
                  ls=":", marker="^", ms=3, band=False, gid=f"a:g_L:{key}")
    floor_line(ax2)
    log_scale(ax)
    log_scale(ax2)
    ax.set_xlabel("epoch")
    integer_x(ax)
    ax.set_ylabel(r"$\|h_L\|$ (log)")
    ax2.set_ylabel(r"$\|g_L\|$ (log)", color="gray")
    ax2.tick_params(axis="y", labelcolor="gray")
    ax.set_title("(a) penalty contains the residual stream")
    add_grid(ax, log_scale=True)
    # One note for both axes (on the twin, drawn above the other): epochs a log axis drops.
    log_panel_note(ax2, drawn, ("h_L_norm", "g_L_norm"))
    axis_a = (ax, ax2)

    # (b) deep cos / deep ρ bars
    ax = axes[0, 1]
    rows = conditions(chosen)
    x = np.arange(len(rows))
    w = 0.35
    cos = np.array([r["cos"][0] for r in rows])
    cos_err = np.array([r["cos"][1] for r in rows])
    measured = np.array([not math.isnan(r["rho"][0]) for r in rows])
    bars = ax.bar(x - w / 2, cos, w, yerr=np.nan_to_num(cos_err), capsize=3,
                  color="#4682b4", label="deep cos", gid="b:cos")
    invalid = [i for i, r in enumerate(rows) if not r.get("valid", True)]
    for i in invalid:  # measured against an invalid or unverified reference: greyed out
        bars[i].set_facecolor("#d9d9d9")
        bars[i].set_hatch("//")
        bars[i].set_gid("b:cos_invalid")
    if invalid:
        ax.text(0.0, -0.42, "grey hatched: deep cos against reference ‖g_l‖ < 1e-7 or a "
                "reference gradient not verified (not valid)", transform=ax.transAxes,
                fontsize=7, color="#555555", va="top")
    ax.bar(x[measured] + w / 2, [r["rho"][0] for r in rows if not math.isnan(r["rho"][0])], w,
           yerr=[np.nan_to_num(r["rho"][1]) for r in rows if not math.isnan(r["rho"][0])],
           capsize=3, color="#7da76f", label=r"deep $\rho$", gid="b:rho")
    for i in np.flatnonzero(~measured):
        ax.text(x[i] + w / 2, 0.02, "ρ n/a", rotation=90, fontsize=7, ha="center",
                va="bottom", color="gray")
    ax.axhline(0, color="black", lw=0.5)
    ax.set_xticks(x)
    ax.set_xticklabels([r["label"].replace("\n", " ") for r in rows], fontsize=7, rotation=35,
                       ha="right", rotation_mode="anchor")
    ax.set_ylabel("deep-layer alignment (l ≥ 1)")
    ax.set_title("(b) deep cos and deep ρ across conditions")
    add_grid(ax)

    # (c) 2×2 capacity-cost
    ax = axes[0, 2]
    x = np.arange(2)
    final = ended(chosen)
    plain = [mean_std(r.final_acc for r in final[k]) for k in ("bp", "dfa")]
    pen = [mean_std(r.final_acc for r in final["bp_penalised"]),
           mean_std(r.final_acc for r in final["dfa_penalised"][lam])]
    ax.bar(x - w / 2, [m for m, _ in plain], w, yerr=[s for _, s in plain], capsize=3,
           color="#4682b4", label="no penalty", gid="c:plain")
    ax.bar(x + w / 2, [m for m, _ in pen], w, yerr=[s for _, s in pen], capsize=3,
           color="#cc4444", label=f"with penalty λ={lam:g}", gid="c:penalised")
    frozen, _ = mean_std(r.final_acc for r in final["frozen"])
    ax.axhline(frozen, color="black", ls="--", lw=1, label=f"frozen blocks {frozen:.3f}",
               gid="c:frozen")
    ax.set_xticks(x)
    ax.set_xticklabels(["BP", "DFA"])
    ax.set_ylabel("test accuracy")
    ax.set_title("(c) 2×2 capacity-cost control")
    ax.set_ylim(0, max([frozen, *(m + s for m, s in plain + pen if math.isfinite(m))]) * 1.25)
    add_grid(ax)
    fig.suptitle(f"Penalty rescue — {literal(describe_recipe(chosen['dfa'][0]))}", y=1.02)
    # Each panel's legend under it (panel (a) lists both of its y axes): none covers data.
    legend_below(fig, [axes[0, 0]], ncol=2, handles=unique_handles(axis_a))
    legend_below(fig, [axes[0, 1]], ncol=2)
    legend_below(fig, [axes[0, 2]], ncol=1)
    stopped = stopped_early_note(_all_runs(chosen), curves=drawn)
    other = other_options_note(index, _all_runs(chosen))
    # (b), (c) and the frozen line keep a diverged run, with its last finite epoch's numbers.
    diverged = diverged_note(_all_runs(ended(chosen)))
    notes = {"stopped_early": stopped, "diverged": diverged, "other_options": other}
    notes_below(fig, list(axes[0]), {gid: text for gid, text in notes.items() if text})
    return {NAME: fig}


def _all_runs(chosen: dict) -> list[RunRecord]:
    """Every run of ``chosen`` (:func:`select`), (b)'s and (c)'s."""
    return [run for value in chosen.values()
            for runs in (value.values() if isinstance(value, dict) else [value])
            if isinstance(runs, list) for run in runs]


def render(index: RunIndex, out_dir: str | Path) -> list[Path]:
    return save_all(build(index), out_dir)


__all__ = ["NAME", "TITLE", "requirements", "build", "render", "select", "conditions",
           "ended"]
