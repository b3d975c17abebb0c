"""A plugin is identified by the code that is imported, not by the files its distribution's
``RECORD`` happens to list: an editable install (``pip install -e``: ``RECORD`` names only
setuptools' finder module) is its source folder, and a copy of the package that shadows the
installed one on ``sys.path`` (the working folder, which ``python -m creditaudit`` puts
first) is the copy. An ordinary install keeps the digest of the files its ``RECORD`` lists,
so its run ids do not move.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from creditaudit.guests import source_digest
from creditaudit.registry import DATASETS, reload_plugins
from creditaudit.run.plan import plan_run
from door_support import cli_args, tiny_config
from plugin_support import GUESTS, cli, one_module_plugin

NAME = "door-mixture"  # a well-behaved dataset plugin of tests/guest_pkg
MODULE = "door_datasets.py"
FINDER = "__editable___creditaudit_guests_0_1_0_finder.py"


def write_record(site: Path, files: list[Path]) -> None:
    """The dist-info's RECORD as pip writes it: each file relative to ``site``, its hash and
    size, the dist-info's own files included."""
    info = GUESTS.dist_info(site)
    lines = []
    for path in [*files, *sorted(info.iterdir())]:
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        lines.append(f"{path.relative_to(site).as_posix()},sha256={digest},{len(data)}")
    lines.append(f"{(info / 'RECORD').relative_to(site).as_posix()},,")
    (info / "RECORD").write_text("\n".join(lines) + "\n")


def ordinary_install(site: Path) -> list[Path]:
    """What ``pip install`` leaves: the package and a RECORD listing each of its files;
    returns the ``.py`` files listed."""
    GUESTS.install(site, only=[NAME])
    listed = sorted(p for p in (site / GUESTS.module).rglob("*.py"))
    write_record(site, listed)
    return listed


def editable_install(root: Path) -> tuple[Path, Path]:
    """What ``pip install -e`` leaves: a site holding the dist-info and setuptools' finder
    module (all that RECORD lists), the package itself in a source folder elsewhere, which
    the finder puts on the import path (here: ``sys.path``). Returns (site, source)."""
    source, site = root / "source", root / "site"
    GUESTS.install(source, only=[NAME])
    site.mkdir()
    shutil.move(GUESTS.dist_info(source), GUESTS.dist_info(site))
    finder = site / FINDER
    finder.write_text(f"MAPPING = {{{GUESTS.module!r}: {str(source / GUESTS.module)!r}}}\n")
    write_record(site, [finder])
    return site, source


@contextlib.contextmanager
def on_path(*folders: Path) -> Iterator[None]:
    """``folders`` first on sys.path (in order) with the plugins found again; gone after."""
    for folder in reversed(folders):
        sys.path.insert(0, str(folder))
    GUESTS.forget()
    reload_plugins()
    try:
        yield
    finally:
        for folder in folders:
            sys.path.remove(str(folder))
        GUESTS.forget()
        reload_plugins()


def digest_and_run_id(out: Path) -> tuple[str, str]:
    plan = plan_run(tiny_config(out))
    return plan.code.to_dict()["data"]["code_digest"], plan.run_id


def edit(module: Path) -> None:
    module.write_text(module.read_text() + "\n# edited, same version\n")


def test_an_ordinary_install_is_the_files_its_record_lists(tmp_path):
    site = tmp_path / "site"
    listed = ordinary_install(site)
    with on_path(site):
        guest = DATASETS.guest(NAME)
        assert guest is not None
        assert sorted(guest.files) == [p.resolve() for p in listed]
        assert guest.root == site.resolve()
        # The digest before imported code counted: ordinary installs keep their run ids.
        assert guest.digest == source_digest(site.resolve(), [p.resolve() for p in listed])


def test_an_editable_install_is_identified_by_its_source_folder(tmp_path):
    site, source = editable_install(tmp_path)
    with on_path(site, source):
        guest = DATASETS.guest(NAME)
        assert guest is not None
        assert source.resolve() / GUESTS.module / MODULE in guest.files
        digest, run_id = digest_and_run_id(tmp_path / "runs")
        edit(source / GUESTS.module / MODULE)
        edited_digest, edited_run_id = digest_and_run_id(tmp_path / "runs")
        assert edited_digest != digest
        assert edited_run_id != run_id


