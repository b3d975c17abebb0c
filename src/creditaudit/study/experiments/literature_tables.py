"""The published tables the ``literature`` experiment reproduces: each number as read in its
source (document, table, row), the network and recipe each was trained with, and — where the
source does not publish a detail — what the experiment chose instead.

A :class:`Table` holds rows (a credit rule on a network: :class:`Row`) and columns (a dataset
with the published number of each row: :class:`Column`). Numbers are top-1 test error in
percent; a source that gives accuracy is converted (``published_as`` keeps its own words).
Nothing here trains or reads records: :mod:`creditaudit.study.experiments.literature` builds the
runs and the summary from these tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

NETS = "creditaudit.study.experiments.literature_nets"
BASELINE = "frozen"  # the frozen-blocks baseline of (d): one row per network of each table


@dataclass(frozen=True)
class Net:
    """A network, built as a user builds theirs: ``model.arch = "module"`` with this
    factory, its keyword arguments and the submodules whose outputs are the states."""

    label: str
    factory: str
    states: tuple[str, ...]
    args: tuple[tuple[str, Any], ...] = ()

    def overrides(self) -> dict[str, Any]:
        return {"model.arch": "module", "model.factory": self.factory,
                "model.states": list(self.states),
                "model.args": dict(self.args) if self.args else None}


@dataclass(frozen=True)
class Row:
    """One row: a credit rule (creditaudit's name) with its own options, on ``net``; ``lr``
    replaces the table's learning rate where the source used another for this rule."""

    label: str
    rule: str
    net: Net
    options: tuple[tuple[str, Any], ...] = ()
    lr: float | None = None
    note: str = ""

    @property
    def baseline(self) -> bool:
        return self.rule == BASELINE


@dataclass(frozen=True)
class Column:
    """A dataset (``data.name``) and the published test error (%) of each row label;
    ``data``: ``data.*`` overrides of this column's runs (e.g. the source's augmentation of
    that dataset), beside the recipe's; ``sizes``: the (train, test) samples of the runs
    compared with the published numbers (runs on other sizes are not compared)."""

    dataset: str
    label: str
    published: Mapping[str, float] = field(default_factory=dict)
    data: tuple[tuple[str, Any], ...] = ()
    sizes: tuple[int, int] | None = None


@dataclass(frozen=True)
class Recipe:
    """How a table's runs train: optimiser settings (creditaudit trains with AdamW and a
    cosine or constant schedule), epochs per scale, data sizes per scale (``data.*``
    overrides) and how often the diagnostics run."""

    lr: float
    weight_decay: float
    batch_size: int
    schedule: str
    epochs: Mapping[str, int]
    data: Mapping[str, tuple[tuple[str, Any], ...]] = field(default_factory=dict)
    every: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Table:
    """One published table (or the protocol study, ``published=False``): its source, the
    words of the source a number is read from (``published_as``), rows, columns, recipe,
    and ``notes`` — recipe details the source does not publish and what was chosen, and
    where creditaudit's rule differs from the source's."""

    key: str
    title: str
    source: str
    rows: tuple[Row, ...]
    columns: tuple[Column, ...]
    recipe: Recipe
    notes: tuple[str, ...] = ()
    published_as: str = "top-1 test error (%)"
    published: bool = True
    scales: tuple[str, ...] = ("cpu",)
    seeds: int | None = None  # the first N of the scale's seeds (None: all)
    # The smoke scale's stand-in for the first column: data overrides on synthetic data
    # (CI needs no files), or None for a table the smoke scale runs on its own dataset.
    smoke_data: tuple[tuple[str, Any], ...] | None = None


# --- networks -----------------------------------------------------------------------------
LENET = Net("LeNet-5 (BioTorch le_net_mnist)", f"{NETS}:lenet_mnist",
            ("pool1", "pool2", "relu3", "relu4"))
LENET_CIFAR = Net("LeNet (BioTorch le_net_cifar)", f"{NETS}:lenet_cifar",
                  ("pool1", "pool2", "gap", "relu4"))
RESNET20_STATES = ("stem", "layer1.0", "layer1.1", "layer1.2", "layer2.0", "layer2.1",
                   "layer2.2", "layer3.0", "layer3.1", "layer3.2")
ZOO = "creditaudit.testing.zoo"
RESNET20 = Net(f"ResNet-20 ({ZOO})", f"{ZOO}:resnet20", RESNET20_STATES)
RESNET20_GREY = Net(f"ResNet-20 ({ZOO}), 1 channel", f"{ZOO}:resnet20",
                    RESNET20_STATES, (("in_channels", 1),))
MNIST1D_MLP = Net("MLP (MNIST-1D MLPBase)", f"{NETS}:mnist1d_mlp", ("act1", "block2"))
MNIST1D_CNN = Net("CNN (MNIST-1D ConvBase)", f"{NETS}:mnist1d_cnn",
                  ("relu1", "relu2", "flatten"))

# (train, test) samples of the runs compared with published numbers: every training and test
# image (on CIFAR-10 without BioTorch's 5 000-image validation split; see its table's notes)
MNIST_SIZES, CIFAR_SIZES = (60000, 10000), (50000, 10000)

# BioTorch's rules under creditaudit's names (BioTorch's FA is per weight layer: fa-linear).
FIELD_DFA = (("normalise_credit", False),)  # Nøkland's and BioTorch's DFA: raw e·B_l


def biotorch_rows(net: Net, lrs: Mapping[str, float] | None = None) -> tuple[Row, ...]:
    """BP, FA, uSF, brSF, frSF, DFA (the field's), DFA with the study's normalised credit,
    and the frozen baseline on ``net``; ``lrs``: a learning rate per row label."""
    lrs = lrs or {}
    rows = [Row("BP", "bp", net), Row("FA", "fa-linear", net), Row("uSF", "usf", net),
            Row("brSF", "brsf", net), Row("frSF", "frsf", net),
            Row("DFA", "dfa", net, FIELD_DFA,
                note="normalise_credit=false: the raw credit e·B_l, as BioTorch and Nøkland"),
            Row("DFA, normalised credit", "dfa", net, (("normalise_credit", True),),
                note="the original study's per-sample RMS normalisation of the credit"),
            Row("frozen (baseline of (d))", BASELINE, net)]
    def lr(row: Row) -> float | None:  # both DFA rows train at DFA's learning rate
        return lrs.get("DFA" if row.rule == "dfa" else row.label)

    return tuple(Row(r.label, r.rule, r.net, r.options, lr(r), r.note) for r in rows)


BIOTORCH_SOURCE = ("BioTorch Benchmarks.md (github.com/jsalbert/biotorch), table "
                   "\"MNIST & Fashion-MNIST\": \"The model with best validation accuracy is then "
                   "benchmarked with the same validation set of 10k samples\" (the test set), "
                   "\"LeNet MNIST\", top-1 error %")
BIOTORCH_MNIST = Table(
    key="biotorch-mnist",
    title="BioTorch: LeNet-5 on MNIST and Fashion-MNIST",
    source=BIOTORCH_SOURCE,
    rows=biotorch_rows(LENET),
    columns=(
        Column("mnist", "MNIST", {"BP": 0.91, "FA": 1.7, "uSF": 0.94, "brSF": 0.91,
                                  "frSF": 0.97, "DFA": 1.61}, sizes=MNIST_SIZES),
        Column("fashion-mnist", "Fashion-MNIST", {"BP": 9.2, "FA": 13.06, "uSF": 9.69,
                                                  "brSF": 10.02, "frSF": 9.61,
                                                  "DFA": 12.81}, sizes=MNIST_SIZES)),
    recipe=Recipe(lr=1e-3, weight_decay=1e-4, batch_size=128, schedule="cosine",
                  epochs={"smoke": 1, "cpu": 10},
                  data={"smoke": (("data.train_subset", 256),),
                        "cpu": (("data.train_subset", None),)},
                  every={"smoke": 1, "cpu": 1}),
    notes=(
        "Benchmarks.md gives the MNIST recipe in words: SGD with momentum 0.9, weight decay "
        "1e-3, batch 64, 100 epochs, the learning rate divided by 10 at epochs 50 and 75; it "
        "does not give the initial learning rate, and no MNIST configuration file is "
        "published (the CIFAR-10 LeNet Adam files use learning rate 1e-3 for BP, uSF, brSF, "
        "frSF and 1e-4 for FA, DFA). creditaudit trains with AdamW only: chosen here AdamW "
        "learning rate 1e-3 for every rule (no per-rule tuning), weight decay 1e-4, batch "
        "128 (BioTorch's CIFAR-10 settings), cosine decay over 10 epochs on all 60 000 "
        "training images — a tenth of the published epochs, which this machine cannot "
        "afford; the budget check below trains FA and DFA three times longer.",
        "BioTorch resizes the 28×28 images to 32×32 (bilinear) and standardises them with "
        "mean/std (0.1307, 0.3081) on MNIST and (0.2859, 0.3530) on Fashion-MNIST; here the "
        "data are standardised with (0.1307, 0.3081) and (0.2860, 0.3530) and the network "
        "resizes them.",
        "BioTorch's best epoch is chosen on the test set (its \"validation\" set); both the "
        "best-epoch and the last-epoch test error are reported here, and the best-epoch one "
        "is compared with the published number.",
        "Feedback matrices: BioTorch draws them Xavier-uniform; creditaudit draws N(0, 1/fan_in) "
        "(fa-linear, DFA; uSF/brSF/frSF take the forward weights' signs). On a conv state "
        "BioTorch's DFA projects e through a random kernel onto every position; creditaudit's "
        "DFA gives each channel of a state one credit, broadcast over its positions (at pool2, "
        "16×5×5, BioTorch's credit differs per position, creditaudit's per channel only).",
    ),
    smoke_data=(("data.in_dim", 784), ("data.n_train", 256), ("data.n_test", 256)),
)

BIOTORCH_MNIST_LONG = Table(
    key="biotorch-mnist-long",
    title="BioTorch's MNIST column, FA and DFA at three times the epochs (one seed)",
    source=BIOTORCH_SOURCE,
    rows=tuple(r for r in biotorch_rows(LENET) if r.label in ("FA", "DFA")),
    columns=(BIOTORCH_MNIST.columns[0],),
    recipe=Recipe(lr=1e-3, weight_decay=1e-4, batch_size=128, schedule="cosine",
                  epochs={"cpu": 30}, data={"cpu": (("data.train_subset", None),)},
                  every={"cpu": 5}),
    seeds=1,
    notes=("The budget check of the table above: the same recipe with 30 epochs instead of "
           "10, for the two rules whose 10-epoch error is furthest from the published one; "
           "(d) is not evaluated (no frozen run at this budget).",),
)

MNIST1D = Table(
    key="mnist1d",
    title="MNIST-1D baselines (Greydanus 2020)",
    source=("mnist1d README (github.com/greydanus/mnist1d; also the mnist1d 0.0.2.post1 "
            "package description), table \"Comparing MNIST and MNIST-1D\", row MNIST-1D: "
            "MLP 68%, CNN 94% test accuracy"),
    rows=(Row("MLP", "bp", MNIST1D_MLP), Row("CNN", "bp", MNIST1D_CNN),
          Row("MLP frozen (baseline of (d))", BASELINE, MNIST1D_MLP),
          Row("CNN frozen (baseline of (d))", BASELINE, MNIST1D_CNN)),
    columns=(Column("mnist1d", "MNIST-1D", {"MLP": 32.0, "CNN": 6.0}, sizes=(4000, 1000)),),
    recipe=Recipe(lr=1e-2, weight_decay=0.0, batch_size=100, schedule="constant",
                  epochs={"smoke": 2, "cpu": 200},
                  data={"smoke": (("data.n_train", 400), ("data.n_test", 260),
                                  ("data.data_seed", 42)),
                        "cpu": (("data.n_train", 4000), ("data.n_test", 1000),
                                ("data.data_seed", 42))},
                  every={"smoke": 1, "cpu": 20}),
    published_as="test accuracy (%); error = 100 − accuracy",
    notes=(
        "The published dataset: the package's defaults (5 000 samples, 4 000 train / 1 000 "
        "test, seed 42) for every run seed.",
        "Recipe from notebooks/train.py: Adam, learning rate 1e-2, no weight decay, batch "
        "100, 8 000 steps (= 200 epochs of 4 000), constant learning rate; models.py: "
        "MLPBase hidden 100 (train.py's get_model_args says 256), ConvBase 25 channels. "
        "The README does not say which hidden size or step count its table used; chosen: "
        "100 and 8 000. Here AdamW with weight decay 0 (identical to Adam).",
        "The test set has 1 000 samples, fewer than the 8 batches of 128 diagnostic (c) "
        "needs: (c) is not evaluated on MNIST-1D.",
    ),
)

LOCAL_LOSS_STATES = ("blocks.0.act", "blocks.1.act", "blocks.2.act")
LOCAL_LOSS_MLP = Net("MLP 3×1024 (local-loss mlp)", f"{NETS}:local_loss_mlp", LOCAL_LOSS_STATES)
GLOBAL, PRED = "Global loss (BP)", "Local loss 'pred'"
LOCAL_LOSS = Table(
    key="local-loss-mlp",
    title="Nøkland & Eidnes 2019: a 3×1024 MLP on MNIST and Fashion-MNIST, global and local loss",
    source=("local-loss README (github.com/anokland/local-loss; Nøkland & Eidnes 2019, "
            "\"Training neural networks with local error signals\"), tables \"Results on MNIST "
            "with 2 pixel jittering\" and \"Results on Fashion-MNIST with 2 pixel jittering and "
            "horizontal flipping\", row mlp (2.9M parameters), columns \"Global loss\" and "
            "\"Local loss 'pred'\", test error %"),
    rows=(Row(GLOBAL, "bp", LOCAL_LOSS_MLP),
          Row(PRED, "local-ce", LOCAL_LOSS_MLP,
              note="local-ce: each hidden layer on the cross-entropy of its own linear "
                   "classifier (zero at init), its input detached"),
          Row("frozen (baseline of (d))", BASELINE, LOCAL_LOSS_MLP)),
    columns=(
        Column("mnist", "MNIST", {GLOBAL: 0.75, PRED: 0.68},
               data=(("data.augment", True), ("data.augment_padding", 2),
                     ("data.augment_flip", False)), sizes=MNIST_SIZES),
        Column("fashion-mnist", "Fashion-MNIST", {GLOBAL: 8.37, PRED: 8.60},
               data=(("data.augment", True), ("data.augment_padding", 2),
                     ("data.augment_flip", True)), sizes=MNIST_SIZES)),
    recipe=Recipe(lr=5e-4, weight_decay=0.0, batch_size=128, schedule="cosine",
                  epochs={"smoke": 1, "cpu": 10},
                  data={"smoke": (("data.train_subset", 256),),
                        "cpu": (("data.train_subset", None),)},
                  every={"smoke": 1, "cpu": 1}),
    notes=(
        "The README's recipe for the MLP on MNIST (train.py): Adam, learning rate 5e-4, no "
        "weight decay, batch 128, 100 epochs with the learning rate ×0.25 at epochs 50, 75, 89 "
        "and 94; three hidden layers of 1024 units, each Linear → BatchNorm → LeakyReLU(0.01) "
        "→ dropout 0.1; the training images randomly shifted by up to 2 pixels (RandomCrop 28, "
        "padding 2), on Fashion-MNIST also flipped horizontally; 'Global loss' adds "
        "--backprop, 'pred' --loss-sup pred. The README gives no Fashion-MNIST recipe: the "
        "MNIST one is used. Here AdamW with weight decay 0 (identical to Adam) and a cosine "
        "schedule (creditaudit has no step schedule) over 10 epochs — a tenth of the "
        "source's, which this machine cannot afford.",
        "'pred' trains each hidden layer on the cross-entropy of a linear classifier of that "
        "layer's output (before its dropout), its input detached; each classifier is zeroed at "
        "init and trained with the layer by the same Adam, and the output layer's weights are "
        "zeroed too. creditaudit's local-ce does the same with two differences: the "
        "classifiers' biases start at zero too (the source keeps PyTorch's default there; "
        "the first step's credit is zero either way), and the output layer keeps its default "
        "initialisation (local_loss_mlp(zero_out=True) would zero it), so that BP, 'pred' "
        "and the frozen baseline of (d) start from one network. The classifiers train by "
        "their own AdamW at the run's learning rate; the credit is the raw local gradient "
        "(normalise_credit=false).",
        "The README does not say whether its errors are the best or the last epoch's; both "
        "are reported here, the best-epoch one compared with the published number.",
    ),
    smoke_data=(("data.in_dim", 784), ("data.n_train", 256), ("data.n_test", 256)),
)

LOCAL_LOSS_LONG = Table(
    key="local-loss-mlp-long",
    title="Nøkland & Eidnes's table at the source's 100 epochs (one seed)",
    source=LOCAL_LOSS.source,
    rows=tuple(r for r in LOCAL_LOSS.rows if not r.baseline),
    columns=LOCAL_LOSS.columns,
    recipe=Recipe(lr=5e-4, weight_decay=0.0, batch_size=128, schedule="cosine",
                  epochs={"cpu": 100}, data={"cpu": (("data.train_subset", None),)},
                  every={"cpu": 10}),
    seeds=1,
    notes=("The budget check of the table above: the same recipe for the source's 100 "
           "epochs, one seed; (d) is not evaluated (no frozen run at this budget).",),
)

PROTOCOL_RESNET = Table(
    key="resnet20-fashion",
    title="The protocol on a trained BatchNorm convnet: ResNet-20 on Fashion-MNIST",
    source="no published number: does trained BP pass the protocol on ResNet-20?",
    rows=(Row("BP", "bp", RESNET20_GREY),
          Row("frozen (baseline of (d))", BASELINE, RESNET20_GREY)),
    columns=(Column("fashion-mnist", "Fashion-MNIST"),),
    recipe=Recipe(lr=1e-3, weight_decay=1e-4, batch_size=128, schedule="cosine",
                  epochs={"cpu": 6},
                  data={"cpu": (("data.train_subset", 10000),)},
                  every={"cpu": 2}),
    published=False,
    notes=("BioTorch's ResNet-20 Adam recipe (learning rate 1e-3, weight decay 1e-4, batch "
           "128) for 6 epochs on the first 10 000 training images (one ResNet-20 epoch of "
           "10 000 images takes about 1.5 min on one core here).",),
)

# Paper scale: BioTorch's CIFAR-10 table, the two Adam columns with published configs.
CIFAR_SOURCE = ("BioTorch Benchmarks.md, table \"CIFAR 10\" (45k train / 5k validation, best "
                "validation model tested on the 10k test images), column {column}, top-1 "
                "error %")
LENET_CIFAR_TABLE = Table(
    key="biotorch-cifar10-lenet",
    title="BioTorch: LeNet (Adam) on CIFAR-10",
    source=CIFAR_SOURCE.format(column="\"LeNet (Adam)\""),
    rows=biotorch_rows(LENET_CIFAR, {"FA": 1e-4, "DFA": 1e-4}),
    columns=(Column("cifar10", "CIFAR-10", {"BP": 15.92, "FA": 40.67, "DFA": 37.59,
                                            "uSF": 16.34, "brSF": 17.08, "frSF": 16.83},
                    sizes=CIFAR_SIZES),),
    recipe=Recipe(lr=1e-3, weight_decay=1e-4, batch_size=128, schedule="cosine",
                  epochs={"smoke": 1, "cpu": 10, "paper": 250},
                  data={"smoke": (("data.train_subset", 256),)},
                  every={"smoke": 1, "cpu": 1, "paper": 10}),
    scales=("paper",),
    notes=("benchmark_configs/cifar10/le_net/adam/*.yaml: Adam, learning rate 1e-3 (BP, uSF, "
           "brSF, frSF) and 1e-4 (FA, DFA), weight decay 1e-4, batch 128, 250 epochs, ×0.1 at "
           "epochs 100/150/200, random crop (padding 4) and flip. Here AdamW and a cosine "
           "schedule (creditaudit has no step schedule), all 50 000 training images (no 5 000 "
           "validation split); best-epoch and last-epoch test error reported.",),
)
RESNET20_CIFAR_TABLE = Table(
    key="biotorch-cifar10-resnet20",
    title="BioTorch: ResNet-20 (Adam) on CIFAR-10",
    source=CIFAR_SOURCE.format(column="\"ResNet-20 (Adam)\""),
    rows=biotorch_rows(RESNET20),
    columns=(Column("cifar10", "CIFAR-10", {"BP": 10.01, "FA": 29.59, "DFA": 32.16,
                                            "uSF": 10.59, "brSF": 11.08, "frSF": 11.22},
                    sizes=CIFAR_SIZES),),
    recipe=Recipe(lr=1e-3, weight_decay=1e-4, batch_size=128, schedule="cosine",
                  epochs={"smoke": 1, "cpu": 10, "paper": 250},
                  data={"smoke": (("data.train_subset", 256),)},
                  every={"smoke": 1, "cpu": 2, "paper": 10}),
    scales=("paper",),
    notes=("benchmark_configs/cifar10/resnet_20/adam/*.yaml: Adam, learning rate 1e-3 for "
           "every rule, weight decay 1e-4, batch 128, 250 epochs, ×0.1 at epochs 100/150/200. "
           "BioTorch's ResNet-20 is Xavier-initialised; creditaudit.testing.zoo's is "
           "He-initialised (He et al. 2016).",),
)

TABLES: tuple[Table, ...] = (BIOTORCH_MNIST, MNIST1D, PROTOCOL_RESNET, BIOTORCH_MNIST_LONG,
                             LOCAL_LOSS, LOCAL_LOSS_LONG, LENET_CIFAR_TABLE,
                             RESNET20_CIFAR_TABLE)

__all__ = ["Net", "Row", "Column", "Recipe", "Table", "TABLES", "BASELINE", "biotorch_rows"]
