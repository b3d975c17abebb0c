"""The door: a guest's conformance checks run before any of its numbers is recorded.

The first time a command uses a plugin — credit rule, architecture, dataset, protocol
diagnostic — or a ``module`` factory from outside creditaudit, the checks of its axis's
public suite (:mod:`creditaudit.testing`) that catch a lie run on a tiny input: a rule's
credits against the update its step makes (``check_rule`` on a tiny ResidualMLP, and on an
adapted network when it declares ``adapted_models``); an architecture's states, logits and
terminal LayerNorm against what it declares (``check_model`` with the run's options at tiny
sizes, on the data's sample shape); a dataset's arrays — finite, labels in range, the same
on a second ``load()`` — (``check_dataset`` with the run's options at tiny sizes); a
diagnostic's statistic, a finite number or an explicit "not evaluated"
(``check_diagnostic`` with the run's options); a factory's network built for real on the
data's sample shape (``check_module``). A failure refuses the command in one
:class:`~creditaudit.errors.GuestError` line naming the guest, its distribution and the
check.

A pass is remembered per guest identity — what names it (``dist==version``), the digest of
its code, what it was checked with, and the digest of the suites themselves — in
``door.json`` of the user cache (:mod:`creditaudit.files.cache`), each entry signed with the
machine's key, so it costs once per machine: an edited entry does not verify and the checks
run again. Built-in components are never checked here: the test suite checks them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from creditaudit.config.keys import signless_zeros
from creditaudit.errors import GuestError
from creditaudit.files.cache import load_json_cache, sign, store_json_cache, verify
from creditaudit.guests import Guest, source_digest
from creditaudit.guests.blame import blame

log = logging.getLogger(__name__)

DOOR_CACHE = "door.json"
# A check's message is cut to this many characters in the one-line refusal.
MESSAGE_CHARS = 600
_MEMORY: dict[str, Admission] = {}
_SUITES: list[str] = []  # the digest of the suites' own code, once per process


@dataclasses.dataclass(frozen=True)
class Admission:
    """What the door found: the ids of the checks passed, ``{id: reason}`` of those the
    guest declares it fails by design (``expected_failures``), and whether this was
    remembered from an earlier pass (``cached``) and how long the checks took (seconds;
    0 when cached)."""

    checks: tuple[str, ...]
    declared_failures: dict[str, str]
    cached: bool = False
    seconds: float = 0.0

    @property
    def declared(self) -> tuple[tuple[str, str], ...]:
        """``(check, reason)`` of the declared failures, in check order (for the record)."""
        return tuple(sorted(self.declared_failures.items()))


def suites_digest() -> str:
    """sha256 of the conformance suites' and this module's source: a new suite checks
    every guest again."""
    if not _SUITES:
        import creditaudit.testing as testing

        folder = Path(testing.__file__).resolve().parent
        files = sorted(folder.glob("*.py")) + [Path(__file__).resolve()]
        _SUITES.append(source_digest(folder.parent, files))
    return _SUITES[0]


def admit(guest: Guest, axis: str, checked_with: Mapping[str, Any],
          make_checks: Callable[[], list[Any]], under: str = "") -> Admission:
    """Run the checks ``make_checks()`` gives (:class:`creditaudit.testing.Check` objects)
    for ``guest`` of ``axis`` unless a pass of the same identity is remembered; GuestError
    naming the first check that fails (and ``under``, the settings it ran under, when the
    refusal should say them). ``checked_with``: what else the checks depend on (options,
    input shape), plain JSON."""
    identity = {"axis": axis, "guest": guest.what, "code": guest.digest,
                "suites": suites_digest(), "with": checked_with}
    # -0.0 is 0.0, as in run ids: JSON spelled them apart, and the pass went unfound
    key = hashlib.sha256(json.dumps(signless_zeros(identity), sort_keys=True, default=str
                                    ).encode()).hexdigest()
    if key in _MEMORY:
        return dataclasses.replace(_MEMORY[key], cached=True, seconds=0.0)
    remembered = _remembered(key)
    if remembered is not None:
        _MEMORY[key] = remembered
        return remembered
    started = time.perf_counter()
    from creditaudit.testing.common import EXPECTED_FAILURE, FAILED, PASSED

    passed, declared = [], {}
    with blame(guest):
        for check in make_checks():
            outcome = check.run()
            if outcome.status == FAILED:
                raise GuestError(_refusal(guest, outcome.id, outcome.message, under))
            if outcome.status == PASSED:
                passed.append(outcome.id)
            elif outcome.status == EXPECTED_FAILURE:
                declared[outcome.id] = check.expected_failure
    admission = Admission(tuple(passed), declared, seconds=time.perf_counter() - started)
    log.info("%s passed %d conformance checks in %.2f s (remembered for the next runs)",
             guest.what, len(passed), admission.seconds)
    _MEMORY[key] = admission
    _remember(key, admission)
    return admission


def _refusal(guest: Guest, check: str, message: str, under: str = "") -> str:
    text = " ".join(message.split())
    if len(text) > MESSAGE_CHARS:
        text = text[:MESSAGE_CHARS - 1] + "…"
    where = f" under {under}" if under else ""
    return (f"{guest.what} fails the conformance check {check}{where}: {text}; its numbers would "
            "not mean what they claim, so nothing runs (fix it, or report it to its "
            "authors: creditaudit.testing has the check)")


def _remembered(key: str) -> Admission | None:
    entry = load_json_cache(DOOR_CACHE).get(key)
    if not isinstance(entry, dict):
        return None
    checks, declared = entry.get("checks"), entry.get("declared_failures")
    if not (isinstance(checks, list) and all(isinstance(c, str) for c in checks)
            and isinstance(declared, dict)):
        return None
    if not verify(entry.get("mac"), DOOR_CACHE, key, _payload(checks, declared)):
        log.debug("door cache entry %s does not verify; checking again", key[:12])
        return None
    return Admission(tuple(checks), dict(declared), cached=True)


def _remember(key: str, admission: Admission) -> None:
    payload = _payload(list(admission.checks), admission.declared_failures)
    mac = sign(DOOR_CACHE, key, payload)
    if mac is None:  # no key, no trustworthy entry: check again next time
        return
    cache = load_json_cache(DOOR_CACHE)
    cache[key] = {"checks": list(admission.checks),
                  "declared_failures": admission.declared_failures, "mac": mac}
    store_json_cache(DOOR_CACHE, cache)


def _payload(checks: list[str], declared: dict[str, Any]) -> str:
    return json.dumps({"checks": checks, "declared_failures": declared}, sort_keys=True)


# --- each axis's door -------------------------------------------------------------------------
def _values(cls: type, options: Any) -> dict[str, Any]:
    """``cls``'s own options as a plain dict, read from ``options`` (a config section, an
    ``Options`` instance or a mapping)."""
    return dataclasses.asdict(cls.options_from(options))


# The tiny architecture whose states have each layout: a rule of a run on an architecture the
# suite has no tiny version of (a plugin's) is checked on states shaped like the run's.
LAYOUT_TINY_ARCHS = {"vectors": "resmlp", "tokens": "vit", "maps": "convmixer"}


def rule_door(cls: type, guest: Guest, arch: str | None = None, options: Any = None, *,
              layouts: tuple[str, ...] = ()) -> Admission:
    """``check_rule`` with the run's own options of the rule (those its ``[method]``
    section ``options`` holds; the defaults when None) on a tiny ResidualMLP, on the tiny
    version of the run's architecture ``arch`` when the suite has one (a ViT-Mini run's
    rule is checked on token states, its stacked step on a stacked ViT-Mini) — else on the
    tiny architecture of each of the run's state ``layouts`` (:data:`LAYOUT_TINY_ARCHS`: a
    plugin architecture's map states are checked on ConvMixer's; an adapted model's token
    states pooled into a vector, on ViT-Mini's) — and on an adapted ResNet when
    the rule declares ``adapted_models``. ``feedback_seed`` is left out: the checks seed the
    rule's generator themselves, so a sweep over seeds is checked once."""
    from creditaudit.testing.common import TINY_ARCHS
    from creditaudit.testing.rules import own_options, rule_checks

    shaped = ((arch,) if arch is not None and arch in TINY_ARCHS
              and not TINY_ARCHS[arch].adapted
              else tuple(LAYOUT_TINY_ARCHS[layout] for layout in layouts
                         if layout in LAYOUT_TINY_ARCHS))
    archs = ("resmlp", *(name for name in dict.fromkeys(shaped) if name != "resmlp"))
    if cls.adapted_models:
        archs += ("adapted-resnet",)
    values = {key: value for key, value in own_options(cls, options).items()
              if key != "feedback_seed"}
    defaults = own_options(cls, {})
    under = ", ".join(f"method.{key}={json.dumps(value)}" for key, value in values.items()
                      if value != defaults.get(key))
    return admit(guest, "rules", {"archs": archs, "options": values},
                 lambda: rule_checks(cls, archs, options=values), under)