def test_an_edited_editable_plugin_is_trained_again_not_served_as_completed(tmp_path,
                                                                           monkeypatch):
    """Through the command line: after the plugin's source is edited, the same command
    trains a new run instead of answering 'already completed' with the old record."""
    site, source = editable_install(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(source), os.environ.get("PYTHONPATH", "")) if p))
    args = ["train", *cli_args(tmp_path / "runs")]
    first = cli(site, *args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    edit(source / GUESTS.module / MODULE)
    edited = cli(site, *args, cwd=tmp_path)
    assert edited.returncode == 0, edited.stderr
    assert "already completed" not in edited.stderr
    assert len(list((tmp_path / "runs").glob("*/record.json"))) == 2


def test_a_copy_shadowing_the_installed_package_is_identified_by_its_own_files(tmp_path):
    site = tmp_path / "site"
    ordinary_install(site)
    with on_path(site):
        installed, installed_run = digest_and_run_id(tmp_path / "runs")
    work = tmp_path / "work"  # the working folder, first on sys.path for the command line
    shutil.copytree(site / GUESTS.module, work / GUESTS.module)
    with on_path(work, site):
        guest = DATASETS.guest(NAME)
        assert guest is not None
        assert all(work.resolve() in p.parents for p in guest.files)
        # An unedited copy is the same code: the same digest and run.
        assert digest_and_run_id(tmp_path / "runs") == (installed, installed_run)
        edit(work / GUESTS.module / MODULE)
        shadowed, shadowed_run = digest_and_run_id(tmp_path / "runs")
        assert shadowed != installed
        assert shadowed_run != installed_run


HELPED_PLUGIN = '''
from dataclasses import dataclass

import torch

from creditaudit.config import opt
from creditaudit.data import Dataset, GeneratedDataset
from creditaudit.data.registry import GeneratedOptions
import helped_scale


@dataclass
class HelpedOptions(GeneratedOptions):
    dim: int = opt(8, "input dimension", min=1)


class Helped(GeneratedDataset[HelpedOptions]):
    name = "helped-mixture"
    label = "Helped mixture"

    def input_shape(self):
        return (self.options.dim,)

    def n_classes(self):
        return 4

    def provenance(self, seed):
        o = self.options
        return {"generator": "helped", "version": 1,
                "args": {"n_train": o.n_train, "n_test": o.n_test, "dim": o.dim, "seed": seed}}

    def load(self, seed):
        o, g = self.options, torch.Generator().manual_seed(seed)
        n = o.n_train + o.n_test
        y = torch.randint(0, 4, (n,), generator=g)
        means = helped_scale.SCALE * torch.randn(4, o.dim, generator=g)
        x = means[y] + torch.randn(n, o.dim, generator=g)
        return Dataset(self.name, x[:o.n_train], y[:o.n_train], x[o.n_train:],
                       y[o.n_train:], n_classes=4, provenance=self.provenance(seed))
'''


def test_a_helper_module_beside_a_single_module_plugin_is_part_of_its_code(tmp_path):
    """A plugin module (``helped:Helped``, installed without a RECORD, as an editable
    install or a folder on PYTHONPATH is) that imports a helper module beside it: editing
    the helper is other code — a new digest and run id, not the old run's record."""
    modules = {"helped": HELPED_PLUGIN, "helped_scale": "SCALE = 3.0\n"}
    with one_module_plugin(tmp_path / "site", "creditaudit.datasets",
                           "helped-mixture = helped:Helped", modules) as site:
        helper = site / "helped_scale.py"
        guest = DATASETS.guest("helped-mixture")
        assert guest is not None
        assert helper.resolve() in guest.files
        config = tiny_config(tmp_path / "runs", **{"data.name": "helped-mixture"})
        before = plan_run(config)
        helper.write_text("SCALE = 5.0\n")
        after = plan_run(config)
        assert (after.code.to_dict()["data"]["code_digest"]
                != before.code.to_dict()["data"]["code_digest"])
        assert after.run_id != before.run_id
