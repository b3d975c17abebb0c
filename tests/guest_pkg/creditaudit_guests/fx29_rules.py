"""A credit rule whose weights blow up after its first training step on a batch larger than
the door's (tests/test_diverged_experiments.py): it passes the door, and its run diverges in
its first epoch, before any epoch's protocol was recorded (the record's ``protocol`` is
empty, it has no final numbers of a trained epoch).
"""

import torch

from creditaudit.methods.bp import BP

# The rule suite's batches have 9 samples (creditaudit.testing.common.BATCH); the tests'
# training batches have more than this.
DOOR_BATCH = 32


class BlowsUp(BP):
    """Backprop, except that every weight is multiplied by 1e30 after a step on more than 32
    samples (the loss is Inf from the next step on)."""

    name, label = "fx29-blowup", "Blows up at once"

    def train_step(self, x, y, optimizer):
        result = super().train_step(x, y, optimizer)
        if x.shape[0] > DOOR_BATCH:
            with torch.no_grad():
                for parameter in self.model.parameters():
                    parameter.mul_(1e30)
        return result