def architecture_door(arch: Any, guest: Guest, input_shape: tuple[int, ...]) -> Admission:
    """``check_model`` with the run's options (those the architecture instance ``arch``
    holds) at the suite's tiny sizes, on samples of ``input_shape`` (the data's)."""
    from creditaudit.testing.models import TINY_MODEL_OPTIONS, model_checks

    cls = type(arch)
    names = cls.option_names()
    values = {**_values(cls, arch.options),
              **{k: v for k, v in TINY_MODEL_OPTIONS.items() if k in names}}
    shape = tuple(input_shape)
    return admit(guest, "models", {"options": values, "input_shape": list(shape)},
                 lambda: model_checks(cls, values, input_shape=shape))


def factory_door(guest: Guest, options: Any, input_shape: tuple[int, ...],
                 n_classes: int) -> Admission:
    """``check_module``: the factory's network built for real for the data's samples and
    classes, its declared terminal LayerNorm probed."""
    from creditaudit.models import ModuleArchitecture
    from creditaudit.testing.modules import module_checks

    values = _values(ModuleArchitecture, options)
    shape = tuple(input_shape)
    return admit(guest, "models", {"options": values, "input_shape": list(shape),
                                   "n_classes": n_classes},
                 lambda: module_checks(values, input_shape=shape, n_classes=n_classes))


def dataset_door(spec: Any, guest: Guest) -> Admission:
    """``check_dataset`` with the run's options (those the dataset instance ``spec`` holds)
    at the suite's tiny sizes."""
    from creditaudit.testing.datasets import TINY_DATA_OPTIONS, dataset_checks

    cls = type(spec)
    names = cls.option_names()
    values = {**_values(cls, spec.options),
              **{k: v for k, v in TINY_DATA_OPTIONS.items() if k in names}}
    return admit(guest, "datasets", {"options": values},
                 lambda: dataset_checks(cls, values))


def diagnostic_door(diagnostic: Any, guest: Guest) -> Admission:
    """``check_diagnostic`` with the run's options of the diagnostic (those the instance of
    the run's protocol holds)."""
    from creditaudit.testing.diagnostics import diagnostic_checks

    cls = type(diagnostic)
    values = _values(cls, diagnostic.options)
    return admit(guest, "diagnostics", {"options": values},
                 lambda: diagnostic_checks(cls, values))


__all__ = ["Admission", "admit", "suites_digest", "rule_door", "architecture_door",
           "factory_door", "dataset_door", "diagnostic_door", "DOOR_CACHE"]
