"""Building an experiment's runs hands no model an option it does not take.

The scales set the ResidualMLP's width and depth (``model.d``, ``model.n_blocks``); an
experiment's StudentNet runs (whose size is their task's) and the literature's ``module``
networks used to get them too, and replacing the architecture then warned, once per run, of
options the user never gave (``experiment --list --scale smoke`` printed ~58 such lines).
The scale's sizes now go only to an architecture that reads them, and the runs are the same.
"""

from __future__ import annotations

import logging

from creditaudit.study.experiments import experiment_names, get_experiment


def test_no_experiment_warns_of_options_a_model_does_not_take(tmp_path, caplog):
    configs = []
    with caplog.at_level(logging.WARNING):
        for name in experiment_names():
            configs += get_experiment(name).configs("smoke", out_dir=tmp_path)
    assert [r.getMessage() for r in caplog.records if "left out" in r.getMessage()] == []
    archs = {c.model.arch: c.model for c in configs}
    assert {"student", "vit", "resmlp", "module"} <= set(archs)
    # the scale's sizes still reach the architectures that read them
    assert (archs["resmlp"].d, archs["resmlp"].n_blocks) == (16, 2)
    assert archs["vit"].n_blocks == 2
    assert not hasattr(archs["student"], "d")


def test_the_command_line_lists_without_warnings(tmp_path):
    from plugin_support import cli

    done = cli(None, "experiment", "--list", "--scale", "smoke", "--out", str(tmp_path),
               cwd=tmp_path)
    assert done.returncode == 0
    assert "warning" not in done.stderr, done.stderr[:500]
