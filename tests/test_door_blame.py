"""Blame the guest: an exception raised in a plugin's or a factory's code is one line naming
it — the plugin by entry point and distribution==version, the factory by
package.module:callable — with its exception and message (exit 2), never "internal error …
please report it"; what guest code prints goes to stderr, so ``--format json`` stays
parseable; a plugin that ends the process at import touches no command that does not use
it; a factory's ``sys.exit`` is named.
"""

from __future__ import annotations

import functools
import json

import pytest
import torch
from torch import nn

from creditaudit.errors import GuestError
from creditaudit.run.plan import plan_run
from door_support import (
    FACTORIES,
    ORIGIN,
    cli_args,
    error_line,
    guests,
    image_run,
    site_with,
    tiny_config,
    tiny_values,
)
from integrity_support import sweep_toml, write_idx_dataset
from plugin_support import cli

RAISES = "raised"


def _named(line: str, what: str, exception: str, message: str) -> None:
    assert line.startswith(f"creditaudit: error: {what} {RAISES} {exception}: {message}"), line
    assert "internal error" not in line and "please report it" not in line
    assert "not in creditaudit" in line


def test_an_exception_in_a_plugins_load_names_the_plugin(tmp_path):
    site = site_with(tmp_path, "door-load-raises")
    done = cli(site, "train", *cli_args(tmp_path / "runs", **{
        "data.name": "door-load-raises"}), cwd=tmp_path)
    _named(error_line(done), f"dataset plugin 'door-load-raises' ({ORIGIN})", "OSError",
           "[Errno 28] the mixture ran out of room (at door_datasets.py:")
    with guests(tmp_path / "api", "door-load-raises"):
        plan = plan_run(tiny_config(tmp_path / "runs", **{"data.name": "door-load-raises"}))
        with pytest.raises(GuestError, match="dataset plugin 'door-load-raises'.* raised "
                                             "OSError"):
            plan.load_data()


def test_an_exception_in_a_plugins_build_names_the_plugin(tmp_path):
    site = site_with(tmp_path, "door-build-raises", "door-mixture")
    done = cli(site, "train", *cli_args(tmp_path / "runs", **{
        "model.arch": "door-build-raises"}), cwd=tmp_path)
    _named(error_line(done), f"architecture plugin 'door-build-raises' ({ORIGIN})",
           "KeyError", "'width_table' (at door_models.py:")
    with guests(tmp_path / "api", "door-build-raises", "door-mixture"), \
            pytest.raises(GuestError, match="architecture plugin 'door-build-raises'"):
        plan_run(tiny_config(tmp_path / "runs", **{"model.arch": "door-build-raises"}))


def test_an_exception_in_a_plugins_evaluate_names_the_plugin(tmp_path):
    site = site_with(tmp_path, "door_raises", "door-mixture")
    done = cli(site, "train", *cli_args(tmp_path / "runs", **{
        "diagnostics.protocol": ["a", "b", "c", "d", "door_raises"]}), cwd=tmp_path)
    _named(error_line(done), f"protocol diagnostic plugin 'door_raises' ({ORIGIN})",
           "ZeroDivisionError", "the network is not as deep as it expected")


def test_an_exception_in_a_plugins_training_step_names_the_plugin(tmp_path):
    """Raised deep in training, out of no call creditaudit wrapped: the command line finds
    the plugin's code on the traceback."""
    site = site_with(tmp_path, "door-step-raises", "door-mixture")
    done = cli(site, "train", *cli_args(tmp_path / "runs", **{
        "method.name": "door-step-raises"}), cwd=tmp_path)
    _named(error_line(done), f"credit rule plugin 'door-step-raises' ({ORIGIN})",
           "RuntimeError", "the step lost its feedback (at door_rules.py:")


