"""Architectures: self-describing builders of contract models, found by name.

An :class:`Architecture` is the ``model.arch`` a config selects, used as an instance
holding its options (``ResMLPArchitecture(config.model)``): its ``Options`` are the
``model.*`` keys it reads, :meth:`Architecture.check` validates them against the input shape
the dataset declares (before any data is loaded), and :meth:`Architecture.build` returns a
:class:`~creditaudit.models.contract.ResidualNet`. What the built model is — its terminal
LayerNorm, width, depth, input shape, label — is asked of the model itself
(:meth:`ResidualNet.describe`), never of the config.

A package adds one through the ``creditaudit.models`` entry-point group (see
docs/extending.md); the built-ins register with :func:`register`.

Any ``nn.Module`` trains from the command line through the ``module`` architecture: its
``model.factory`` (``package.module:callable``) builds the network from ``model.args`` and
:func:`creditaudit.adapt` names its states ``model.states`` — one registered architecture
whose options say which module, not a registry of modules
(:mod:`creditaudit.models.module_factory`). Runs recorded from a user's own
loop (:class:`creditaudit.Recorder`) name the ``own-loop`` architecture, which describes and
never builds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from creditaudit.config import opt
from creditaudit.errors import ConfigError
from creditaudit.models.contract import ResidualNet
from creditaudit.models.convmixer import ConvMixer
from creditaudit.models.images import image_shape
from creditaudit.models.resmlp import ResidualMLP
from creditaudit.models.vit import ViTMini
from creditaudit.registry import ARCHITECTURES, Component, defines

if TYPE_CHECKING:
    from creditaudit.guests import Guest

INPUT_KINDS = ("vector", "image", "stored")
# Covariant: an architecture of ViTOptions is an architecture of PatchOptions.
OptionsT = TypeVar("OptionsT", covariant=True)


class Architecture(Component, Generic[OptionsT]):
    """A model architecture (see the module docstring); ``self.options``: its config section
    (``config.model``) or ``Options`` instance, declared as the parameter of the base
    (``class MyArch(Architecture[MyOptions])``).

    ``input_kind``: ``"vector"`` — the model reads flat ``(B, D)`` features (image data is
    flattened) —, ``"image"`` — it reads ``(B, C, H, W)`` images — or ``"stored"`` — it
    reads samples as the dataset stores them (images as images, features as features).
    ``adapted``: True when :meth:`build` returns an adapted model
    (:class:`~creditaudit.models.adapted.AdaptedModel`) rather than a ``ResidualNet``.
    ``unbuildable``: why the architecture only describes runs and builds nothing (empty:
    it builds); a run plan refuses it with that reason. ``task``: the dataset the
    architecture is the model of, when it belongs to one task (experiments then run it
    there whatever the scale's dataset); empty for any dataset.
    """

    input_kind: ClassVar[str] = "vector"
    adapted: ClassVar[bool] = False
    unbuildable: ClassVar[str] = ""
    task: ClassVar[str] = ""
    hooks = ("check", "build", "guest_code", "same_as_default")

    options: OptionsT

    def check(self, input_shape: tuple[int, ...]) -> None:
        """ConfigError (one line) when the options cannot build a model for inputs of
        ``input_shape`` (one sample, as the dataset declares it)."""

    def build(self, *, input_shape: tuple[int, ...], n_classes: int) -> ResidualNet:
        """The model for inputs of ``input_shape`` (one sample, flattened for vector
        architectures) and ``n_classes`` logits."""
        raise NotImplementedError

    def guest_code(self) -> Guest | None:
        """Code from outside creditaudit that the options make this architecture run (the
        ``module`` architecture's factory), as a :class:`~creditaudit.guests.Guest` whose
        digest joins the run id; None when there is none (the default). A plugin
        architecture is a guest itself (:meth:`creditaudit.registry.Registry.guest`)."""
        return None

    def same_as_default(self) -> dict[str, Any]:
        """Own options whose value, given explicitly, builds what their default builds, by
        name, with that default (the run is then the default's run: one id, one record)."""
        return {}

    @classmethod
    def flat_dim(cls, input_shape: tuple[int, ...]) -> int:
        size = 1
        for n in input_shape:
            size *= n
        return size


def _validate(cls: type[Architecture], source: str) -> None:
    if cls.input_kind not in INPUT_KINDS:
        raise ConfigError(f"{source} ({cls.name}): input_kind must be one of "
                          f"{', '.join(INPUT_KINDS)}")
    if not defines(cls, "build", Architecture):
        raise ConfigError(f"{source} ({cls.name}) must implement build()")


ARCHITECTURES.configure(Architecture, _validate)
register = ARCHITECTURES.register


# --- the built-ins --------------------------------------------------------------------------
@dataclass
class ResidualOptions:
    """What every built-in residual architecture reads."""

    d: int = opt(256, "width", min=1)
    n_blocks: int = opt(4, "number of residual blocks L", min=1)
    out_ln: bool = opt(True, "terminal LayerNorm before the head (ConvMixer: on the pooled "
                       "vector)")
    residual: bool = opt(True, "skip connections (False = no-residual control)")
    w2_std: float = opt(0.01, "init std of each block's last linear layer (ConvMixer: its "
                        "pointwise convolution; ViT: its MLP's and its attention's output "
                        "projections)", min=0.0)


@dataclass
class PatchOptions:
    patch: int = opt(4, "ViT, ConvMixer: patch size p (p×p patches; must divide the image "
                     "side)", min=1)


PatchOptionsT = TypeVar("PatchOptionsT", bound=PatchOptions, covariant=True)


@dataclass
class ViTOptions(PatchOptions, ResidualOptions):
    heads: int = opt(4, "ViT: attention heads", min=1)
    mlp_ratio: int = opt(4, "ViT: MLP hidden width / d", min=1)


@dataclass
class ConvMixerOptions(PatchOptions, ResidualOptions):
    kernel: int = opt(5, "ConvMixer: depthwise convolution kernel size (same padding)", min=1)


@dataclass
class StudentOptions:
    residual: bool = opt(True, "skip connections (False = no-residual control)")
    w2_std: float = opt(0.01, "init std of each block's last linear layer", min=0.0)


@register
class ResMLPArchitecture(Architecture[ResidualOptions]):
    """The pre-LN ResidualMLP (the main audited model)."""

    name = "resmlp"
    label = "ResMLP"
    rank = 0

    def build(self, *, input_shape: tuple[int, ...], n_classes: int) -> ResidualNet:
        options = self.options
        return ResidualMLP(self.flat_dim(input_shape), options.d, n_classes, options.n_blocks,
                           out_ln=options.out_ln, residual=options.residual,
                           w2_std=options.w2_std)


@register
class StudentArchitecture(Architecture[StudentOptions]):
    """StudentNet of the teacher–student task: a preset ResidualMLP, d=128, L=4, without a
    terminal LayerNorm (width, depth and the LayerNorm are fixed by the preset)."""

    name = "student"
    label = "StudentNet"
    rank = 30
    task = "synthetic"  # the student of the synthetic teacher–student task
    WIDTH, BLOCKS = 128, 4

    def build(self, *, input_shape: tuple[int, ...], n_classes: int) -> ResidualNet:
        return ResidualMLP(self.flat_dim(input_shape), self.WIDTH, n_classes, self.BLOCKS,
                           out_ln=False, residual=self.options.residual,
                           w2_std=self.options.w2_std)


class ImageArchitecture(Architecture[PatchOptionsT]):
    """ViT-Mini and ConvMixer: C×H×W images (or 3072 features viewed as 3×32×32) whose
    sides the patch size divides."""

    input_kind = "image"

    def check(self, input_shape: tuple[int, ...]) -> None:
        image_shape(input_shape, self.name, self.options.patch)


@register
class ViTArchitecture(ImageArchitecture[ViTOptions]):
    """ViT-Mini: patch tokens + CLS, pre-LN transformer blocks, head on the CLS token."""

    name = "vit"
    label = "ViT-Mini"
    rank = 10

    def check(self, input_shape: tuple[int, ...]) -> None:
        super().check(input_shape)
        options = self.options
        if options.d % options.heads:
            raise ConfigError(f"model.d={options.d} is not divisible by model.heads="
                              f"{options.heads}: ViT-Mini splits the width evenly across its "
                              "attention heads")

    def build(self, *, input_shape: tuple[int, ...], n_classes: int) -> ResidualNet:
        self.check(input_shape)
        options = self.options
        return ViTMini(n_classes=n_classes, d=options.d, n_blocks=options.n_blocks,
                       heads=options.heads, mlp_ratio=options.mlp_ratio, patch=options.patch,
                       image_shape=image_shape(input_shape, self.name, options.patch),
                       out_ln=options.out_ln, residual=options.residual,
                       w2_std=options.w2_std)


@register
class ConvMixerArchitecture(ImageArchitecture[ConvMixerOptions]):
    """ConvMixer: patch embedding, residual depthwise → GELU → BatchNorm → pointwise blocks,
    global pooling, linear head."""

    name = "convmixer"
    label = "ConvMixer"
    rank = 20

    def build(self, *, input_shape: tuple[int, ...], n_classes: int) -> ResidualNet:
        options = self.options
        return ConvMixer(n_classes=n_classes, d=options.d, n_blocks=options.n_blocks,
                         patch=options.patch, kernel=options.kernel,
                         image_shape=image_shape(input_shape, self.name, options.patch),
                         out_ln=options.out_ln, residual=options.residual,
                         w2_std=options.w2_std)


# --- adapted models: the module architecture (module_factory.py) and the user's own loop ------
STATES_HELP = ("submodules whose outputs are the states h_0 … h_L, in the order the forward "
               "computes them (names of named_modules(); see creditaudit.adapt)")
READOUT_HELP = "submodules of the head (None = everything after the last state)"


class AdaptedArchitecture(Architecture[OptionsT]):
    """Architectures of adapted models: their samples reach the module as stored."""

    input_kind = "stored"
    adapted = True


@dataclass
class OwnLoopOptions:
    module: str = opt("", "the class of the network a user's own loop trained "
                      "(package.module:Class; recorded, never imported)")
    states: list[str] | None = opt(None, STATES_HELP)
    readout: list[str] | None = opt(None, READOUT_HELP)


@register
class OwnLoopArchitecture(AdaptedArchitecture[OwnLoopOptions]):
    """A model trained in the user's own loop and recorded with
    :class:`creditaudit.Recorder`: its record describes it (``describe()`` of the model);
    creditaudit cannot build it again, so audit, resume and train refuse it in one line."""

    name = "own-loop"
    label = "Own loop"
    rank = 50
    unbuildable = ("it was trained in its own loop (creditaudit.Recorder), and only runs the "
                   "command line trained can be rebuilt; audit it in that loop with "
                   "creditaudit.diagnose")

    def check(self, input_shape: tuple[int, ...]) -> None:
        raise ConfigError(f"model.arch={self.name!r}: {self.unbuildable}")

    def build(self, *, input_shape: tuple[int, ...], n_classes: int) -> Any:
        self.check(input_shape)


def architecture(name: str) -> type[Architecture[Any]]:
    """The architecture class called ``name`` (ConfigError naming the choices otherwise);
    ``architecture(name)(config.model)`` is the instance that builds."""
    return ARCHITECTURES.get(name)


def build_model(options: Any, *, input_shape: tuple[int, ...], n_classes: int
                ) -> ResidualNet:
    """Build the architecture ``options.arch`` selects (``options``: a config's model
    section) for inputs of ``input_shape`` (without batch) and ``n_classes`` classes; the
    model remembers its architecture and input shape (:meth:`ResidualNet.describe`)."""
    return build_architecture(architecture(options.arch)(options),
                              input_shape=input_shape, n_classes=n_classes)


def build_architecture(arch: Architecture[Any], *, input_shape: tuple[int, ...],
                       n_classes: int) -> ResidualNet:
    """:func:`build_model` for the architecture instance ``arch`` itself (holding its
    options), registered or not: checked, built, and told its architecture (``arch``) and
    input shape."""
    shape = tuple(input_shape)
    arch.check(shape)
    model = arch.build(input_shape=shape, n_classes=n_classes)
    model.architecture = arch
    model.input_shape = (arch.flat_dim(shape),) if arch.input_kind == "vector" else shape
    return model


__all__ = ["Architecture", "ImageArchitecture", "AdaptedArchitecture", "OwnLoopArchitecture",
           "register", "architecture", "build_model", "build_architecture", "ResidualOptions",
           "STATES_HELP", "READOUT_HELP", "ARCHITECTURES"]
