"""Architectures that fail at creditaudit's door, or break at run time (tests/test_door*.py).

- ``door-twelve-logits``: a ResidualMLP with a 12-way head whatever the data's classes;
- ``door-hidden-ln``: its readout normalises h_L with a LayerNorm, but it declares
  ``terminal_ln = False`` (diagnostic (b) would name the wrong cause);
- ``door-mlp-head``: its readout is a hidden Linear + ReLU before the head (no terminal
  LayerNorm, as it declares), a layer no block declares (every rule would train it by
  backprop, no diagnostic measures it);
- ``door-build-raises``: conforms on the suite's tiny inputs, but ``build()`` raises for
  wider ones (the error must name the plugin, not creditaudit);
- ``door-chatty``: a well-behaved ResidualMLP whose forward prints (on stdout);
- ``door-wide-logits``, ``door-half-logits``: right logits on the door's batch, a class too
  many or half the rows for batches of more than 64;
- ``door-own-vit``: an honest ViT under a plugin's name (token states on an architecture
  the rule suite has no tiny version of).
"""

import torch
from torch import nn

from creditaudit.models import ResidualMLP
from creditaudit.models.registry import ResidualOptions, ResMLPArchitecture, ViTArchitecture


def _mlp(options, input_shape, n_classes, **overrides):
    kwargs = {"out_ln": options.out_ln, "residual": options.residual,
              "w2_std": options.w2_std, **overrides}
    return ResidualMLP(ResMLPArchitecture.flat_dim(input_shape), options.d, n_classes,
                       options.n_blocks, **kwargs)


class TwelveLogits(ResMLPArchitecture):
    name, label, rank = "door-twelve-logits", "Twelve logits", 100
    Options = ResidualOptions

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        return _mlp(options, input_shape, 12)


class LayerNormHidden(ResidualMLP):
    terminal_ln = False  # but the readout below normalises h_L

    def readout(self, h):
        return self.out_head(nn.functional.layer_norm(h, h.shape[-1:]))


class HiddenLN(ResMLPArchitecture):
    name, label, rank = "door-hidden-ln", "Hidden LN", 100

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        model = LayerNormHidden(ResMLPArchitecture.flat_dim(input_shape), options.d,
                                n_classes, options.n_blocks, out_ln=False,
                                residual=options.residual, w2_std=options.w2_std)
        return model


class HiddenLayerHead(ResidualMLP):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.hidden_head = nn.Linear(self.d, self.d)

    def readout(self, h):
        return super().readout(torch.relu(self.hidden_head(h)))


class MLPHead(ResMLPArchitecture):
    name, label, rank = "door-mlp-head", "MLP head", 100

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        return HiddenLayerHead(ResMLPArchitecture.flat_dim(input_shape), options.d,
                               n_classes, options.n_blocks, out_ln=False,
                               residual=options.residual, w2_std=options.w2_std)


class BuildRaises(ResMLPArchitecture):
    name, label, rank = "door-build-raises", "Build raises", 100

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        if options.d > 8:  # wider than the suite's tiny models
            raise KeyError("width_table")
        return _mlp(options, input_shape, n_classes)


class ChattyMLP(ResidualMLP):
    # Prints in forward_states, the pass every training step and diagnostic runs (plain
    # ``forward`` runs only in the door's conformance check, whose result is cached).
    def forward_states(self, x):
        print("forward of a chatty model")
        return super().forward_states(x)


class Chatty(ResMLPArchitecture):
    name, label, rank = "door-chatty", "Chatty", 100

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        print("building a chatty model")
        return ChattyMLP(ResMLPArchitecture.flat_dim(input_shape), options.d, n_classes,
                         options.n_blocks, out_ln=options.out_ln, residual=options.residual,
                         w2_std=options.w2_std)


class LogitsFromBatch65(ResidualMLP):
    """Right logits for batches of up to 64 samples (the door's), wrong ones beyond: a
    class too many (``extra``) or half the rows."""

    extra = True

    def readout(self, h):
        logits = super().readout(h)
        if h.shape[0] <= 64:
            return logits
        if self.extra:
            return torch.cat([logits, logits[:, :1]], dim=1)
        return logits[: h.shape[0] // 2]


class HalfRows(LogitsFromBatch65):
    extra = False


class WideLogits(ResMLPArchitecture):
    """``door-wide-logits``: (B, n_classes + 1) logits for batches of more than 64."""

    name, label, rank = "door-wide-logits", "Wide logits", 100
    network = LogitsFromBatch65

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        return cls.network(ResMLPArchitecture.flat_dim(input_shape), options.d, n_classes,
                           options.n_blocks, out_ln=options.out_ln, residual=options.residual,
                           w2_std=options.w2_std)


class HalfLogits(WideLogits):
    """``door-half-logits``: (B // 2, n_classes) logits for batches of more than 64."""

    name, label = "door-half-logits", "Half logits"
    network = HalfRows


class OwnViT(ViTArchitecture):
    name, label, rank = "door-own-vit", "Own ViT", 100
