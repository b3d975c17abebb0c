"""Export run records to the result layout of the original study (``--layout faeval``).

The original figure scripts (``/work/shared/seeds``) read these files, relative to OUT::

    results/snapshot_evolution_v2/snapshot_evolution_s{seed}.json     bp_log, fa_log, dfa_log
    results/dfa_residual_penalty/dfa_pen_lam{λ}_s{seed}.json          log
    results/snapshot_vit_v1/snapshot_vit_s{seed}.json                 bp_log, dfa_log
    results/snapshot_vit_v1/snapshot_fa_canonical_s{seed}.json        fa_log
    results/snapshot_no_outln_v1/snapshot_noLN_s{seed}.json           bp_log, dfa_log
    results/snapshot_no_outln_v1/snapshot_fa_canonical_noln_s{seed}.json   fa_log
    results/snapshot_synth_v1/snapshot_synth_a{α}_L{L}_s{seed}.json   bp_log, dfa_log
    results/snapshot_synth_v1/snapshot_fa_canonical_s{seed}.json      fa_log (α = 1.0, else max α)
    results/{dataset}/results_{dataset}.json              seed 42     {seed: {method: …}}
    results/{dataset}_seed{seed}/results_{dataset}.json   other seeds

``*_log`` and ``log`` of the snapshot and penalty files are the run's per-epoch entries
exactly as recorded (epoch 0 = initialisation included; keys ``epoch``, ``hidden_norms``,
``bp_grad_norms_per_sample_med``, ``acc_eval``, ``h_L_norm``, ``g_2_norm``, …). The
``results_{dataset}.json`` files (the original's ``results_cifar10.json``; for other
datasets the same structure under the dataset's own name) map the seed (a string) to
``bp``, ``dfa``, ``state_bridge`` and ``credit_bridge``, each with ``log`` (a dict of
per-epoch lists over the trained epochs 1 … E: ``epoch``, ``train_loss``, ``train_acc``,
``test_loss``, ``test_acc`` and, for State Bridge, ``state_pred_error``), ``diagnostics``
(the record's end-of-run block: ``bp_cosine``, ``perturbation_rho``, ``nudging`` {"0.01":
[…]}, …) and ``drift`` (parameter name → relative change).

Which run fills a file: ResidualMLP runs with terminal LN, no penalty (except the penalty
files), all blocks trainable, real labels, the rule's default options (an ablation such as
``method.feedback_scale=100`` is no run of the study's) — for the no-LN and ViT files the
same on those architectures (the ViT files from ViT-Mini runs on whichever image dataset
has them: CIFAR, MNIST, Fashion-MNIST or the synthetic task viewed as 3×32×32), for the
synthetic files StudentNet. ConvMixer runs have no file in this layout (the original study had no
ConvMixer), nor have runs of a user's own loop (``Recorder``) or adapted network, whatever
their class: each run no file can hold is listed under ``not_exported`` with why
(:func:`~creditaudit.study.export_runs.why_not_exported`), as is a run that fills no file
because another family filled its group or no file holds its rule with its λ
(:func:`~creditaudit.study.export_runs.why_unused`); a run that did not finish is listed
under ``unfinished`` with its status and epochs done. When several families of such runs exist
(same config but for method and seed: e.g. 100-epoch audit runs and 30-epoch control runs),
one family fills a whole group of files: the preferred dataset (CIFAR-10, CIFAR-100,
Fashion-MNIST, MNIST, MNIST-1D, synthetic), then the family with the most of the needed runs,
then the most epochs; of copies of one run in a family (trained again with other
diagnostics settings) the one that fills the most of the file is taken
(:mod:`creditaudit.study.export_runs`), the others listed under ``left_out``. ``dataset``
restricts every file but the StudentNet ones (always the synthetic task) to runs on that
dataset; a file none of whose runs it holds is skipped like any other with missing runs,
and a name that is neither an installed dataset nor one the folder's runs used is refused.
Only files for which runs exist are written; a file with some of its runs missing, or a
results-file method whose run has no end-of-run block (or one without metrics: a diverged
model's), is written with the keys it has and listed as partial (``missing``: ``fa_log``,
``dfa.diagnostics``, ``dfa.drift``); a file filled from a diverged run names it
(``diverged``), and one filled from a run that stopped early (``--stop-on-walkback``, a
Recorder finished before its ``optim.epochs``: its log is shorter than its recipe's) names
it and why, in the report's words (``stopped_early``); a run with epochs the diagnostics
did not measure (``diagnostics.every``) fills the per-epoch files with those entries as
recorded, without measures, and the manifest names those epochs (``unmeasured``).
``export_manifest.json`` in OUT lists every file written (and the run id behind each key)
and every file skipped with the runs it needs. A file an earlier export into OUT wrote (its
manifest lists it) that this one does not write is removed (and said so), so the folder
never mixes two exports; no other file in OUT is touched.

The original scripts read every cosine as measured against the true gradient, and these
files cannot mark a number. So a run whose reference gradient failed its check (trained with
``diagnostics.allow_unverified_reference``) fills no file: the manifest lists it under
``unverified`` with why. A run whose reference was not checked (recorded before creditaudit
checked it) is written, and its file's entry in the manifest says so under ``reference``
(key → why its cosines are not verified).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from creditaudit.errors import ConfigError
from creditaudit.protocol.records import RecordSet
from creditaudit.records import RunRecord
from creditaudit.records.files import no_runs_in
from creditaudit.registry import DATASETS
from creditaudit.study.export_files import (
    ExportResult,
    FileWriter,
    logs_of,
    previous_export,
    remove_stale,
    results_entry,
    results_gaps,
    results_log,
    snapshot_log,
    unfinished_entry,
    write_json,
)
from creditaudit.study.export_runs import (
    Slot,
    choose_family,
    dataset_rank,
    file_variant,
    results_fill,
    why_not_exported,
    why_unused,
)

log = logging.getLogger(__name__)

LAYOUTS = ("faeval",)
MANIFEST_FILE = "export_manifest.json"
DEFAULT_SEEDS = (42, 123, 456)
PENALTIES = (0.0, 1e-4, 1e-3, 1e-2, 1e-1)
RESULTS_METHODS = {"bp": "bp", "dfa": "dfa", "state_bridge": "state-bridge",
                   "credit_bridge": "credit-bridge"}
MAIN_SEED = 42
# How to produce the runs a missing file needs.
HOW = {
    "resmlp": "creditaudit experiment audit_table",
    "resmlp-penalty": "creditaudit experiment penalty_sweep",
    "resmlp-noLN": "creditaudit experiment temporal",
    "vit": "creditaudit experiment temporal",
    "student": "creditaudit experiment temporal",
}


def _lambda_name(value: float) -> str:
    """``0.01`` → ``"0.01"`` as the original file names wrote a float."""
    return str(float(value))


def _needs(variant: str, slot: Slot, dataset: str | None, extra: str = "") -> str:
    """The run a missing key needs, and the command that trains it."""
    what = slot.method + (f" λ={slot.penalty:g}" if slot.penalty else "")
    where = {"resmlp": "ResidualMLP with out_ln", "resmlp-noLN": "ResidualMLP without out_ln",
             "vit": "ViT-Mini with out_ln", "student": "StudentNet (synthetic)"}[variant]
    how = HOW["resmlp-penalty" if slot.penalty or slot.key == "log" else variant]
    if dataset and variant != "student":
        where += f", {dataset}"
        how += f" --dataset {dataset}" + (" --data-dir DIR" if dataset.startswith("cifar")
                                          else "")
        why_not = _not_trained(variant, dataset)
        if why_not is not None:
            how = f"no experiment trains it: {why_not}"
    return f"{what} on {where}{extra}, seed {slot.seed} ({how})"


def _not_trained(variant: str, dataset: str) -> str | None:
    """Why no experiment trains ``variant`` on ``dataset`` (an image architecture on
    MNIST-1D's signals; data no installed dataset loads, such as a ``Recorder`` loop's
    ``data="teacher-student"``), or None when the advised one does."""
    from creditaudit.study.experiments.configs import arch_of, image_view

    if dataset not in DATASETS.names(warn=False):  # experiment --dataset would refuse it
        return (f"{dataset} is no dataset installed here (a Recorder loop's name for its "
                "data, or a plugin's not installed)")
    try:  # image_view: any scale, the dataset decides
        if arch_of(variant)[0].input_kind == "image" and image_view("cpu", dataset) is None:
            return f"{dataset} holds no images for it to read; export an image dataset's files"
    except ConfigError as err:  # an architecture or dataset not installed here
        return str(err)
    return None


def _check_dataset(dataset: str, found: RecordSet, results_dir: str | Path) -> None:
    """ConfigError when ``dataset`` names no installed dataset and no dataset of the runs
    in the folder (a typo would otherwise export nothing, silently)."""
    held = sorted({r.dataset for r in found.records})
    if dataset not in held and dataset not in DATASETS.names(warn=False):
        raise ConfigError(f"--dataset {dataset!r} is not a dataset of the runs in {results_dir} "
                          f"(it holds: {', '.join(held) or 'no runs'}) nor an installed one; "
                          "name one of those")


def export_faeval(results_dir: str | Path, out: str | Path, *, dataset: str | None = None
                  ) -> ExportResult:
    """Write the original study's result files from the run records below ``results_dir``.

    ``dataset`` restricts every file but the StudentNet ones to runs on that dataset
    (default: the most paper-like dataset present); ConfigError when it is neither an
    installed dataset nor one the folder's runs used; also, before anything is written, when
    every record below ``results_dir`` is unreadable (a folder holding none gives an empty
    export). Returns what was written and skipped; also writes ``OUT/export_manifest.json``.
    """
    out = Path(out)
    result = ExportResult(out=out)
    found = RecordSet.from_folder(results_dir)
    if found.skipped and not len(found):
        raise ConfigError(no_runs_in(Path(results_dir), "export", len(found.skipped)))
    result.unreadable = [f"{path}: {reason}" for path, reason in found.skipped]
    records = list(found.finished)
    result.records_found = len(records)
    result.unfinished = [unfinished_entry(record, path)
                         for path, record in zip(found.paths, found.records)
                         if not record.is_finished]
    if dataset is not None:
        _check_dataset(dataset, found, results_dir)
        # StudentNet runs on the teacher–student task whatever the dataset asked for.
        records = [r for r in records if r.dataset == dataset or file_variant(r) == "student"]
    # A run whose reference failed is listed unverified (whatever else keeps it out);
    # control variants, architectures the layout has no file of, runs of a user's own loop
    # or adapted network and 0-epoch (random-init) runs fill no file: each is listed, why.
    for record in [r for r in records if r.reference.failed]:
        judged = found.verdict(record).judgement
        result.unverified.append({"run_id": record.run_id, "reason": (
            f"{judged.reference_note}, so its cosines, Γ and (b) measure nothing; the "
            "original layout cannot mark them")})
    records = [r for r in records if not r.reference.failed]
    for record in records:
        reason = why_not_exported(record)
        if reason is not None:
            result.not_exported.append({"run_id": record.run_id, "reason": reason})
    records = [r for r in records if why_not_exported(r) is None]
    result.records_read = len(records)
    seeds = sorted({r.seed for r in records}) or list(DEFAULT_SEEDS)
    by_variant: dict[str, list[RunRecord]] = {}
    for record in records:
        by_variant.setdefault(file_variant(record), []).append(record)
    previous = previous_export(out / MANIFEST_FILE)
    writer = FileWriter(out, result, found)
    base = "results"

    def plain(variant: str) -> list[RunRecord]:
        return [r for r in by_variant.get(variant, []) if r.penalty == 0]

    # ResidualMLP with out_ln: snapshot evolution.
    slots = {s: [Slot(f"{m}_log", m, s) for m in ("bp", "dfa", "fa")] for s in seeds}
    family = choose_family(plain("resmlp"), [x for v in slots.values() for x in v])
    for seed in seeds:
        writer.file(f"{base}/snapshot_evolution_v2/snapshot_evolution_s{seed}.json",
                    slots[seed], family, logs_of, lambda s: _needs("resmlp", s, dataset))

    # DFA residual penalty.
    penalised = [r for r in by_variant.get("resmlp", []) if r.method == "dfa"]
    lambdas = sorted({*PENALTIES, *(float(r.penalty) for r in penalised)})
    pen_slots = [Slot("log", "dfa", s, lam) for lam in lambdas for s in seeds]
    family = choose_family(penalised, pen_slots)
    for slot in pen_slots:
        writer.file(f"{base}/dfa_residual_penalty/dfa_pen_lam{_lambda_name(slot.penalty)}"
                    f"_s{slot.seed}.json", [slot], family,
                    lambda found: {"log": snapshot_log(found["log"])},
                    lambda s: _needs("resmlp", s, dataset))

    # ViT-Mini and the no-LN ResidualMLP.
    for variant, folder, name, fa_name in (
            ("vit", "snapshot_vit_v1", "snapshot_vit", "snapshot_fa_canonical"),
            ("resmlp-noLN", "snapshot_no_outln_v1", "snapshot_noLN",
             "snapshot_fa_canonical_noln")):
        pairs = {s: [Slot("bp_log", "bp", s), Slot("dfa_log", "dfa", s)] for s in seeds}
        fas = {s: [Slot("fa_log", "fa", s)] for s in seeds}
        family = choose_family(plain(variant), [x for v in (*pairs.values(), *fas.values())
                                                for x in v])
        for seed in seeds:
            writer.file(f"{base}/{folder}/{name}_s{seed}.json", pairs[seed], family, logs_of,
                        lambda s, v=variant: _needs(v, s, dataset))
            writer.file(f"{base}/{folder}/{fa_name}_s{seed}.json", fas[seed], family, logs_of,
                        lambda s, v=variant: _needs(v, s, dataset))

    # StudentNet on the teacher–student task, one family per α.
    students = plain("student")
    alphas = sorted({float(r.config.data.alpha) for r in students}) or [1.0]
    for alpha in alphas:
        members = [r for r in students if float(r.config.data.alpha) == alpha]
        pairs = {s: [Slot("bp_log", "bp", s), Slot("dfa_log", "dfa", s)] for s in seeds}
        family = choose_family(members, [x for v in pairs.values() for x in v])
        depth = next((len(r.log[0].measures.hidden_norms) - 1 for r in family.runs.values()
                      if r.log and r.log[0].measures), 4)
        for seed in seeds:
            writer.file(f"{base}/snapshot_synth_v1/snapshot_synth_a{alpha}_L{depth}_s{seed}.json",
                        pairs[seed], family, logs_of,
                        lambda s, a=alpha: _needs("student", s, None, f" α={a}"))
    fa_alpha = 1.0 if 1.0 in alphas else alphas[-1]
    members = [r for r in students if float(r.config.data.alpha) == fa_alpha]
    fas = {s: [Slot("fa_log", "fa", s)] for s in seeds}
    family = choose_family(members, [x for v in fas.values() for x in v])
    for seed in seeds:
        writer.file(f"{base}/snapshot_synth_v1/snapshot_fa_canonical_s{seed}.json", fas[seed],
                    family, logs_of, lambda s: _needs("student", s, None, f" α={fa_alpha}"))

    # results_{dataset}.json: one family per dataset, one file per seed.
    resmlp = plain("resmlp")
    datasets = sorted({r.dataset for r in resmlp} | {"cifar10"},
                      key=dataset_rank)
    if dataset is not None:
        datasets = [dataset]
    for name in datasets:
        members = [r for r in resmlp if r.dataset == name]
        seed_list = sorted({r.seed for r in members}) or seeds
        slots = {s: [Slot(key, method, s) for key, method in RESULTS_METHODS.items()]
                 for s in seed_list}
        family = choose_family(members, [x for v in slots.values() for x in v],
                               fill=results_fill)
        for seed in seed_list:
            folder = name if seed == MAIN_SEED else f"{name}_seed{seed}"
            writer.file(f"{base}/{folder}/results_{name}.json", slots[seed], family,
                        lambda found, s=seed: {str(s): {key: results_entry(record)
                                                        for key, record in found.items()}},
                        lambda s, d=name: _needs("resmlp", s, d), gaps=results_gaps,
                        entries=False)
    # A run of the layout's kind that no file took (another recipe's family filled its
    # group, or no file holds its rule with its λ) is listed, with why, as any other.
    used = result.run_ids()
    taken = [r for r in records if r.run_id in used]
    result.not_exported += [{"run_id": r.run_id, "reason": why_unused(r, taken)}
                            for r in records if r.run_id not in used]
    remove_stale(out, previous, result)
    write_json(out / MANIFEST_FILE, result.to_dict())
    return result


def export(results_dir: str | Path, out: str | Path, *, layout: str = "faeval",
           dataset: str | None = None) -> ExportResult:
    """Export run records to ``layout`` (only ``faeval``: the original study's files)."""
    if layout not in LAYOUTS:
        raise ConfigError(f"export layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    return export_faeval(results_dir, out, dataset=dataset)


def manifest(out: str | Path) -> dict[str, Any]:
    """The manifest an export wrote to ``out``."""
    return json.loads((Path(out) / MANIFEST_FILE).read_text())


__all__ = ["export", "export_faeval", "ExportResult", "LAYOUTS", "results_log", "snapshot_log",
           "manifest"]
