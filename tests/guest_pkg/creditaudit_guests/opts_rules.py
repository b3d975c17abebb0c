"""Credit rules wrong only where the door did not look (tests/test_door_mutants.py): under
an option of their own that is not its default, for a batch of one sample, or in what their
step does to torch's global random stream.

- ``opts-shared-feedback``: DFA whose credits, with ``method.share = true``, project every
  state's error through the first state's feedback, while its step keeps each state's own
  (its default, ``share = false``, is DFA);
- ``opts-squeezed``: backprop whose credits are squeezed, so a batch of one sample loses its
  batch dimension;
- ``opts-reseeds``: backprop whose step reseeds torch's global RNG (a network's dropout then
  draws one mask at every step).
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
