"""Credit rules wrong only where the door did not look (tests/test_door_mutants.py): under
an option of their own that is not its default, for a batch of one sample, or in what their
step does to torch's global random stream.

- ``opts-shared-feedback``: DFA whose credits, with ``method.share = true``, project every
  state's error through the first state's feedback, while its step keeps each state's own
  (its default, ``share = false``, is DFA);
- ``opts-squeezed``: backprop whose credits are squeezed, so a batch of one sample loses its
  batch dimension;
- ``opts-reseeds``: backprop whose step reseeds torch's global RNG (a network's dropout then
  draws one mask at every step);
- ``opts-second-step-flips``: backprop whose steps from the second on train the first block
  on its gradient negated (a step count saved with its state), while its credits stay
  backprop's;
- ``opts-negated-embedding``: backprop (declared ``feedback_kind = "none"``) whose credit
  of h_0 is negated, while its step trains the embedding with backprop.
"""

from dataclasses import dataclass

import torch

from creditaudit.config import opt
from creditaudit.methods.bp import BP
from creditaudit.methods.dfa import DFA
from creditaudit.methods.feedback import LocalFeedbackOptions


@dataclass
class SharedFeedbackOptions(LocalFeedbackOptions):
    share: bool = opt(False, "every state's credit uses the first state's feedback")


class SharedFeedback(DFA):
    name, label = "opts-shared-feedback", "Shared feedback"
    Options = SharedFeedbackOptions

    def credits(self, x, y):
        if not self.options.share:
            return super().credits(x, y)
        own = self.feedback
        self.feedback = [own[0]] * len(own)
        try:
            return super().credits(x, y)
        finally:
            self.feedback = own


class Squeezed(BP):
    name, label = "opts-squeezed", "Squeezed"

    def credits(self, x, y):
        return [a.squeeze() for a in super().credits(x, y)]


class Reseeds(BP):
    name, label = "opts-reseeds", "Reseeds"

    def train_step(self, x, y, optimizer):
        torch.manual_seed(0)
        return super().train_step(x, y, optimizer)


class SecondStepFlips(BP):
    name, label = "opts-second-step-flips", "Second step flips"
    stacked_step = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps = 0

    def train_step(self, x, y, optimizer):
        self.steps += 1
        params = [p for p in self.model.blocks[0].parameters() if p.requires_grad]
        hooks = [p.register_hook(torch.neg) for p in params] if self.steps > 1 else []
        try:
            return super().train_step(x, y, optimizer)
        finally:
            for hook in hooks:
                hook.remove()

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = int(state["steps"])


class NegatedEmbedding(BP):
    name, label = "opts-negated-embedding", "Negated embedding"
    feedback_kind = "none"
    stacked_step = None

    def credits(self, x, y):
        credits = super().credits(x, y)
        return [-credits[0], *credits[1:]]
