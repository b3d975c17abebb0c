"""The conformance suite of ``module`` factories — ``check_module(options, input_shape=…,
n_classes=…)``.

The ``module`` architecture trains any ``nn.Module`` a factory builds (``model.factory``,
``model.args``, ``model.states``; :mod:`creditaudit.models.module_factory`). Before a run
trusts it, the suite builds the network for real — not on the meta device a run plan sizes
it on — for samples of ``input_shape`` and checks what the run will read of it::

    from creditaudit.testing import check_module
    check_module({"factory": "my_nets:Net", "states": ["stem", "b1", "b2"]},
                 input_shape=(1, 28, 28), n_classes=10)

The checks:

- ``builds_for_the_data``: the factory's network runs on the data's samples, and
  :func:`creditaudit.adapt` accepts its states on a probe batch — each state on the path to
  the logits, a cut of the network, samples independent in eval mode — with as many logits
  as the data has classes;
- ``terminal_ln_is_what_the_readout_does`` (when ``model.terminal_ln`` is declared): the
  declaration agrees with the readout's behaviour (the logits do not move when h_L is
  scaled exactly when it normalises h_L) — the protocol's diagnosis of (b) rests on it;
- ``initial_weights_follow_the_seed``: two builds under seed 0 are the same network (module
  tree, settings, shapes: :func:`~creditaudit.models.structure.structure_digest`) with the
  same initial weights (a factory that draws from ``random``, numpy or the clock could not
  be reproduced, nor rebuilt by ``audit`` and ``--resume``), and builds under seeds 0 and 1
  are two networks with different initial weights (a factory that seeds torch itself, or
  hands back one network object, makes every ``run.seed`` of a sweep the same run);
- ``eval_forward_leaves_the_network_alone``: an eval-mode forward changes none of the
  network's parameters and buffers — the diagnostics forward it in eval mode between
  training steps, so a layer that updates running statistics or counts calls in eval mode
  would make training depend on what was measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from creditaudit.models.adapted import adapt
from creditaudit.models.module_factory import ModuleArchitecture
from creditaudit.models.registry import build_architecture
from creditaudit.models.structure import structure_digest
from creditaudit.testing.common import (
    Check,
    Report,
    changes_of_the_forward,
    declared_failures,
    reason_for,
    resolve_options,
    run_checks,
)

PROBE_BATCH = 4


def _build(options: Any, input_shape: tuple[int, ...], n_classes: int, seed: int = 0) -> Any:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_architecture(ModuleArchitecture(options), input_shape=input_shape,
                                  n_classes=n_classes)


def builds_for_the_data(cls: type, options: Any, input_shape: tuple[int, ...],
                        n_classes: int) -> None:
    model = _build(options, input_shape, n_classes)
    assert model.n_classes == n_classes, \
        f"the network gives {model.n_classes} logits for data of {n_classes} classes"


def terminal_ln_is_what_the_readout_does(cls: type, options: Any,
                                         input_shape: tuple[int, ...], n_classes: int) -> None:
    declared = options.terminal_ln
    if declared is None:  # probed by adapt itself: nothing declared to check
        return
    model = _build(options, input_shape, n_classes)
    probed = adapt(model.net, options.states, options.readout, input_shape=input_shape,
                   terminal_ln=None).terminal_ln
    if declared:
        assert probed, ("model.terminal_ln is true, but scaling h_L changes the logits: the "
                        "readout has no terminal LayerNorm")
    else:
        assert not probed, ("model.terminal_ln is false, but the logits do not move when h_L "
                            "is scaled: the readout hides a terminal LayerNorm (declare it "
                            "true, or leave it out to have it probed)")


def initial_weights_follow_the_seed(cls: type, options: Any, input_shape: tuple[int, ...],
                                    n_classes: int) -> None:
    # the architectures' building_is_deterministic_under_a_seed: a factory that draws from
    # another RNG cannot be rebuilt, one that seeds torch itself makes every run.seed of a
    # sweep the same initial network
    first = _build(options, input_shape, n_classes, seed=0)
    again = _build(options, input_shape, n_classes, seed=0)
    assert structure_digest(first.net) == structure_digest(again.net), (
        f"two builds under seed 0 are different networks ({_tree_difference(first.net, again.net)}"
        "): the factory builds another network on some calls (it reads a counter, a global, "
        "random, numpy or the clock), so a run cannot be reproduced, nor rebuilt by audit "
        "and --resume; build the network from model.args alone")
    differs = _first_difference(first.net.state_dict(), again.net.state_dict())
    assert differs is None, (
        f"two builds under seed 0 differ ({differs}): the factory draws from a random source "
        "other than torch's (random, numpy, the clock), so a run cannot be reproduced, nor "
        "rebuilt by audit and --resume; draw from torch's RNG, which creditaudit seeds from "
        "run.seed")
    other = _build(options, input_shape, n_classes, seed=1)
    assert first.net is not other.net, \
        "the factory returns the same network object on every call: return a new one"
    assert any(not torch.equal(a, b) for a, b in zip(first.state_dict().values(),
                                                     other.state_dict().values())), \
        ("builds under seeds 0 and 1 are identical: the factory reseeds torch, so initial "
         "weights ignore run.seed; remove its torch.manual_seed (creditaudit seeds torch "
         "from run.seed before building)")


def eval_forward_leaves_the_network_alone(cls: type, options: Any,
                                          input_shape: tuple[int, ...], n_classes: int
                                          ) -> None:
    model = _build(options, input_shape, n_classes).eval()
    x = torch.randn(PROBE_BATCH, *input_shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        changed = changes_of_the_forward(model.net, lambda: model.forward_states(x),
                                         buffers=True)
    assert not changed, (
        f"an eval-mode forward of the network changed {', '.join(changed[:3])}: the "
        "diagnostics forward it in eval mode between training steps, so training would "
        "depend on what was measured; leave parameters and buffers as they are in eval mode")


def _tree_difference(first: torch.nn.Module, again: torch.nn.Module) -> str:
    """Where two builds' module trees first differ: a module's class, a module one of them
    lacks, a parameter's or buffer's shape — else their settings."""
    one, two = dict(first.named_modules()), dict(again.named_modules())
    for name, module in one.items():
        if name in two and type(module) is not type(two[name]):
            where = repr(name) if name else "the network"
            return f"{where} is a {type(module).__name__} and a {type(two[name]).__name__}"
    extra = [name for name in [*one, *two] if (name in one) != (name in two)]
    if extra:
        return f"module {extra[0]!r} is in one of them only"
    return (_first_difference(first.state_dict(), again.state_dict())
            or "their modules' settings differ")


def _first_difference(first: Mapping[str, torch.Tensor], again: Mapping[str, torch.Tensor]
                      ) -> str | None:
    """Where two state dicts first differ (names, shapes, values), or None."""
    if list(first) != list(again):
        return f"entries {sorted(set(first) ^ set(again))[:3] or list(first)[:3]}"
    for name, a in first.items():
        b = again[name]
        if a.shape != b.shape:
            return f"{name!r} is {tuple(a.shape)} and {tuple(b.shape)}"
        if not torch.equal(a, b):
            return f"at {name!r}"
    return None


MODULE_CHECKS = (builds_for_the_data, terminal_ln_is_what_the_readout_does,
                 initial_weights_follow_the_seed, eval_forward_leaves_the_network_alone)


def module_checks(options: Mapping[str, Any] | Any, *, input_shape: tuple[int, ...],
                  n_classes: int, expected_failures: Mapping[str, str] | None = None
                  ) -> list[Check]:
    """The checks of the factory ``options`` name, one by one (see :func:`check_module`)."""
    resolved = resolve_options(ModuleArchitecture, options)
    failures = declared_failures(ModuleArchitecture, expected_failures,
                                 (c.__name__ for c in MODULE_CHECKS))
    shape = tuple(input_shape)
    return [Check(check, ModuleArchitecture, resolved, shape, n_classes,
                  expected_failure=reason_for(failures, check, ""))
            for check in MODULE_CHECKS]


def check_module(options: Mapping[str, Any] | Any, *, input_shape: tuple[int, ...],
                 n_classes: int, expected_failures: Mapping[str, str] | None = None
                 ) -> Report:
    """Build the network of the ``module`` options (``factory``, ``args``, ``states``, …: a
    mapping or the model section of a config) for samples of ``input_shape`` and
    ``n_classes`` classes, and check it (the module docstring lists the checks);
    AssertionError listing every check that failed, else a
    :class:`~creditaudit.testing.common.Report`."""
    checks = module_checks(options, input_shape=input_shape, n_classes=n_classes,
                           expected_failures=expected_failures)
    factory = checks[0].args[0].factory if checks else "?"
    return run_checks(checks, f"model factory {factory!r}")


__all__ = ["check_module", "module_checks", "MODULE_CHECKS"]
