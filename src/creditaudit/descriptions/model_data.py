"""What a run record says about the model it trained and the data it trained on.

Both are asked of the thing that knows them — the built model
(:meth:`creditaudit.models.contract.ResidualNet.describe`) and the dataset that loaded the
data (:meth:`creditaudit.data.registry.DatasetSpec.identity`) — once per run, and stored in
the record; reports, figures and exports read them from there, never re-derive them from a
config name.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from creditaudit.descriptions.fields import doc

# The provenance key of the sha256 of the arrays a generated dataset loaded from its cache,
# verified against the digest signed when the generator made them.
CONTENT_DIGEST = "content_sha256"
# The provenance key of how the loaded images' training batches were augmented:
# {"crop_padding": pixels, "flip": bool}, or None when they were not.
AUGMENTATION = "augmentation"
# Fields of ModelDescription kept since schema 3's: a run id and a recipe cover them only
# where they differ from what every earlier run was (ModelDescription.recipe_facts).
LATER_FIELDS = ("dtype", "frozen_parameters")


@dataclass
class ModelDescription:
    """The model a run trained, as the built model describes itself."""

    arch: str = doc("the architecture's name (model.arch)", "")
    label: str = doc("how tables and figures name it, e.g. `ResMLP d=256 L=4`", "")
    terminal_ln: bool | None = doc("whether the readout applies a LayerNorm to h_L")
    d: int | None = doc("state width d (features per token or channels per position)")
    n_blocks: int | None = doc("number of blocks L (states h_0 … h_L)")
    residual: bool | None = doc("whether blocks add their branch to a skip")
    input_shape: list[int] | None = doc("shape of one input as the model reads it")
    layout: str | None = doc("states: `vectors` (B, d), `tokens` (B, T, d) or `maps` "
                              "(B, d, H, W)")
    parameters: int | None = doc("number of parameters")
    dtype: str | None = doc(
        "the dtype the parameters are held in, as the model holds them (`float32`; "
        "`bfloat16` for a network cast with `.to(torch.bfloat16)`; several joined with `+`); "
        "another than `float32` is part of the recipe (and of a `Recorder` run's id). Absent "
        "(null when read) in records before it was kept")
    frozen_parameters: dict[str, int] | None = doc(
        "`Recorder` runs: the parameters the rule does not train that binding it did not "
        "freeze — frozen by your code (`requires_grad` off) or by an earlier rule bound to the "
        "same network — as {name in your network: number of values}, `{}` when none; part of "
        "the run id and the recipe. Absent (null when read) in runs of the command line "
        "(creditaudit builds their networks) and records before it was kept")

    def recipe_facts(self) -> dict[str, Any]:
        """How the network was held in training where it differs from what every run
        before these facts were kept had: ``dtype`` when not ``float32``,
        ``frozen_parameters`` when any. The run id of a ``Recorder`` run and every recipe
        cover them, so runs of a bf16 network, or with parameters frozen outside the rule,
        are other runs and recipes, while the ids and recipes of the rest stay as they were."""
        facts: dict[str, Any] = {}
        if self.dtype not in (None, "float32"):
            facts["dtype"] = self.dtype
        if self.frozen_parameters:
            facts["frozen_parameters"] = self.frozen_parameters
        return facts

    def to_dict(self) -> dict[str, Any]:
        """The description as a record stores it: the two fields kept later
        (``dtype``, ``frozen_parameters``) only when known, so a record read without them
        is written back as it was."""
        return {k: v for k, v in asdict(self).items()
                if not (k in LATER_FIELDS and v is None)}

    def identity(self) -> dict[str, Any]:
        """The description as a run id covers it: every field but the two kept later
        (``dtype``, ``frozen_parameters``), which join only as :meth:`recipe_facts`."""
        fields = {k: v for k, v in asdict(self).items() if k not in LATER_FIELDS}
        return {**fields, **self.recipe_facts()}

    @property
    def short_label(self) -> str:
        """The label without sizes (the architecture and its variant)."""
        return self.label.split(" d=")[0] if " d=" in self.label else self.label


@dataclass
class DataIdentity:
    """Which data a run trained on, independent of the folder it was read from.

    ``fingerprint`` identifies the data before it is loaded (part of the run id): the
    files' content or the generator's arguments; ``source`` identifies where it comes from
    regardless of the seed — equal to the fingerprint for file datasets, the generator's
    arguments without the seed for generated ones — so runs with different seeds on the same
    task share a recipe; ``arrays_sha256`` identifies the arrays that were loaded.
    """

    name: str = doc("dataset name (data.name)", "")
    fingerprint: str = doc(
        "sha256 of the data actually loaded: the decoded content of every file read, or the "
        "generator's arguments (seed included) for generated data, whose arrays are verified "
        "against the digest recorded when they were generated; part of the run id", "")
    source: str = doc(
        "the same without the seed (equal to `fingerprint` for file datasets): runs with "
        "different seeds on one task share a recipe", "")
    n_train: int | None = doc("training samples used (after data.train_subset)")
    n_test: int | None = doc("test samples")
    n_classes: int | None = doc("number of classes")
    input_shape: list[int] | None = doc("shape of one sample as stored (C, H, W) or (D,)")
    provenance: dict[str, Any] = doc(
        "per-file digests, or the generator's arguments (and, for data read from a cache, "
        "`content_sha256`: the digest of the arrays trained on, verified against the "
        "generator's); for images, `augmentation`: how training batches were augmented, "
        "`{crop_padding: pixels of zero padding of the random crop, flip: random horizontal "
        "flips}`, or null when they were not (absent in records before it was kept)",
        factory=dict)
    arrays_sha256: str | None = doc(
        "sha256 of the arrays actually trained and evaluated on, as loaded (train and test "
        "inputs and labels after data.train_subset: dtype, shape and bytes); a finished run "
        "is served, resumed or audited only on data with this digest. null: not known "
        "(records before it existed; runs recorded from a user's own loop, whose training "
        "arrays creditaudit never sees)")
    eval_samples: int | None = doc(
        "test samples of the fixed evaluation subset every epoch's diagnostics were measured "
        "on: diagnostics.eval_samples, or the whole test split where the default exceeds it "
        "(null: records before it was kept, and runs recorded from a user's own loop)")

    def to_dict(self) -> dict[str, Any]:
        """The identity as a record stores it: ``eval_samples`` only when known, so a
        record read without it is written back as it was."""
        return {k: v for k, v in asdict(self).items()
                if not (k == "eval_samples" and v is None)}


__all__ = ["ModelDescription", "DataIdentity", "CONTENT_DIGEST", "AUGMENTATION"]
