"""What the four conformance suites share: tiny float64 models and batches, and the check
machinery (:class:`Check`, declared expected failures, one AssertionError listing every
failure).

A *check* is a function ``check(subject, *args)`` that returns when the subject (a rule,
architecture, dataset or diagnostic class) conforms and raises AssertionError saying what is
wrong otherwise. A suite turns its checks into :class:`Check` objects (one per check and
variant, e.g. per tiny architecture) and :func:`run_checks` runs them. A check a class fails
by design is declared with its reason in ``expected_failures`` (``{check name: reason}``,
or ``{"check name[variant]": reason}`` for one variant): it is then reported as an expected
failure, and an error once it passes, so the declaration cannot outlive the failure.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from creditaudit.errors import ConfigError
from creditaudit.formatting import counted
from creditaudit.models import ResidualNet, architecture
from creditaudit.models.registry import build_architecture

log = logging.getLogger(__name__)

F64 = torch.float64
IN_DIM, WIDTH, BLOCKS, CLASSES, BATCH = 6, 8, 3, 4, 9
IMAGE = (2, 8, 8)  # the tiny image architectures' inputs: 2 channels, 8×8 pixels
TOLERANCE = 1e-10

PASSED, FAILED = "passed", "failed"
EXPECTED_FAILURE, UNEXPECTED_PASS = "expected failure", "unexpected pass"


# --- tiny models ------------------------------------------------------------------------------
@dataclass(frozen=True)
class TinyArch:
    """How the rule suite builds one tiny architecture: ``build()`` returns the model (its
    weights drawn from torch's global RNG, which :func:`tiny_model` seeds), ``input_shape``
    is one input as the model reads it."""

    build: Callable[[], ResidualNet]
    input_shape: tuple[int, ...]
    adapted: bool = False  # a network adapted with creditaudit.adapt (see adapted_tiny_arch)


def registered_tiny_arch(name: str, input_shape: tuple[int, ...], **options: Any) -> TinyArch:
    """A :class:`TinyArch` built by the registered architecture ``name`` with ``options``
    (its ``Options`` fields) for inputs of ``input_shape`` and :data:`CLASSES` classes."""

    def build() -> ResidualNet:
        arch = architecture(name)
        return build_architecture(arch(arch.Options(**options)), input_shape=input_shape,
                                  n_classes=CLASSES)

    return TinyArch(build, tuple(input_shape))


def adapted_tiny_arch(kind: str) -> TinyArch:
    """A network nobody here wrote, adapted with :func:`creditaudit.adapt`: ``transformer``
    (PyTorch's TransformerEncoder layers as states (B, 5, 8), 2×8×8 images) or ``resnet``
    (a CIFAR ResNet: stem and three BasicBlocks of 4, 8, 8 channels with BatchNorm and a
    strided 1×1 shortcut, down to (B, 8, 2, 2)). Rules run on them only when they declare
    ``adapted_models``."""
    from creditaudit.models.adapted import adapt
    from creditaudit.testing.zoo import CifarResNet, TransformerClassifier

    def build() -> Any:
        if kind == "transformer":
            net: torch.nn.Module = TransformerClassifier(
                IMAGE, patch=4, d=WIDTH, depth=BLOCKS + 1, heads=2, mlp_ratio=2,
                n_classes=CLASSES).to(F64)
            states = [f"encoder.layers.{i}" for i in range(BLOCKS + 1)]
        else:
            net = CifarResNet(1, (4, WIDTH, WIDTH), IMAGE[0], CLASSES, shortcut="B").to(F64)
            states = ["stem", "layer1.0", "layer2.0", "layer3.0"]
        return adapt(net, states, input_shape=IMAGE)

    return TinyArch(build, IMAGE, adapted=True)


# The architectures every rule is checked on, by name. Add an entry to check rules on another
# one (e.g. ``TINY_ARCHS["mine"] = TinyArch(build, input_shape)``); the last layer of each
# block starts N(0, 0.1) so no block is close to the identity map.
TINY_ARCHS: dict[str, TinyArch] = {
    # inputs (B, 6), states (B, 8)
    "resmlp": registered_tiny_arch("resmlp", (IN_DIM,), d=WIDTH, n_blocks=BLOCKS, w2_std=0.1),
    # 2×8×8 images, patch 4, 2 heads: states (B, 5, 8)
    "vit": registered_tiny_arch("vit", IMAGE, d=WIDTH, n_blocks=BLOCKS, heads=2, mlp_ratio=2,
                                patch=4, w2_std=0.1),
    # 2×8×8 images, patch 2, kernel 3: states (B, 8, 4, 4), with BatchNorm
    "convmixer": registered_tiny_arch("convmixer", IMAGE, d=WIDTH, n_blocks=BLOCKS, patch=2,
                                      kernel=3, w2_std=0.1),
    "adapted-transformer": adapted_tiny_arch("transformer"),
    "adapted-resnet": adapted_tiny_arch("resnet"),
}
ADAPTED_ARCHS = tuple(name for name, arch in TINY_ARCHS.items() if arch.adapted)


def tiny_arch(arch: str) -> TinyArch:
    """The entry of :data:`TINY_ARCHS` called ``arch`` (ValueError naming them otherwise)."""
    if arch not in TINY_ARCHS:
        raise ValueError(f"unknown tiny architecture {arch!r}; use one of "
                         f"{', '.join(TINY_ARCHS)}")
    return TINY_ARCHS[arch]


def tiny_model(seed: int = 0, dtype: torch.dtype = F64, arch: str = "resmlp") -> ResidualNet:
    """A 3-block d=8 net of :data:`TINY_ARCHS` ``arch`` for :data:`CLASSES` classes, its
    weights drawn under ``seed`` (global RNG untouched), in ``dtype``."""
    build = tiny_arch(arch).build
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build()
    return model.to(dtype)


def tiny_batch(seed: int = 1, dtype: torch.dtype = F64, arch: str = "resmlp"
               ) -> tuple[Tensor, Tensor]:
    """(x, y): BATCH inputs for :func:`tiny_model` of ``arch`` and labels in 0 … CLASSES−1."""
    generator = torch.Generator().manual_seed(seed)
    shape = tiny_arch(arch).input_shape
    return (torch.randn(BATCH, *shape, generator=generator, dtype=dtype),
            torch.randint(0, CLASSES, (BATCH,), generator=generator))


def resolve_options(cls: type, options: Any = None, tiny: Mapping[str, Any] | None = None
                    ) -> Any:
    """The options a suite checks ``cls`` with: ``options`` itself when it is an object (an
    ``Options`` instance, a config section, :class:`~creditaudit.protocol.Thresholds`), else
    ``cls.Options`` from the mapping laid over ``tiny`` (only the options ``cls`` declares);
    ConfigError for a key it does not declare."""
    if options is not None and not isinstance(options, Mapping):
        return options
    names = cls.option_names()
    unknown = [key for key in (options or {}) if key not in names]
    if unknown:
        raise ConfigError(f"{cls.__name__} has no option {unknown[0]!r}; its options are "
                          f"{', '.join(names) or 'none'}")
    defaults = {k: v for k, v in (tiny or {}).items() if k in names}
    return cls.Options(**{**defaults, **(options or {})})


def class_and_options(subject: Any, options: Any = None) -> tuple[type, Any]:
    """The class a suite checks and the options it was given: ``subject`` is the class, or
    an instance holding its options (which ``options``, when given, replace)."""
    if isinstance(subject, type):
        return subject, options
    return type(subject), subject.options if options is None else options


# --- the check machinery ------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """What one run of a :class:`Check` gave: ``status`` is ``"passed"``, ``"failed"``,
    ``"expected failure"`` or ``"unexpected pass"``; ``message`` says why (failures)."""

    id: str
    status: str
    message: str = ""


class Check:
    """One check of one class (for rules: on one tiny architecture); call it to run it.

    ``__name__`` is the check's name, ``variant`` what it runs on (a tiny architecture;
    ``""`` for a check that runs once), ``id`` both (``"check_name[variant]"``),
    ``expected_failure`` the reason it is declared to fail (None: it must pass). Calling it
    raises AssertionError when it fails unexpectedly or passes although declared to fail,
    and returns the :class:`Outcome` otherwise (a test can then ``pytest.xfail`` an
    expected failure).
    """

    def __init__(self, check: Callable[..., None], subject: type, *args: Any,
                 variant: str = "", expected_failure: str | None = None) -> None:
        self.check, self.subject, self.args = check, subject, args
        self.variant, self.expected_failure = variant, expected_failure
        self.__name__ = check.__name__
        self.id = f"{check.__name__}[{variant}]" if variant else check.__name__

    @property
    def cls(self) -> type:
        """The class under check."""
        return self.subject

    @property
    def arch(self) -> str:
        """The tiny architecture of a rule check."""
        return self.variant

    def run(self) -> Outcome:
        """Run the check and classify what happened (never raises for a failing check)."""
        try:
            self.check(self.subject, *self.args)
        except AssertionError as err:
            message = str(err) or "assertion failed"
        except Exception as err:  # noqa: BLE001 - a crash is a failed check too
            message = f"raised {type(err).__name__}: {err}"
        else:
            message = None
        if self.expected_failure is None:
            return Outcome(self.id, PASSED if message is None else FAILED, message or "")
        if message is None:
            return Outcome(self.id, UNEXPECTED_PASS,
                           f"expected failure {self.id} passed: remove it from "
                           "expected_failures")
        return Outcome(self.id, EXPECTED_FAILURE, f"{message} (expected: "
                       f"{self.expected_failure})")

    def __call__(self) -> Outcome:
        if self.expected_failure is None:
            self.check(self.subject, *self.args)  # a failure keeps its own traceback
            return Outcome(self.id, PASSED)
        outcome = self.run()
        if outcome.status == UNEXPECTED_PASS:
            raise AssertionError(outcome.message)
        return outcome

    def __repr__(self) -> str:
        return f"Check({self.id} of {self.subject.__name__})"


def declared_failures(subject: type, given: Mapping[str, str] | None,
                      names: Iterable[str]) -> dict[str, str]:
    """``subject.expected_failures`` (if it declares any) merged with ``given`` (which wins),
    each key a check name of ``names`` or ``"name[variant]"``, each reason non-empty;
    ConfigError naming the first bad entry otherwise."""
    merged = {**getattr(subject, "expected_failures", {}), **(given or {})}
    known = set(names)
    for key, reason in merged.items():
        name = key.split("[", 1)[0] if key.endswith("]") else key
        if name not in known:
            raise ConfigError(f"expected failure {key!r} of {subject.__name__} names no check "
                              f"of its suite; the checks are {', '.join(sorted(known))}")
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigError(f"expected failure {key!r} of {subject.__name__} needs a reason: "
                              "a non-empty string saying why the check fails by design")
    return merged


def reason_for(failures: Mapping[str, str], check: Callable[..., None], variant: str
               ) -> str | None:
    """The declared reason ``check`` fails on ``variant`` (its id first, then its name)."""
    if variant and f"{check.__name__}[{variant}]" in failures:
        return failures[f"{check.__name__}[{variant}]"]
    return failures.get(check.__name__)


@dataclass(frozen=True)
class Report:
    """What a suite found: the ids of the checks that passed, and ``{id: message}`` of those
    that failed as declared."""

    passed: list[str]
    expected_failures: dict[str, str]


def run_checks(checks: Iterable[Check], what: str) -> Report:
    """Run every check; AssertionError listing each unexpected failure and each declared
    failure that passed, else the :class:`Report` (expected failures are also logged)."""
    passed, expected, failures = [], {}, []
    for check in checks:
        outcome = check.run()
        if outcome.status == PASSED:
            passed.append(outcome.id)
        elif outcome.status == EXPECTED_FAILURE:
            expected[outcome.id] = outcome.message
            log.info("%s: expected failure %s: %s", what, outcome.id, outcome.message)
        else:
            failures.append(f"{outcome.id}: {outcome.message}")
    if failures:
        raise AssertionError(f"{what} fails {counted(len(failures), 'conformance check')}:\n- "
                             + "\n- ".join(failures))
    return Report(passed, expected)


# --- global RNGs ---------------------------------------------------------------------------------
# Seeds the global RNGs are set to while a check watches them: not a seed a component would
# reseed with, so a component that reseeds one is seen to move it.
WATCHED_SEED = 8_675_309


@contextlib.contextmanager
def watched_global_rngs() -> Iterator[tuple[Any, ...]]:
    """Seed torch's, numpy's and Python's global RNGs with :data:`WATCHED_SEED` and yield
    their states (for :func:`moved_rngs`); every RNG is put back as it was on exit."""
    saved = global_rng_states()
    try:
        torch.manual_seed(WATCHED_SEED)
        np.random.seed(WATCHED_SEED)
        random.seed(WATCHED_SEED)
        yield global_rng_states()
    finally:
        torch.set_rng_state(saved[0])
        np.random.set_state(saved[1])
        random.setstate(saved[2])


def global_rng_states() -> tuple[Any, ...]:
    """The states of torch's (CPU), numpy's and Python's global RNGs, for :func:`moved_rngs`."""
    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def moved_rngs(before: tuple[Any, ...]) -> list[str]:
    """Which global RNGs ("torch's", "numpy's", "Python's") are not in the states
    ``before`` (:func:`global_rng_states`) — moved by draws, or reseeded."""
    now = global_rng_states()
    moved = []
    if not torch.equal(now[0], before[0]):
        moved.append("torch's")
    numpy_now, numpy_before = now[1], before[1]
    if not (numpy_now[0] == numpy_before[0] and bool((numpy_now[1] == numpy_before[1]).all())
            and numpy_now[2:] == numpy_before[2:]):
        moved.append("numpy's")
    if now[2] != before[2]:
        moved.append("Python's")
    return moved


# --- comparing states ---------------------------------------------------------------------------
def flat_state(state: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of a nested state (dicts, lists, tuples) by its dotted path."""
    if isinstance(state, dict):
        out: dict[str, Any] = {}
        for key, value in state.items():
            out.update(flat_state(value, f"{prefix}{key}."))
        return out
    if isinstance(state, list | tuple):
        out = {}
        for index, value in enumerate(state):
            out.update(flat_state(value, f"{prefix}{index}."))
        return out
    return {prefix.rstrip("."): state}


def same(a: Any, b: Any) -> bool:
    """Equal leaves: tensors of one shape, dtype and value; NaN equals NaN."""
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        if not (isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape
                and a.dtype == b.dtype):
            return False
        a, b = a.cpu(), b.cpu()
        equal = a == b
        if a.is_floating_point() or a.is_complex():
            equal = equal | (a.isnan() & b.isnan())
        return bool(equal.all())
    return a == b or (a != a and b != b)


def same_state(a: Any, b: Any) -> list[str]:
    """The paths at which two nested states differ (empty when equal)."""
    flat_a, flat_b = flat_state(a), flat_state(b)
    keys = list(flat_a) + [k for k in flat_b if k not in flat_a]
    return [k for k in keys if k not in flat_a or k not in flat_b
            or not same(flat_a[k], flat_b[k])]


def changes_of_the_forward(model: torch.nn.Module, forward: Callable[[], Any], *,
                           buffers: bool) -> list[str]:
    """The names of the parameters (and, with ``buffers``, the buffers) of ``model`` that
    calling ``forward()`` changes (values, shapes or dtypes)."""
    tensors = dict(model.named_parameters())
    if buffers:
        tensors.update(model.named_buffers())
    before = {name: t.detach().clone() for name, t in tensors.items()}
    forward()
    now = dict(model.named_parameters())
    if buffers:
        now.update(model.named_buffers())
    return [name for name, was in before.items()
            if name not in now or now[name].shape != was.shape
            or now[name].dtype != was.dtype or not torch.equal(now[name].detach(), was)]


def relative_error(got: Tensor, want: Tensor) -> float:
    """max |got − want| / max |want| (max |got − want| when want is 0)."""
    scale = want.abs().max().clamp_min(1e-300)
    return float((got - want).abs().max() / scale)


__all__ = ["TinyArch", "TINY_ARCHS", "ADAPTED_ARCHS", "adapted_tiny_arch", "registered_tiny_arch",
           "tiny_arch", "tiny_model",
           "tiny_batch", "resolve_options", "Check", "global_rng_states", "moved_rngs",
           "watched_global_rngs", "WATCHED_SEED", "Outcome", "Report", "run_checks",
           "declared_failures", "reason_for", "flat_state", "same", "same_state",
           "relative_error", "changes_of_the_forward", "F64", "IN_DIM", "WIDTH", "BLOCKS",
           "CLASSES", "BATCH", "IMAGE",
           "TOLERANCE", "PASSED", "FAILED", "EXPECTED_FAILURE", "UNEXPECTED_PASS"]
