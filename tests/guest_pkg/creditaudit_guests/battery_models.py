"""Architectures for the outside battery (tests/test_outside_battery.py): ``build()``
returns no model, another kind of model, a model with NaN weights, exits, or seeds torch.
"""

import sys

import torch
from torch import nn

from creditaudit.models import ResidualMLP
from creditaudit.models.registry import ResMLPArchitecture


def _mlp(options, input_shape, n_classes):
    return ResidualMLP(ResMLPArchitecture.flat_dim(input_shape), options.d, n_classes,
                       options.n_blocks, out_ln=options.out_ln, residual=options.residual,
                       w2_std=options.w2_std)


class ReturnsNone(ResMLPArchitecture):
    name, label, rank = "battery-returns-none", "Returns None", 100

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        return None


class ReturnsLinear(ResMLPArchitecture):
    name, label, rank = "battery-returns-linear", "Returns Linear", 100

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        return nn.Linear(ResMLPArchitecture.flat_dim(input_shape), n_classes)


class NaNWeights(ResMLPArchitecture):
    name, label, rank = "battery-nan-weights", "NaN weights", 100

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        model = _mlp(options, input_shape, n_classes)
        with torch.no_grad():
            next(model.parameters())[0, 0] = float("nan")
        return model


class BuildExits(ResMLPArchitecture):
    name, label, rank = "battery-build-exits", "Build exits", 100

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        if options.d > 8:  # wider than the door's tiny models
            sys.exit(4)
        return _mlp(options, input_shape, n_classes)


class Seeding(ResMLPArchitecture):
    """Seeds torch's global RNG in build(): every run seed would start from one init."""

    name, label, rank = "battery-seeding", "Seeding", 100

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        torch.manual_seed(0)
        return _mlp(options, input_shape, n_classes)


class WrongInput(ResMLPArchitecture):
    """Builds for one more input feature than the data has."""

    name, label, rank = "battery-wrong-input", "Wrong input", 100

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        return ResidualMLP(ResMLPArchitecture.flat_dim(input_shape) + 1, options.d,
                           n_classes, options.n_blocks)


class Float64(ResMLPArchitecture):
    name, label, rank = "battery-float64", "Float64", 100

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        return _mlp(options, input_shape, n_classes).double()
