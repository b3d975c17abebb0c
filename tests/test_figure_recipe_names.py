"""A figure names the recipe it draws with its precision and dtype when they are not
float32: bf16 and float64 runs are their own recipes, and their figures read alike
otherwise."""

from __future__ import annotations

import dataclasses

import pytest

from creditaudit.config import RunConfig
from creditaudit.figures.runs import describe_recipe
from creditaudit.protocol.records import model_description
from creditaudit.run.trainer import train

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = {"data.n_train": 128, "data.n_test": 128, "data.in_dim": 8, "data.teacher_width": 16,
        "model.d": 16, "model.n_blocks": 2, "optim.epochs": 1, "optim.batch_size": 64,
        "diagnostics.eval_samples": 128, "diagnostics.end_of_run": False,
        "run.progress": False}


def test_a_bf16_or_float64_recipe_says_so_and_float32_says_nothing(tmp_path):
    record = train(RunConfig().replace(**{**TINY, "run.out_dir": str(tmp_path)})).record
    assert describe_recipe(record) == "synthetic, ResMLP d=16 L=2, 1 epochs"
    bf16 = train(RunConfig().replace(**{**TINY, "run.out_dir": str(tmp_path),
                                        "run.precision": "bf16"})).record
    assert describe_recipe(bf16) == "synthetic, ResMLP d=16 L=2, bf16, 1 epochs"
    # a Recorder's network held in float64 (its record's model.dtype)
    record.model = dataclasses.replace(model_description(record), dtype="float64")
    assert describe_recipe(record) == "synthetic, ResMLP d=16 L=2, float64, 1 epochs"
