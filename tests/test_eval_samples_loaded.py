"""``diagnostics.eval_samples``'s default shrinks to the test split also where it is known
only once the data is loaded (a file dataset: its folder may hold fewer test samples than
the default 1280), the record says the value used, and a value the user chose that exceeds
the split is still refused in one line.
"""

from __future__ import annotations

import pytest

from creditaudit import RunConfig
from creditaudit.errors import ConfigError
from creditaudit.records import load_record
from creditaudit.run.plan import plan_run
from creditaudit.run.trainer import train
from integrity_support import write_idx_dataset

N_TEST = 200


def fashion(tmp_path, **overrides: object) -> RunConfig:
    folder = write_idx_dataset(tmp_path / "fm", n_train=128, n_test=N_TEST, side=28)
    return RunConfig().replace(**{
        "data.name": "fashion-mnist", "data.data_dir": str(folder), "model.d": 16,
        "model.n_blocks": 2, "optim.epochs": 1, "optim.batch_size": 64,
        "diagnostics.rho_samples": 16, "diagnostics.rho_directions": 2,
        "diagnostics.null_draws": 2, "run.progress": False,
        "run.out_dir": str(tmp_path / "runs"), **overrides})


def test_the_default_shrinks_to_a_loaded_test_split_and_the_record_says_so(tmp_path):
    plan = plan_run(fashion(tmp_path))
    plan.load_data()
    assert plan.eval_samples == N_TEST
    result = train(plan)
    record = load_record(result.run_dir)
    assert record.data is not None and record.data.eval_samples == N_TEST
    assert record.config.diagnostics.eval_samples == 1280  # the config as given: same id
    assert plan_run(record.config).run_id == record.run_id


def test_a_chosen_value_past_the_loaded_test_split_is_refused_and_ids_stay_apart(tmp_path):
    with pytest.raises(ConfigError) as error:
        plan_run(fashion(tmp_path, **{"diagnostics.eval_samples": 300})).load_data()
    assert str(error.value) == ("diagnostics.eval_samples=300 exceeds the 200 test samples "
                                "of fashion-mnist; use at most 200")
    shrunk = plan_run(fashion(tmp_path))
    chosen = plan_run(fashion(tmp_path, **{"diagnostics.eval_samples": 100}))
    chosen.load_data()
    assert chosen.eval_samples == 100 and chosen.run_id != shrunk.run_id


@pytest.mark.parametrize("declared", [True, False])
def test_the_shrunk_default_is_said_once(tmp_path, caplog, monkeypatch, declared):
    """Fitted twice — to the declared sizes when planned, to the loaded split when loaded —
    and said once: the generator declares its sizes, the files' folder does not. Once per
    process, too: an experiment planning twelve runs of one dataset said it twelve times."""
    import logging

    from creditaudit.run import plan as plan_module

    monkeypatch.setattr(plan_module, "_SAID_FITTED", set(), raising=False)  # a fresh process
    config = (RunConfig().replace(**{"data.name": "mnist1d", "data.n_train": 250,
                                     "data.n_test": 500})
              if declared else fashion(tmp_path))
    with caplog.at_level(logging.INFO, logger="creditaudit.run.plan"):
        plan = plan_run(config)
        plan.load_data()
        again = plan_run(config.replace(**{"run.seed": 1}))
        again.load_data()
    said = [r for r in caplog.records if "evaluating on all" in r.getMessage()]
    assert len(said) == 1 and plan.eval_samples == (500 if declared else N_TEST)
    assert again.eval_samples == plan.eval_samples
