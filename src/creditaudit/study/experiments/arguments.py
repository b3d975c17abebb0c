"""Refusals of an experiment call's arguments, before anything is planned: an executor and a
worker count it would not use, training options when nothing trains, a data folder for a
generated dataset, rule or architecture choices for several experiments. The command line
and the Python API (:func:`~creditaudit.study.experiments.runner.run_experiments`) refuse
alike."""

from __future__ import annotations

from creditaudit.errors import ConfigError
from creditaudit.study.experiments.configs import scale_dataset
from creditaudit.study.experiments.options import LIST, NO_TRAIN, argument, chosen
from creditaudit.study.experiments.registry import Choices

EXECUTORS = ("local", "inline", "ray")


def check_executor(kind: str, workers: int | None) -> None:
    """Refuse, before anything is planned, an executor that is none of :data:`EXECUTORS`
    and a ``workers`` it would not use (the Ray and inline executors start no worker
    processes: a count given to them was silently dropped) or that is negative."""
    if kind not in EXECUTORS:
        raise ConfigError(f"executor {kind!r} is not one of {', '.join(EXECUTORS)}")
    if workers is not None and workers < 0:
        raise ConfigError(f"{argument('workers')} must be >= 0, got {workers}")
    if kind == "ray" and workers is not None:
        raise ConfigError(f"{argument('workers')} is for the local executor; Ray runs as many "
                          f"runs as the cluster has CPUs: drop {argument('workers')}")
    if kind == "inline" and workers:
        raise ConfigError(f"{argument('workers')} {workers} is for the local executor; the "
                          "inline one trains one run after another in this process: drop "
                          f"{argument('workers')}, or use the local executor")


def check_training_options(train: bool, *, retry_failed: bool, workers: int | None,
                           executor: str, device: str | None) -> None:
    """Refuse, when nothing trains (``train=False``), an option that only says how to train
    (``retry_failed``, ``workers``, an ``executor`` other than local, ``device``): it would
    be ignored. The command line refuses the same flags with --no-train."""
    if train:
        return
    given = [name for name, on in (("retry_failed", retry_failed),
                                   ("workers", workers is not None),
                                   ("executor", executor != "local"),
                                   ("device", device is not None)) if on]
    if given:
        raise ConfigError(f"{argument(given[0])} only says how to train, and {NO_TRAIN} "
                          f"trains nothing: drop {argument(given[0])}")


def check_data_dir(scale: str, dataset: str | None, data_dir: str | None) -> None:
    """Refuse a ``data_dir`` for a generated dataset (the scale's or ``dataset``), which
    reads no folder: it would be ignored (train refuses it the same way)."""
    if data_dir is None:
        return
    from creditaudit.data import dataset_spec

    name = scale_dataset(scale, dataset)
    if dataset_spec(name).kind == "generated":
        raise ConfigError(f"{argument('data_dir')} {data_dir}: the dataset {name} is "
                          "generated from its seed, not read from a folder: drop "
                          f"{argument('data_dir')}")


def check_choices(choices: Choices, experiments: int) -> None:
    """Refuse ``choices`` (rules, architectures) for more than one experiment."""
    if choices.given() and experiments != 1:
        raise ConfigError(f"{chosen(choices.given()[0])} applies to one experiment: name it "
                          "instead of running several (each takes its own options; see "
                          f"{LIST})")
