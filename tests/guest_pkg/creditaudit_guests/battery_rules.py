"""Credit rules for the outside battery (tests/test_outside_battery.py): each is backprop
with one thing wrong — its credits (NaN, wrong shape, too few, raising, changing weights),
its step (returning nothing, exiting, printing) or its construction.
"""

import sys

import torch

from creditaudit.methods.bp import BP


class NaNCredits(BP):
    name, label = "battery-nan-credits", "NaN credits"

    def credits(self, x, y):
        return [torch.full_like(a, float("nan")) for a in super().credits(x, y)]


class WrongShapeCredits(BP):
    name, label = "battery-wrong-shape-credits", "Wrong-shape credits"

    def credits(self, x, y):
        return [a[:, :-1] for a in super().credits(x, y)]


class TooFewCredits(BP):
    name, label = "battery-too-few-credits", "Too few credits"

    def credits(self, x, y):
        return super().credits(x, y)[:-1]


class CreditsRaise(BP):
    name, label = "battery-credits-raise", "Credits raise"

    def credits(self, x, y):
        raise IndexError("the credit table is empty")


class CreditsMoveWeights(BP):
    """Its credits add a little to the first parameter: a side effect of measuring."""

    name, label = "battery-credits-move-weights", "Credits move weights"

    def credits(self, x, y):
        with torch.no_grad():
            next(self.model.parameters()).add_(1e-2)
        return super().credits(x, y)


class StepReturnsNone(BP):
    name, label = "battery-step-returns-none", "Step returns None"

    def train_step(self, x, y, optimizer):
        super().train_step(x, y, optimizer)


class StepExits(BP):
    name, label = "battery-step-exits", "Step exits"

    def train_step(self, x, y, optimizer):
        if x.shape[0] > 16:  # past the door's tiny batches
            sys.exit("the step had enough")
        return super().train_step(x, y, optimizer)


class InitRaises(BP):
    name, label = "battery-init-raises", "Init raises"

    def __init__(self, model, config, *, n_classes, generator):
        raise TypeError("missing feedback_table")


class Talkative(BP):
    """Well behaved, but prints on stdout in every step."""

    name, label = "battery-talkative", "Talkative"

    def train_step(self, x, y, optimizer):
        print("a talkative step")
        return super().train_step(x, y, optimizer)


class ScaledCredits(BP):
    """Backprop's credits times 3: a direction-preserving rescale (cosines stay +1)."""

    name, label = "battery-scaled-credits", "Scaled credits"

    def credits(self, x, y):
        return [3.0 * a for a in super().credits(x, y)]


class NoTrainableParameters(BP):
    name, label = "battery-no-parameters", "No parameters"

    def trainable_parameters(self):
        return []
