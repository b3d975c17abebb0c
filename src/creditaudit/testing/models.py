"""The conformance suite of architectures — ``check_model(ArchitectureClass)``.

Every credit rule and the protocol trust what a model built by an architecture declares:
its states, its blocks, its readout and the facts it reports (``terminal_ln``,
``state_layout``, ``d``, ``n_blocks``, ``describe()``). The suite builds tiny float64 models
(options: ``d=8``, ``n_blocks=3``, ``heads=2``, ``mlp_ratio=2``, ``patch=2``, ``kernel=3``,
``w2_std=0.1`` wherever the architecture declares those options and the caller does not set
them; inputs (6,) for vector architectures and 2×8×8 images for image ones unless
``input_shape`` is given) and checks each declaration against what the module does::

    from creditaudit.testing import check_model
    check_model(MyArchitecture)                      # AssertionError naming what failed
    check_model(MyArchitecture, {"width": 16}, input_shape=(3, 16, 16))
    check_model(MyArchitecture(my_options))          # an instance: with its own options

The checks:

- ``builds_a_contract_model``: ``build`` returns a :class:`~creditaudit.models.ResidualNet`
  with ``embed``, ``blocks`` and ``readout``, a declared ``terminal_ln`` (a bool) and a known
  ``state_layout``, for the classes it was asked for (logits for 4 classes and for 7: a
  readout sized for the suite's 4 alone fails), its parameters and buffers float32 (the
  data's precision);
- ``states_follow_the_declared_layout``: ``forward_states`` gives L + 1 states shaped as
  ``state_layout`` says — (B, d), (B, T, d) or (B, d, H, W) with the declared ``d`` — and
  (B, n_classes) logits; every state is in the autograd graph of the logits (rules take
  gradients at the states);
- ``states_are_the_residual_chain``: h_0 = embed(x), h_{l+1} = h_l + f_l(h_l) (f_l(h_l)
  without skips), logits = readout(h_L); ``forward_from(l, h_l)`` reproduces the logits at
  every l and ``forward`` the last of ``forward_states`` — local rules call the blocks one
  by one and must see the network the states come from;
- ``samples_are_independent_in_eval_mode``: in eval mode, changing the other samples of a
  batch changes neither sample 0's states nor its logits — per-sample diagnostics run in
  eval mode and assume it;
- ``forward_leaves_its_input_alone``: ``forward_states``, ``forward`` and ``forward_from``,
  in training and eval mode, leave the batch (and the state) they are given as they were —
  the diagnostics forward one evaluation batch many times and must see the same samples;
- ``forward_leaves_the_model_alone``: ``forward_states``, ``forward`` and ``forward_from``
  change no parameter in either mode and no buffer in eval mode — the diagnostics forward
  the model between training steps, so a forward that writes its weights or counts its
  calls in a buffer training reads would make a run depend on what was measured;
- ``branch_split_adds_up_to_the_block`` (blocks with a split,
  :func:`~creditaudit.models.contract.split_branch`): ``last(hidden(h))`` (or
  ``skip + last(u)``) equals the block's output — DFA and DRTP train that layer through the
  split;
- ``terminal_ln_is_what_the_readout_does``: ``terminal_ln`` is True exactly when the readout
  is invariant to scaling h_L by c > 0 (as a LayerNorm makes it) — the protocol's diagnosis
  of (b) rests on it, so a model claiming a LayerNorm it does not have, or hiding one,
  fails;
- ``readout_is_a_linear_head``: the readout is an optional terminal LayerNorm followed by a
  linear head (pooling allowed), as the model contract says — on states whose feature
  vectors lie on a circle cos t·u + sin t·v of zero-mean vectors of one norm (on each run
  of 4 channels too), where a LayerNorm, RMSNorm or GroupNorm of groups of 4k channels is
  linear, the logits are affine in (cos t, sin t). A hidden layer in the
  readout is a layer no block declares: every rule would train it by backprop on the exact
  cross-entropy, and no diagnostic would measure its credit;
- ``description_matches_the_model``: ``describe()`` says what was built — ``d`` the width
  of the states' feature axis, ``n_blocks`` = len(blocks), the layout, the parameter count,
  ``terminal_ln``, ``residual``, the architecture's name and the input shape — records and
  reports read it instead of the config;
- ``parameters_belong_to_one_part``: no parameter is shared by two of embed, a block and the
  readout, and each part's output reaches only its own parameters — local rules train each
  part on its own objective;
- ``check_refuses_what_build_cannot_build``: over a set of input shapes (flat vectors of 6,
  40 and 3072 features; 1×28×28, 3×32×32, 2×8×8 and 1×7×7 images), ``Architecture.check``
  either refuses with a one-line ConfigError or the model builds and runs — a run plan
  checks before any data is loaded;
- ``building_is_deterministic_under_a_seed``: two builds under one seed are identical,
  parameters and buffers, and another seed gives other weights (a model that seeds itself
  would make every seed of a sweep the same run).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from creditaudit.models import ARCHITECTURES, Architecture
from creditaudit.testing.common import (
    Check,
    Report,
    class_and_options,
    declared_failures,
    reason_for,
    resolve_options,
    run_checks,
)
from creditaudit.testing.model_properties import (
    PROBE_SHAPES,
    TINY_MODEL_OPTIONS,
    branch_split_adds_up_to_the_block,
    building_is_deterministic_under_a_seed,
    builds_a_contract_model,
    check_refuses_what_build_cannot_build,
    default_shape,
    description_matches_the_model,
    forward_leaves_its_input_alone,
    forward_leaves_the_model_alone,
    parameters_belong_to_one_part,
    readout_is_a_linear_head,
    samples_are_independent_in_eval_mode,
    states_are_the_residual_chain,
    states_follow_the_declared_layout,
    terminal_ln_is_what_the_readout_does,
)

MODEL_CHECKS = (
    builds_a_contract_model, states_follow_the_declared_layout, states_are_the_residual_chain,
    samples_are_independent_in_eval_mode, forward_leaves_its_input_alone,
    forward_leaves_the_model_alone, branch_split_adds_up_to_the_block,
    terminal_ln_is_what_the_readout_does, readout_is_a_linear_head,
    description_matches_the_model,
    parameters_belong_to_one_part, check_refuses_what_build_cannot_build,
    building_is_deterministic_under_a_seed)


def model_checks(arch: type[Architecture[Any]] | Architecture[Any],
                 options: Mapping[str, Any] | Any = None, *,
                 input_shape: tuple[int, ...] | None = None,
                 expected_failures: Mapping[str, str] | None = None) -> list[Check]:
    """The checks of ``arch`` (a class, or an instance holding its options), one by one
    (see :func:`check_model`)."""
    cls, options = class_and_options(arch, options)
    ARCHITECTURES.validate(cls, cls.__qualname__)
    resolved = resolve_options(cls, options, TINY_MODEL_OPTIONS)
    shape = tuple(input_shape) if input_shape is not None else default_shape(cls)
    failures = declared_failures(cls, expected_failures, (c.__name__ for c in MODEL_CHECKS))
    return [Check(check, cls, resolved, shape, expected_failure=reason_for(failures, check, ""))
            for check in MODEL_CHECKS]


def check_model(arch: type[Architecture[Any]] | Architecture[Any],
                options: Mapping[str, Any] | Any = None, *,
                input_shape: tuple[int, ...] | None = None,
                expected_failures: Mapping[str, str] | None = None) -> Report:
    """Check the architecture ``arch`` (a class, or an instance holding its options) against
    the model contract (the module docstring lists the checks); AssertionError listing every
    check that failed, else a :class:`~creditaudit.testing.common.Report`.

    ``options``: its ``Options`` fields (a mapping laid over the tiny defaults, or an
    ``Options`` instance; default: an instance's own options); ``input_shape``: one input,
    as a dataset declares it (default (6,) for vector architectures, 2×8×8 images for image
    ones); ``expected_failures``:
    ``{check name: reason}`` of checks it fails by design. ConfigError when the class does
    not describe itself or ``options`` names an option it does not have.
    """
    cls, options = class_and_options(arch, options)
    checks = model_checks(cls, options, input_shape=input_shape,
                          expected_failures=expected_failures)
    return run_checks(checks, f"{cls.__name__} ({cls.name})")


__all__ = ["check_model", "model_checks", "MODEL_CHECKS", "TINY_MODEL_OPTIONS",
           "PROBE_SHAPES"]
