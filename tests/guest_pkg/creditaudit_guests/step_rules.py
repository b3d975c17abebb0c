"""Credit rules whose training step lies about what it did (tests/test_step_honesty.py).
Each computes a correct update; what is wrong is beside it:

- ``step-halves-its-loss``: reports half the batch's cross-entropy;
- ``step-all-correct``: reports every sample classified correctly;
- ``step-double-step``: applies the optimizer it is handed twice;
- ``step-scales-its-input``: scales its input batch in place after the step;
- ``step-leaves-eval``: puts the model in eval mode and leaves it there;
- ``step-learns-its-feedback``: DFA whose "fixed" feedback grows 1% every step;
- ``step-redraws-each-epoch``: DFA whose "fixed" feedback is redrawn at every epoch's end;
- ``step-decays-its-lr``: halves the optimizer's learning rate after every step (a schedule
  of its own, beside the run's);
- ``step-nan-but-finite``: reports a NaN loss as finite;
- ``step-clears-optimizer-state``: clears the optimizer's state (its moments and step
  counts) before every step;
- ``step-miscounts-past-the-door``: reports twice the batch size on batches larger than the
  door's (it passes the conformance suite, and meets the trainer's check);
- ``step-nan-past-the-door``: reports a NaN loss as finite on those batches.
"""

import dataclasses

import torch

from creditaudit.methods.bp import BP
from creditaudit.methods.dfa import DFA

# The rule suite's batches have 9 samples (creditaudit.testing.common.BATCH); the tests'
# training batches have more than this.
DOOR_BATCH = 32


class HalvesItsLoss(BP):
    name, label = "step-halves-its-loss", "Halves its loss"

    def train_step(self, x, y, optimizer):
        result = super().train_step(x, y, optimizer)
        return dataclasses.replace(result, loss=result.loss / 2)


class AllCorrect(BP):
    name, label = "step-all-correct", "All correct"

    def train_step(self, x, y, optimizer):
        return dataclasses.replace(super().train_step(x, y, optimizer), correct=y.shape[0])


class DoubleStep(DFA):
    name, label = "step-double-step", "Double step"

    def train_step(self, x, y, optimizer):
        step = optimizer.step

        def twice(*args, **kwargs):
            step()
            step()

        optimizer.step = twice
        try:
            return super().train_step(x, y, optimizer)
        finally:
            optimizer.step = step


class ScalesItsInput(DFA):
    name, label = "step-scales-its-input", "Scales its input"

    def train_step(self, x, y, optimizer):
        result = super().train_step(x, y, optimizer)
        x.mul_(0.5)
        return result


class LeavesEval(BP):
    name, label = "step-leaves-eval", "Leaves eval"

    def train_step(self, x, y, optimizer):
        self.model.eval()
        return super().train_step(x, y, optimizer)


class LearnsItsFeedback(DFA):
    name, label = "step-learns-its-feedback", "Learns its feedback"

    def train_step(self, x, y, optimizer):
        result = super().train_step(x, y, optimizer)
        with torch.no_grad():
            for matrix in self.feedback:
                matrix.mul_(1.01)
        return result


class RedrawsEachEpoch(DFA):
    name, label = "step-redraws-each-epoch", "Redraws each epoch"

    def end_epoch(self, epoch, n_epochs):
        self.load_state_dict({"feedback": self.draw_feedback(
            torch.Generator().manual_seed(1000 + epoch))})
        return {}


class DecaysItsLr(BP):
    name, label = "step-decays-its-lr", "Decays its lr"

    def train_step(self, x, y, optimizer):
        result = super().train_step(x, y, optimizer)
        for group in optimizer.param_groups:
            group["lr"] *= 0.5
        return result


class NaNButFinite(BP):
    name, label = "step-nan-but-finite", "NaN but finite"

    def train_step(self, x, y, optimizer):
        result = super().train_step(x, y, optimizer)
        return dataclasses.replace(result, loss=float("nan"), finite=True)


class ClearsOptimizerState(DFA):
    name, label = "step-clears-optimizer-state", "Clears optimizer state"

    def train_step(self, x, y, optimizer):
        optimizer.state.clear()
        return super().train_step(x, y, optimizer)


class MiscountsPastTheDoor(BP):
    name, label = "step-miscounts-past-the-door", "Miscounts past the door"

    def train_step(self, x, y, optimizer):
        result = super().train_step(x, y, optimizer)
        if x.shape[0] > DOOR_BATCH:
            return dataclasses.replace(result, n=2 * result.n)
        return result


class NaNPastTheDoor(BP):
    name, label = "step-nan-past-the-door", "NaN past the door"

    def train_step(self, x, y, optimizer):
        result = super().train_step(x, y, optimizer)
        if x.shape[0] > DOOR_BATCH:
            return dataclasses.replace(result, loss=float("nan"), finite=True)
        return result
