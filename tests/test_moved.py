"""The 0.2 layout: every old import path is the moved module itself (with a warning naming
the new path), and a config spelling a moved factory by either path has the run id it had
before the move."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from creditaudit.config import RunConfig
from creditaudit.moved import MOVED, new_path, pre_move_path
from creditaudit.records.run_ids import pre_move_spelling
from creditaudit.run.plan import run_id

LEGACY = Path(__file__).parent / "legacy_records"

ROOT = Path(__file__).resolve().parents[1]
# Submodules of moved packages, spelled the old way.
OLD_SUBMODULES = {
    "creditaudit.diagnostics.quality": "creditaudit.measures.quality",
    "creditaudit.diagnostics.null": "creditaudit.measures.null",
    "creditaudit.experiments.literature_nets": "creditaudit.study.experiments.literature_nets",
    "creditaudit.experiments.registry": "creditaudit.study.experiments.registry",
}


@pytest.mark.parametrize("old, new", [*MOVED.items(), *OLD_SUBMODULES.items()])
def test_an_old_path_is_the_new_module(old, new):
    """The same module object, so monkeypatching and isinstance see one module."""
    moved = importlib.import_module(new)
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {new}"):
        assert importlib.import_module(old) is moved
    assert moved.__spec__.name == new  # the module keeps its own name and spec
    assert importlib.import_module(old) is moved


def test_from_imports_of_old_paths_work():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from creditaudit.diagnostics import quality  # type: ignore[import-not-found]
        from creditaudit.training import train  # type: ignore[import-not-found]
        from creditaudit.zoo import resnet20  # type: ignore[import-not-found]
    from creditaudit.measures import quality as new_quality
    from creditaudit.run.trainer import train as new_train
    from creditaudit.testing.zoo import resnet20 as new_resnet20
    assert (quality, train, resnet20) == (new_quality, new_train, new_resnet20)


def test_at_most_ten_modules_at_the_top():
    assert len(list((ROOT / "src" / "creditaudit").glob("*.py"))) <= 10


def test_every_moved_module_exists_and_no_old_file_is_left():
    src = ROOT / "src"
    for old, new in MOVED.items():
        assert importlib.util.find_spec(new) is not None, new
        if old != "creditaudit.figures.hero" and old.count(".") == 1:
            assert not (src / (old.replace(".", "/") + ".py")).exists(), old


def test_the_translation_both_ways():
    assert new_path("creditaudit.diagnostics.quality") == "creditaudit.measures.quality"
    assert new_path("creditaudit.figures.common") is None
    assert new_path("creditaudit.trainingx") is None
    assert pre_move_path("creditaudit.testing.zoo") == "creditaudit.zoo"
    assert pre_move_path("creditaudit.measures.quality") == "creditaudit.diagnostics.quality"
    assert pre_move_path("creditaudit.version") == "creditaudit.version"
    assert pre_move_path("creditaudit.testing") == "creditaudit.testing"
    assert pre_move_spelling("creditaudit.testing.zoo:resnet20") == "creditaudit.zoo:resnet20"
    assert pre_move_spelling("my_nets:Net") == "my_nets:Net"


# --- run ids: pinned to the values computed before the move -------------------------------
# The literature experiment's runs (bp-module-mnist1d-s123-bd467cb5c7 is one of its
# finished runs, computed before the move) and an own transformer from creditaudit's zoo.
LITERATURE = {
    "data.name": "mnist1d", "data.n_train": 4000, "data.n_test": 1000, "data.data_seed": 42,
    "model.arch": "module", "model.states": ["relu1", "relu2", "flatten"],
    "optim.epochs": 200, "optim.batch_size": 100, "optim.lr": 0.01, "optim.weight_decay": 0.0,
    "optim.schedule": "constant", "diagnostics.every": 20, "diagnostics.end_of_run": False,
    "run.seed": 123, "run.progress": False,
}
ZOO = {
    "data.name": "mnist1d", "data.n_train": 400, "data.n_test": 200, "method.name": "dfa",
    "model.arch": "module",
    "model.args": {"image_shape": [1, 1, 40], "patch": [1, 4], "d": 32, "depth": 2,
                   "heads": 4, "mlp_ratio": 2},
    "model.states": ["encoder.layers.0", "encoder.layers.1"],
}


@pytest.mark.parametrize("values, factories, expected", [
    (LITERATURE, ("creditaudit.experiments.literature_nets:mnist1d_cnn",
                  "creditaudit.study.experiments.literature_nets:mnist1d_cnn"),
     "bp-module-mnist1d-s123-bd467cb5c7"),
    (ZOO, ("creditaudit.zoo:TransformerClassifier",
           "creditaudit.testing.zoo:TransformerClassifier"),
     "dfa-module-mnist1d-s42-7b3dfaadf9"),
])
def test_a_run_id_is_the_same_whichever_spelling(values, factories, expected, tmp_path):
    for factory in factories:
        config = RunConfig().replace(**values, **{"model.factory": factory,
                                                  "run.out_dir": str(tmp_path)})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            assert run_id(config) == expected, factory


# --- the study registers with the toolkit; the toolkit never imports it ----------------------
def _fresh(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=True).stdout


def test_in_a_fresh_process_old_paths_work_and_the_toolkit_imports_no_study(tmp_path):
    """Nothing imported beforehand: the hook alone finds an old path; the toolkit's packages
    import no study module and draw only the generic figures; `creditaudit figures` imports
    the study, whose figures register before the generic ones (the order they are drawn and
    listed in). One process, to keep the suite's time. The folder holds one interrupted
    run, which no figure reads (a folder of no records is refused)."""
    record = json.loads((LEGACY / "run1_dfa.json").read_text())
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "record.json").write_text(json.dumps({**record,
                                                              "status": "interrupted"}))
    out = _fresh(
        "import sys, warnings\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "import creditaudit\n"
        "try:\n    import creditaudit.own_model\nexcept DeprecationWarning as w:\n    print(w)\n"
        "warnings.simplefilter('default', DeprecationWarning)\n"
        "import creditaudit.figures, creditaudit.report, creditaudit.run.trainer\n"
        "import creditaudit.sweep, creditaudit.audit, creditaudit.testing\n"
        "from creditaudit.figures import FIGURES\n"
        "print(sorted(m for m in sys.modules if m.startswith('creditaudit.study')))\n"
        "print([m.__name__ for m in FIGURES])\n"
        "from creditaudit.cli import main\n"
        f"main(['figures', {str(tmp_path)!r}, '--out', {str(tmp_path / 'f')!r}])")
    warned, study, figures, *drawn = out.splitlines()
    assert warned.startswith("creditaudit.own_model moved to creditaudit.audit.diagnose")
    assert study == "[]"
    assert figures == ("['creditaudit.figures.audit_panels', "
                       "'creditaudit.figures.weight_alignment', 'creditaudit.figures.run_curves']")
    titles = [line.split(":")[0] for line in drawn if line.startswith("missing ")]
    assert [t.split(" — ")[0] for t in titles] == [
        f"missing Figure {n}" for n in range(1, len(titles) + 1)]
    assert titles[0] == "missing Figure 1 — audit hero" and len(titles) == 8
