"""Credit rules that fail at creditaudit's door, or break at run time (tests/test_door*.py).

- ``door-readout-liar``: trains its readout alone (blocks and embedding never move) but
  reports backprop's gradients as its credit — audited, it would score cos +1.000;
- ``door-step-raises``: conforms on the suite's tiny networks, but its training step raises
  on batches larger than the suite's (the error must name the plugin, not creditaudit);
- ``door-token-state-liar``: backprop, for adapted models too, except on a model with token
  states, where it trains its readout alone (a lie only states of that layout show).
"""

import torch
from torch.nn import functional as F

from creditaudit.methods.base import CreditRule, loss_precision, step_result
from creditaudit.methods.bp import BP, bp_state_gradients
from creditaudit.models.contract import readout_parameters


class ReadoutLiar(CreditRule):
    name = "door-readout-liar"
    label = "Readout liar"
    credit_formula = "a_l = g_l (claimed)"

    def credits(self, x, y):
        return bp_state_gradients(self.model, x, y)

    def train_step(self, x, y, optimizer):
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            states, _ = self.model.forward_states(x)
        logits = self.model.readout(states[-1].detach())
        ce = F.cross_entropy(loss_precision(logits), y)
        result = step_result(ce, logits, y)
        if result.finite:
            ce.backward()
            optimizer.step()
        return result

    def trainable_parameters(self):
        return [p for p in readout_parameters(self.model) if p.requires_grad]


class StepRaises(BP):
    name = "door-step-raises"
    label = "Step raises"

    def train_step(self, x, y, optimizer):
        if x.shape[0] > 16:
            raise RuntimeError("the step lost its feedback")
        return super().train_step(x, y, optimizer)


class TokenLiar(BP):
    """``door-token-liar``: backprop on flat states; on a ViT's images it trains its
    readout alone while still reporting backprop's gradients as its credit — a lie only
    the tiny version of the run's own architecture shows."""

    name = "door-token-liar"
    label = "Token liar"
    adapted_models = False

    def train_step(self, x, y, optimizer):
        if x.dim() == 2:
            return super().train_step(x, y, optimizer)
        return ReadoutLiar.train_step(self, x, y, optimizer)

    def trainable_parameters(self):
        return [p for p in self.model.parameters() if p.requires_grad]


class TokenStateLiar(BP):
    """``door-token-state-liar``: backprop on vector and map states (adapted models
    included); on a model with token states, its readout alone, with backprop's gradients
    reported as its credit."""

    name = "door-token-state-liar"
    label = "Token-state liar"

    def train_step(self, x, y, optimizer):
        shapes = getattr(self.model, "state_shapes", ())  # an adapted model's
        if self.model.describe().layout != "tokens" and all(len(s) != 2 for s in shapes):
            return super().train_step(x, y, optimizer)
        return ReadoutLiar.train_step(self, x, y, optimizer)

    def trainable_parameters(self):
        return [p for p in self.model.parameters() if p.requires_grad]
