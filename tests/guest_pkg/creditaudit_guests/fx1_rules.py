"""Credit rules that never train (some of) the blocks they credit (tests/test_conformance.py):
each is backprop — its credits and the ``.grad`` its step leaves are backprop's, so every
check that reads gradients after a zero-learning-rate step passes — but a real step leaves
embedding or blocks at their initial weights, and an audit would score cos +1.000.

- ``fx1-readout-params``: ``trainable_parameters()`` gives only the readout's parameters;
- ``fx1-omits-a-block``: ``trainable_parameters()`` leaves out ``blocks[1]``;
- ``fx1-restores-blocks``: takes backprop's step, then copies every block's old weights back;
- ``fx1-restores-a-block``: the same for ``blocks[1]`` alone;
- ``fx1-skips-the-step``: backprop's backward, but the optimizer's step never runs.
"""

import torch

from creditaudit.methods.bp import BP


class ReadoutParams(BP):
    name, label = "fx1-readout-params", "Readout params"
    adapted_models = False  # reads the contract's embed and blocks

    def trainable_parameters(self):
        credited = {id(p) for part in (self.model.embed, self.model.blocks)
                    for p in part.parameters()}
        return [p for p in self.model.parameters() if p.requires_grad and id(p) not in credited]


class OmitsABlock(BP):
    name, label = "fx1-omits-a-block", "Omits a block"
    adapted_models = False

    def trainable_parameters(self):
        left_out = {id(p) for p in self.model.blocks[1].parameters()}
        return [p for p in self.model.parameters() if p.requires_grad and id(p) not in left_out]


def _restoring(rule, blocks, x, y, optimizer):
    """Backprop's step, then ``blocks`` put back as they were."""
    saved = [(p, p.detach().clone()) for block in blocks for p in block.parameters()]
    result = BP.train_step(rule, x, y, optimizer)
    with torch.no_grad():
        for p, old in saved:
            p.copy_(old)
    return result


class RestoresBlocks(BP):
    name, label = "fx1-restores-blocks", "Restores blocks"
    adapted_models = False

    def train_step(self, x, y, optimizer):
        return _restoring(self, list(self.model.blocks), x, y, optimizer)


class RestoresABlock(BP):
    name, label = "fx1-restores-a-block", "Restores a block"
    adapted_models = False

    def train_step(self, x, y, optimizer):
        return _restoring(self, [self.model.blocks[1]], x, y, optimizer)


class _NoStep:
    """An optimizer whose ``step()`` does nothing."""

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self):
        pass


class SkipsTheStep(BP):
    name, label = "fx1-skips-the-step", "Skips the step"
    adapted_models = False

    def train_step(self, x, y, optimizer):
        return super().train_step(x, y, _NoStep(optimizer))
