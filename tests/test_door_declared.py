"""A plugin admitted at the door although it fails a check it declares it fails by design
(``expected_failures``) has that failure and its reason in the record
(``environment.components.<axis>.declared_failures``), beside the checks it passed: its
numbers do not claim what that check holds them to, and a reader must see so."""

from __future__ import annotations

from creditaudit.run.plan import plan_run
from door_support import tiny_config
from plugin_support import one_module_plugin

DECLARED = '''
from creditaudit.methods import rule_class

BP = rule_class("bp")


class Doubled(BP):
    """Backprop's step, but it reports twice the gradient as its credit, and says so."""

    name = "declared-doubled"
    label = "Declared doubled"
    expected_failures = {"blocks_train_on_the_reported_credit": "reports twice g_l",
                         "block_biases_train_on_the_reported_credit": "reports twice g_l",
                         "embedding_trains_on_the_reported_credit": "reports twice g_0"}

    def credits(self, x, y):
        return [2 * c for c in super().credits(x, y)]
'''


def test_a_failure_declared_by_design_is_recorded_with_its_reason(tmp_path):
    with one_module_plugin(tmp_path / "site", "creditaudit.rules",
                           "declared-doubled = declared_doubled:Doubled",
                           {"declared_doubled": DECLARED}):
        config = tiny_config(tmp_path / "runs", **{"method.name": "declared-doubled",
                                                   "data.name": "mnist1d",
                                                   "data.n_train": 120, "data.n_test": 120,
                                                   "diagnostics.eval_samples": 120})
        method = plan_run(config).code.to_dict()["method"]
    assert method["declared_failures"] == {
        "blocks_train_on_the_reported_credit[resmlp]": "reports twice g_l",
        "block_biases_train_on_the_reported_credit[resmlp]": "reports twice g_l",
        "embedding_trains_on_the_reported_credit[resmlp]": "reports twice g_0"}
    assert "blocks_train_on_the_reported_credit[resmlp]" not in method["checks"]
