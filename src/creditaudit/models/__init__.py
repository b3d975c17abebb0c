"""Models meeting the credit-rule contract (embed, blocks, readout, states), and the
registry of architectures that build them (:mod:`creditaudit.models.registry`)."""

from __future__ import annotations

from creditaudit.models.contract import (
    ResidualNet,
    check_contract,
    readout_parameters,
    set_trainable_blocks,
    summary_vectors,
)
from creditaudit.models.convmixer import ConvMixer
from creditaudit.models.images import image_shape
from creditaudit.models.module_factory import ModuleArchitecture
from creditaudit.models.plain import PlainMLP
from creditaudit.models.registry import (
    ARCHITECTURES,
    Architecture,
    ImageArchitecture,
    architecture,
    build_model,
    register,
)
from creditaudit.models.resmlp import MLPBlock, ResidualMLP
from creditaudit.models.vit import ViTMini

__all__ = [
    "ResidualNet", "ResidualMLP", "MLPBlock", "PlainMLP", "ViTMini", "ConvMixer",
    "Architecture", "ImageArchitecture", "ModuleArchitecture", "ARCHITECTURES",
    "architecture", "register", "build_model", "check_contract", "image_shape",
    "readout_parameters", "set_trainable_blocks", "summary_vectors",
]