def test_labels_outside_a_plugin_datasets_classes_name_the_plugin(tmp_path):
    """Past the door's tiny sizes, the run's own load: labels 0 … 4 for 4 classes."""
    site = site_with(tmp_path, "door-bad-labels")
    done = cli(site, "train", *cli_args(tmp_path / "runs", **{
        "data.name": "door-bad-labels"}), cwd=tmp_path)
    line = error_line(done)
    assert line.startswith(f"creditaudit: error: dataset plugin 'door-bad-labels' ({ORIGIN}) "
                           "loaded data creditaudit cannot use: the training labels of "
                           "door-bad-labels run 0 … 4, outside 0 … 3"), line
    with guests(tmp_path / "api", "door-bad-labels"):
        plan = plan_run(tiny_config(tmp_path / "runs", **{"data.name": "door-bad-labels"}))
        with pytest.raises(GuestError, match="outside 0 … 3"):
            plan.load_data()


def test_nan_features_in_a_plugin_datasets_run_load_name_the_plugin(tmp_path):
    """Past the door's tiny sizes, one NaN feature: refused at the load, not trained into a
    run recorded as diverged by its rule."""
    with guests(tmp_path / "api", "door-late-nan"):
        plan = plan_run(tiny_config(tmp_path / "runs", **{"data.name": "door-late-nan"}))
        with pytest.raises(GuestError) as error:
            plan.load_data()
    assert str(error.value).startswith(
        f"dataset plugin 'door-late-nan' ({ORIGIN}) loaded data creditaudit cannot use: the "
        "training samples of door-late-nan hold NaN or infinite values (1 of 256, the first "
        "at index 150)")


def test_a_plugin_test_split_cut_from_its_training_split_at_a_runs_sizes_is_refused(tmp_path):
    """Held out at the door's tiny sizes, the training split's first samples past them: the
    run's own load refuses it naming the plugin, not a run recording memorisation as test
    accuracy; a dataset declaring the check an expected failure trains."""
    from creditaudit.data.rows import HELD_OUT_CHECK
    from creditaudit.testing.datasets import test_split_is_held_out

    assert test_split_is_held_out.__name__ == HELD_OUT_CHECK  # the declared name's check
    site = site_with(tmp_path, "door-late-overlap")
    done = cli(site, "train", *cli_args(tmp_path / "runs", **{
        "data.name": "door-late-overlap"}), cwd=tmp_path)
    line = error_line(done)
    assert line.startswith(f"creditaudit: error: dataset plugin 'door-late-overlap' "
                           f"({ORIGIN}) loaded data creditaudit cannot use: the data "
                           "door-late-overlap loaded: 256 of the 256 test samples (inputs and "
                           "labels) are also training samples"), line
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())
    with guests(tmp_path / "api", "door-repeats"):
        plan = plan_run(tiny_config(tmp_path / "runs", **{"data.name": "door-repeats"}))
        assert plan.load_data().test_x.shape[0] == 256


def test_a_plugin_datasets_sizes_that_disagree_with_its_run_load_name_the_plugin(tmp_path):
    """sizes() says 256 training samples, the run's own load gives 100 (the door's tiny load
    gives what sizes() says): refused at the load, naming the plugin."""
    site = site_with(tmp_path, "door-capped")
    done = cli(site, "train", *cli_args(tmp_path / "runs", **{"data.name": "door-capped"}),
               cwd=tmp_path)
    line = error_line(done)
    assert line.startswith(f"creditaudit: error: dataset plugin 'door-capped' ({ORIGIN}) "
                           "loaded data creditaudit cannot use: door-capped loaded 100 "
                           "training and 256 test samples, but its sizes() says 256 and 256"
                           ), line
    assert not list((tmp_path / "runs").glob("*/record.json"))


def test_a_module_network_given_the_wrong_input_size_is_one_line(tmp_path):
    site = site_with(tmp_path)  # the guests' package, no entry point
    done = cli(site, "train", "--arch", f"module:{FACTORIES}:FlatNet",
               *cli_args(tmp_path / "runs", **{
                   "data.name": "mnist1d", "data.n_train": None, "data.n_test": None,
                   "model.d": None, "model.n_blocks": None,
                   "model.states": ["stem", "b1", "b2"]}), cwd=tmp_path)
    line = error_line(done)
    assert "the network's first layer 'stem' (Linear) expects 100 input features, but the " \
           "data's samples are 40" in line
    assert "model.args" in line


