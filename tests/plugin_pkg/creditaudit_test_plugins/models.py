"""A plain MLP (no skips, no LayerNorm anywhere) as a contract model: x → h_0 = act(W_0 x)
→ h_{l+1} = act(W_{l+1} h_l) (``depth`` blocks) → logits = W_out h_L; states (B, width).
docs/extending.md shows this file from its imports down.
"""

from dataclasses import dataclass

from torch import nn

from creditaudit.config import opt
from creditaudit.models import Architecture, ResidualNet

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh}


class PlainMLP(ResidualNet):
    residual = False       # h_{l+1} = f_l(h_l): blocks return the next state, no skip
    terminal_ln = False    # the readout is one Linear on h_L
    state_layout = "vectors"   # states (B, d)

    def __init__(self, in_dim, width, depth, n_classes, activation):
        super().__init__()
        act = ACTIVATIONS[activation]
        self.d, self.n_classes = width, n_classes
        self.embed = nn.Sequential(nn.Linear(in_dim, width), act())
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), act())
                                    for _ in range(depth))
        self.head = nn.Linear(width, n_classes)

    def readout(self, h):
        return self.head(h)


@dataclass
class PlainMLPOptions:
    width: int = opt(64, "hidden width (every state is (B, width))", min=1)
    depth: int = opt(3, "hidden layers after the first (the blocks)", min=1)
    activation: str = opt("relu", "hidden nonlinearity", choices=tuple(ACTIVATIONS))


class PlainMLPArchitecture(Architecture[PlainMLPOptions]):  # model.width, depth, activation
    name = "plain-mlp"            # what --arch and model.arch accept
    label = "Plain MLP"
    input_kind = "vector"         # reads flat (B, D) features; image data is flattened

    def build(self, *, input_shape, n_classes):
        options = self.options    # the model section it was made with
        return PlainMLP(self.flat_dim(input_shape), options.width, options.depth, n_classes,
                        options.activation)
