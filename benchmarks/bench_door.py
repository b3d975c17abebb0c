"""The door's cost: each guest's conformance checks the first time a command uses it, and
once its pass is remembered (:mod:`creditaudit.run.door`).

Guests: the well-behaved plugins of tests/plugin_pkg (the Sparse DFA rule, the plain-MLP
architecture, the Gaussian-mixture dataset, diagnostic (e)), installed in a temporary site
folder, and a ``module`` factory outside creditaudit (a file that re-exports
``creditaudit.testing.zoo:resnet20``: ResNet-20 on 1×28×28 images). Each axis's door runs with an
empty cache (first use on a machine), then with the pass read from the signed cache file
(a later command), then from memory (a later run of the same command). Wall and CPU seconds
(process time) are printed, median of ``--repeats`` fresh caches, after one untimed warm-up
check (torch's first operations), on ``--threads`` torch threads.

Usage: PYTHONPATH=src:tests python benchmarks/bench_door.py [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from creditaudit.config import RunConfig
from creditaudit.models.module_factory import factory_guest
from creditaudit.protocol.verdicts import Protocol
from creditaudit.registry import ARCHITECTURES, DATASETS, DIAGNOSTICS, RULES, reload_plugins
from creditaudit.run import door
from creditaudit.testing import check_rule

STATES = ["stem", "layer1.0", "layer1.1", "layer1.2", "layer2.0", "layer2.1", "layer2.2",
          "layer3.0", "layer3.1", "layer3.2"]


def doors(work: Path) -> dict[str, Callable[[], door.Admission]]:
    """Each axis's door on its guest, by axis."""
    from plugin_support import PLUGINS

    PLUGINS.install(work / "site")
    sys.path.insert(0, str(work / "site"))
    (work / "own_nets.py").write_text("from creditaudit.testing.zoo import resnet20 as net\n")
    sys.path.insert(0, str(work))
    reload_plugins()
    config = RunConfig().replace(**{
        "data.name": "gaussian-mixture", "model.arch": "plain-mlp",
        "method.name": "sparse-dfa", "diagnostics.protocol": ["a", "b", "c", "d", "e"]})
    rule, arch = RULES.get("sparse-dfa"), ARCHITECTURES.get("plain-mlp")
    data = DATASETS.get("gaussian-mixture")
    module = RunConfig().replace(**{"model.arch": "module", "model.factory": "own_nets:net",
                                    "model.args": {"in_channels": 1}, "model.states": STATES})
    diagnostic = Protocol.from_config(config.diagnostics).diagnostic("e")  # with its options
    return {
        "rule (check_rule, resmlp)": lambda: door.rule_door(rule, RULES.guest(rule.name)),
        "architecture (check_model)": lambda: door.architecture_door(
            arch(config.model), ARCHITECTURES.guest(arch.name), (16,)),
        "dataset (check_dataset)": lambda: door.dataset_door(
            data(config.data), DATASETS.guest(data.name)),
        "diagnostic (check_diagnostic)": lambda: door.diagnostic_door(
            diagnostic, DIAGNOSTICS.guest(diagnostic.name)),
        "factory (check_module, ResNet-20)": lambda: door.factory_door(
            factory_guest("own_nets:net"), module.model, (1, 28, 28), 10),
    }


def timed(call: Callable[[], door.Admission]) -> tuple[float, float, door.Admission]:
    wall, cpu = time.perf_counter(), time.process_time()
    admission = call()
    return time.perf_counter() - wall, time.process_time() - cpu, admission


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="bench_door_"))
    axes = doors(work)
    check_rule(RULES.get("bp"), archs=("resmlp",))  # warm-up, untimed
    rows: dict[str, dict[str, list[float]]] = {}
    for repeat in range(args.repeats):
        os.environ["CREDITAUDIT_CACHE"] = str(work / f"cache{repeat}")
        for axis, call in axes.items():
            times = rows.setdefault(axis, {})
            door._MEMORY.clear()
            for kind in ("first", "file", "memory"):
                if kind == "file":
                    door._MEMORY.clear()
                wall, cpu, admission = timed(call)
                assert admission.cached == (kind != "first"), (axis, kind)
                times.setdefault(f"{kind} wall", []).append(wall)
                times.setdefault(f"{kind} cpu", []).append(cpu)
            times.setdefault("checks", []).append(len(admission.checks))
    load = os.getloadavg()[0]
    print(f"door cost, median of {args.repeats}, {args.threads} thread(s), load {load:.1f}")
    print(f"{'axis':<36} {'checks':>6} {'first wall/cpu s':>18} {'cached file ms':>15} "
          f"{'memory ms':>10}")
    for axis, times in rows.items():
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{axis:<36} {med['checks']:>6.0f} {med['first wall']:>9.2f}/"
              f"{med['first cpu']:<8.2f} {1e3 * med['file wall']:>15.1f} "
              f"{1e3 * med['memory wall']:>10.2f}")


if __name__ == "__main__":
    main()