def test_a_factory_raising_in_its_forward_during_training_is_named(tmp_path):
    data = write_idx_dataset(tmp_path / "mnist")
    done = cli(site_with(tmp_path), "train", "--arch", f"module:{FACTORIES}:forward_raises_net",
               *cli_args(tmp_path / "runs", **image_run(data)), cwd=tmp_path)
    _named(error_line(done), f"model factory '{FACTORIES}:forward_raises_net'", "ValueError",
           "the forward lost its way (at door_factories.py:")


def test_a_factory_network_of_torch_layers_raising_during_training_is_named(tmp_path):
    """No frame of the factory's code on the traceback (an nn.Sequential of torch's layers):
    the factory is named, with the module that raised, in the line and in the record."""
    data = write_idx_dataset(tmp_path / "mnist")
    done = cli(site_with(tmp_path), "train", "--arch", f"module:{FACTORIES}:torch_layers_net",
               *cli_args(tmp_path / "runs", **image_run(data)), cwd=tmp_path)
    line = error_line(done)
    what = f"model factory '{FACTORIES}:torch_layers_net'"
    _named(line, what, "ValueError", "Expected more than 1 spatial element when training")
    assert "(in its module 'b1.1' (InstanceNorm1d), at functional.py:" in line, line
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/record.json")]
    assert record["status"] == "failed" and record["error"].startswith(f"{what} {RAISES}")


def test_creditaudits_own_code_inside_a_factory_network_is_not_blamed_on_it():
    """A failure in a hook of creditaudit's while the network runs is creditaudit's: not
    marked as the network's."""
    from creditaudit.guests.blame import guest_failure, mark_network_failure
    from creditaudit.models.adapted import _hook

    def broken(index, output):
        raise TypeError("a bug of creditaudit's hook")

    def run(net):
        try:
            net(torch.zeros(2, 3))
        except (TypeError, RuntimeError) as err:
            mark_network_failure(err, "model factory 'm:f'", net)
            return guest_failure(err)
        raise AssertionError("did not raise")

    net = nn.Sequential(nn.Linear(3, 2))
    net[0].register_forward_hook(functools.partial(_hook, 0, broken))
    assert run(net) is None
    plain = nn.Sequential(nn.Linear(4, 2))  # torch's own refusal: the network's
    assert run(plain).startswith("model factory 'm:f' raised RuntimeError")



@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory"),
                                   MemoryError("cannot allocate")])
def test_running_out_of_memory_in_a_factory_network_is_not_blamed_on_it(error):
    """Memory is the machine's, not the factory's code: left unmarked (no 'an error in its
    code' line), while torch's refusal of the network's own shapes is marked."""
    from creditaudit.guests.blame import guest_failure, mark_network_failure

    net = nn.Sequential(nn.Linear(3, 2))

    def exhausted(module, args):
        raise error

    net[0].register_forward_pre_hook(exhausted)
    with pytest.raises(type(error)) as caught:
        net(torch.zeros(2, 3))
    mark_network_failure(caught.value, "model factory 'm:f'", net)
    line = guest_failure(caught.value)
    assert line.startswith("out of memory (") and "model factory" not in line, line


def test_running_out_of_memory_in_a_factorys_own_forward_is_not_blamed_on_its_code(tmp_path):
    """The allocator's refusal raised in the factory's file (its forward holds the frame):
    one line saying memory ran out and what to shrink, not 'an error in its code'; the
    record says the same."""
    data = write_idx_dataset(tmp_path / "mnist")
    done = cli(site_with(tmp_path), "train", "--arch", f"module:{FACTORIES}:out_of_memory_net",
               *cli_args(tmp_path / "runs", **image_run(data)), cwd=tmp_path)
    line = error_line(done)
    assert done.returncode == 2, done.stderr
    assert line.startswith("creditaudit: error: out of memory (RuntimeError: "), line
    assert "optim.batch_size" in line and "not in creditaudit" not in line, line
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/record.json")]
    assert record["status"] == "failed" and record["error"].startswith("out of memory ("), record


