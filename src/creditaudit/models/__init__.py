"""Models meeting the credit-rule contract (embed, blocks, readout, states)."""

from __future__ import annotations

from creditaudit.config import ModelConfig
from creditaudit.errors import ConfigError
from creditaudit.models.contract import (
    ResidualNet,
    check_contract,
    readout_parameters,
    set_trainable_blocks,
    summary_vectors,
)
from creditaudit.models.convmixer import ConvMixer
from creditaudit.models.images import image_shape
from creditaudit.models.plain import PlainMLP
from creditaudit.models.resmlp import MLPBlock, ResidualMLP
from creditaudit.models.vit import ViTMini


def build_model(config: ModelConfig, *, input_shape: tuple[int, ...], n_classes: int
                ) -> ResidualNet:
    """Build the configured architecture for inputs of ``input_shape`` (without batch).

    ``student`` is the teacher–student StudentNet: a 4-block d=128 ResidualMLP without a
    terminal LN (``d``, ``n_blocks`` and ``out_ln`` are fixed by the preset). ``vit`` and
    ``convmixer`` read C×H×W images, or 3072 features viewed as 3×32×32 (the synthetic task).
    """
    if config.arch == "vit":
        if config.d % config.heads:
            raise ConfigError(f"model.d={config.d} is not divisible by model.heads="
                              f"{config.heads}: ViT-Mini splits the width across its heads")
        return ViTMini(n_classes=n_classes, d=config.d, n_blocks=config.n_blocks,
                       heads=config.heads, mlp_ratio=config.mlp_ratio, patch=config.patch,
                       image_shape=image_shape(input_shape, config.arch, config.patch),
                       out_ln=config.out_ln, residual=config.residual, w2_std=config.w2_std)
    if config.arch == "convmixer":
        return ConvMixer(n_classes=n_classes, d=config.d, n_blocks=config.n_blocks,
                         patch=config.patch, kernel=config.kernel,
                         image_shape=image_shape(input_shape, config.arch, config.patch),
                         out_ln=config.out_ln, residual=config.residual, w2_std=config.w2_std)
    in_dim = 1
    for size in input_shape:
        in_dim *= size
    if config.arch == "student":
        return ResidualMLP(in_dim, 128, n_classes, 4, out_ln=False, residual=config.residual,
                           w2_std=config.w2_std)
    return ResidualMLP(in_dim, config.d, n_classes, config.n_blocks, out_ln=config.out_ln,
                       residual=config.residual, w2_std=config.w2_std)


__all__ = [
    "ResidualNet", "ResidualMLP", "MLPBlock", "PlainMLP", "ViTMini", "ConvMixer",
    "build_model", "check_contract", "image_shape", "readout_parameters",
    "set_trainable_blocks", "summary_vectors",
]
