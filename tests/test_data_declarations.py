"""A dataset plugin that declares its sample shape or classes with numpy or float numbers
(or one class only, which gives no gradient),
or loads a ``Dataset`` whose class count or mean/std are not the Python values the loader
and the records take, is refused in one line naming it — before a run folder exists where
the plan can tell — never an internal error (a numpy int in a record's JSON, a float class
count sizing the readout) or a ValueError of creditaudit's own checks blamed on it; so is
a file dataset that lists two files under one name.
"""

from __future__ import annotations

import pytest

from creditaudit.data import dataset_spec
from creditaudit.data.spec import check_provenance
from creditaudit.errors import GuestError, LoadedDataError
from creditaudit.run.plan import plan_run
from creditaudit.testing import check_dataset
from door_support import ORIGIN, cli_args, error_line, guests, site_with, tiny_config
from plugin_support import cli
from test_data_at_the_door import npy_folder, npy_run

DECLARED = [
    ("decl-numpy-classes", "declares what", "n_classes() of decl-numpy-classes is "
                                            "np.int64(4): return a Python int >= 1"),
    ("decl-float-classes", "declares what", "n_classes() of decl-float-classes is 4.0: "
                                            "return a Python int >= 1"),
    ("decl-numpy-shape", "declares what", "input_shape() of decl-numpy-shape is "
                                          "(np.int64(8),): return a tuple of Python ints"),
    ("decl-one-class", "declares what", "n_classes() of decl-one-class is 1: the "
                                        "cross-entropy of one class is 0 whatever"),
]
# What a generated dataset's provenance() returns is hashed into the run id and recorded.
PROVENANCE = [
    ("decl-provenance-without-args", "provenance() of decl-provenance-without-args returned "
     "a dict without an 'args' dict (keys ['generator', 'seed']): return {'generator': ..., "
     "'version': ..., 'args': {every argument"),
    ("decl-numpy-provenance", "provenance() of decl-numpy-provenance is not strict JSON "
     "(Object of type int64 is not JSON serializable)"),
    ("decl-nan-provenance", "provenance() of decl-nan-provenance is not strict JSON (Out of "
     "range float values are not JSON compliant"),
]
LOADED = [
    ("decl-numpy-loaded-classes", "decl-numpy-loaded-classes loaded np.int64(4) classes but "
                                  "declares 4: give Dataset(..., n_classes=) a Python int"),
    ("decl-numpy-mean", "decl-numpy-mean loaded uint8 images with a mean of type ndarray "
                        "and a std of type ndarray: set mean and std"),
]


@pytest.mark.parametrize(("name", "what", "says"), DECLARED, ids=[d[0] for d in DECLARED])
def test_declarations_that_are_not_python_ints_are_refused_before_anything_runs(
        tmp_path, name, what, says):
    with guests(tmp_path / "api", name):
        with pytest.raises(GuestError) as error:
            plan_run(tiny_config(tmp_path / "runs", **{"data.name": name}))
        with pytest.raises(AssertionError, match="loads_what_it_declares"):
            check_dataset(dataset_spec(name))
    message = str(error.value)
    assert message.startswith(f"dataset plugin '{name}' ({ORIGIN}) {what} creditaudit "
                              f"cannot use: {says}"), message
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("name", "says"), PROVENANCE, ids=[p[0] for p in PROVENANCE])
def test_a_provenance_that_cannot_be_hashed_or_recorded_is_refused_naming_the_plugin(
        tmp_path, name, says):
    """Not a KeyError or json's TypeError "raised" by the plugin at spec.py or encoder.py,
    nor an identity() "not deterministic" because NaN != NaN."""
    with guests(tmp_path / "api", name), pytest.raises(GuestError) as error:
        plan_run(tiny_config(tmp_path / "runs", **{"data.name": name}))
    message = str(error.value)
    assert message.startswith(f"dataset plugin '{name}' ({ORIGIN}) declares what creditaudit "
                              f"cannot use: {says}"), message
    assert "\n" not in message
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("name", "says"), LOADED, ids=[d[0] for d in LOADED])
def test_loaded_numbers_of_the_wrong_type_fail_the_door_naming_the_plugin(tmp_path, name,
                                                                          says):
    with guests(tmp_path / "api", name), pytest.raises(GuestError) as error:
        plan_run(tiny_config(tmp_path / "runs", **{"data.name": name}))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"dataset plugin '{name}' ({ORIGIN}) fails the conformance "
                              "check loads_what_it_declares"), message
    assert says in message, message


def test_the_cli_refuses_a_numpy_class_count_in_one_line(tmp_path):
    site = site_with(tmp_path, "decl-numpy-classes")
    done = cli(site, "train", *cli_args(tmp_path / "runs", **{
        "data.name": "decl-numpy-classes"}), cwd=tmp_path)
    line = error_line(done)
    assert "internal error" not in line
    assert line.startswith("creditaudit: error: dataset plugin 'decl-numpy-classes'"), line
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_two_files_under_one_name_are_refused_they_would_share_one_digest(tmp_path):
    """files() keys a digest by name: the second file's content would be left out of the run
    id, and changing it would not change the id of the data it trains on."""
    folder = npy_folder(tmp_path)
    (folder / "y.npy").write_bytes(b"labels")
    with guests(tmp_path / "api", "decl-two-files-one-name"), \
            pytest.raises(GuestError) as error:
        plan_run(tiny_config(tmp_path / "runs", **npy_run(folder, "decl-two-files-one-name")))
    assert str(error.value) == (
        f"dataset plugin 'decl-two-files-one-name' ({ORIGIN}) declares what creditaudit "
        "cannot use: files() of decl-two-files-one-name lists more than one file as 'x': "
        "give every file it reads a name of its own")


@pytest.mark.parametrize(("name", "says"), [
    ("decl-no-files", "files() of decl-no-files lists no file, so its run ids would not follow "
                      "the data: list every file arrays() reads, as (name, path, "
                      "decoder or None)"),
    ("decl-text-decoder", "the decoder _as_text of data file {folder}/x.npy returned a str, "
                          "not bytes: return the decoded content as bytes")])
def test_files_that_cannot_fingerprint_the_data_are_refused_naming_the_plugin(tmp_path, name,
                                                                              says):
    """No file listed trained every folder's data under one run id; a decoder giving str was
    hashlib's TypeError "raised" by the plugin at identity.py."""
    folder = npy_folder(tmp_path)
    with guests(tmp_path / "api", name), pytest.raises(GuestError) as error:
        plan_run(tiny_config(tmp_path / "runs", **npy_run(folder, name)))
    assert str(error.value) == (f"dataset plugin '{name}' ({ORIGIN}) declares what creditaudit "
                                f"cannot use: {says.format(folder=folder.resolve())}")
    assert not (tmp_path / "runs").exists()


def test_provenance_naming_one_key_twice_in_json_is_refused():
    """``{1: …, "1": …}`` passes json.dumps, which writes the key "1" twice: the record would
    lose a value and be refused on reading as not written by creditaudit."""
    with pytest.raises(LoadedDataError, match=r"^provenance\(\) of mine holds the keys 1 and "
                                              r"'1' in one object, which JSON writes alike"):
        check_provenance("mine", {"generator": "g", "args": {"sizes": {1: 3, "1": 4}}})
    check_provenance("mine", {"generator": "g", "args": {"sizes": {1: 3, 2: 4}}})  # as before