def test_a_factory_raising_during_training_in_a_sweep_is_named_in_its_record(tmp_path):
    """In a sweep the run fails, the others go on, and the record's error, the summary and
    the sweep's output name the factory as `train` does."""
    data = write_idx_dataset(tmp_path / "mnist")
    keys = tiny_values(tmp_path / "runs", **image_run(
        data, **{"model.arch": "module", "model.factory": f"{FACTORIES}:forward_raises_net"}))
    sweep = tmp_path / "s.toml"
    sweep.write_text(sweep_toml(keys, '[grid]\n"method.name" = ["bp", "dfa"]\n'))
    done = cli(site_with(tmp_path), "sweep", str(sweep), "--workers", "0", cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    what = f"model factory '{FACTORIES}:forward_raises_net' {RAISES} ValueError"
    records = [json.loads(path.read_text())
               for path in sorted((tmp_path / "runs").glob("*/record.json"))]
    assert [r["status"] for r in records] == ["failed", "failed"]
    assert all(r["error"].startswith(what) for r in records), [r["error"] for r in records]
    summary = json.loads((tmp_path / "runs" / "sweep_summary.json").read_text())
    assert all(run["error"].startswith(what) for run in summary["runs"])
    assert f"failed: {records[0]['run_id']}: {what}" in done.stdout + done.stderr


def test_a_factory_calling_sys_exit_is_named(tmp_path):
    data = write_idx_dataset(tmp_path / "mnist")
    done = cli(site_with(tmp_path), "train", "--arch", f"module:{FACTORIES}:exiting_net",
               *cli_args(tmp_path / "runs", **image_run(data)), cwd=tmp_path)
    line = error_line(done)
    assert line.startswith(f"creditaudit: error: model factory '{FACTORIES}:exiting_net' "
                           "called sys.exit(3)"), line


def test_what_guest_code_prints_goes_to_stderr_and_json_stays_parseable(tmp_path):
    """A factory that prints when it builds, a plugin model that prints in every forward:
    `audit --format json` builds and runs both, and its stdout is JSON alone."""
    data = write_idx_dataset(tmp_path / "mnist")
    site = site_with(tmp_path, "door-chatty", "door-mixture")
    out = tmp_path / "runs"
    trained = [cli(site, "train", "--arch", f"module:{FACTORIES}:printing_net",
                   *cli_args(out, **image_run(data)), cwd=tmp_path),
               cli(site, "train", *cli_args(out, **{"model.arch": "door-chatty"}),
                   cwd=tmp_path)]
    for done in trained:
        assert done.returncode == 0, done.stderr
    for run in sorted(out.iterdir()):
        audited = cli(site, "audit", str(run), "-q", "--format", "json", cwd=tmp_path)
        assert audited.returncode == 0, audited.stderr
        json.loads(audited.stdout)
        assert "building" in audited.stderr  # the guest's words, on stderr
    assert "building printing_net" in trained[0].stderr
    assert "forward of a chatty model" in trained[1].stderr
    assert "forward of" not in trained[1].stdout and "building" not in trained[0].stdout


def test_a_plugin_that_ends_the_process_at_import_touches_no_other_command(tmp_path):
    """os._exit at import cannot be caught in the importing process: the plugin is imported
    only by a command that asks for it (docs/reliability.md says so)."""
    site = site_with(tmp_path, "door-exit")
    for args in (["--version"], ["train", "--help"], ["audit", "--help"],
                 ["train", *cli_args(tmp_path / "runs", **{"data.name": "synthetic"})]):
        done = cli(site, *args, cwd=tmp_path)
        assert done.returncode == 0, (args, done.returncode, done.stderr[-500:])
    assert "door-exit" in cli(site, "train", "--help", cwd=tmp_path).stdout  # still listed
    asked = cli(site, "train", *cli_args(tmp_path / "runs", **{"method.name": "door-exit"}),
                cwd=tmp_path)
    assert asked.returncode == 7  # what it does to the command that needs it
