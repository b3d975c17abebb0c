"""Whether a run fits in this machine's memory, decided by its plan before anything is built:
the model's training memory and what its rule builds beside it, both sized on the meta
device (no memory, no random draws), and the data a dataset declares it would generate."""

from __future__ import annotations

import logging
import math
import os

from torch import nn

from creditaudit.config import RunConfig
from creditaudit.descriptions import ModelDescription
from creditaudit.errors import ConfigError, ModelContractError
from creditaudit.guests.blame import blame
from creditaudit.methods import CreditRule, build_rule
from creditaudit.methods.footprint import rule_bytes
from creditaudit.models.meta import on_meta_device
from creditaudit.registry import RULES

log = logging.getLogger(__name__)
# Bytes per parameter a training step holds: fp32 weight, gradient and AdamW's two moments
# (twice as many for float64 parameters: :func:`training_bytes_per_parameter`).
TRAINING_BYTES_PER_PARAMETER = 16


def check_fits(description: ModelDescription, model: nn.Module, rule: type[CreditRule],
               config: RunConfig, n_classes: int) -> None:
    """One-line ConfigError when training the model (``description``; ``model`` as built on
    the meta device) and what ``rule`` builds beside it with ``config``'s options (auxiliary
    nets, local classifiers, feedback: :func:`rule_on_meta_bytes`) needs more memory than
    this machine has available. Binding the rule may change ``model``'s flags."""
    available = available_memory()
    if available is None:
        return
    own = (description.parameters or 0) * training_bytes_per_parameter(model)
    aux = 0 if own > available else rule_on_meta_bytes(rule, model, config, n_classes)
    needed = own + aux
    if needed <= available:
        return
    beside = (f" and {rule.name} builds {aux / 2**30:,.1f} GiB beside it (auxiliary nets, "
              "feedback: see its method.* sizes)" if aux else "")
    raise ConfigError(f"the {description.label} model has {description.parameters:,} "
                      f"parameters{beside}: training needs about {needed / 2**30:,.1f} GiB "
                      f"(weights, gradients, optimiser state) but this machine has "
                      f"{available / 2**30:,.1f} GiB available; choose a smaller model"
                      f"{' or smaller method options' if aux else ''}")


def training_bytes_per_parameter(model: nn.Module) -> int:
    """Bytes per parameter a training step of ``model`` holds: weight, gradient and AdamW's
    two moments, each in the parameters' dtype (the widest, when they differ; a float64
    run's, made in a caller's float64 default dtype, twice a float32 run's)."""
    widest = max((p.element_size() for p in model.parameters()), default=4)
    return TRAINING_BYTES_PER_PARAMETER * widest // 4


def check_data_fits(name: str, sizes: tuple[int, int] | None,
                    input_shape: tuple[int, ...],
                    fix: str = "use fewer samples (data.n_train, data.n_test)") -> None:
    """One-line ConfigError when the samples dataset ``name`` declares (``sizes``: training
    and test samples; None: unknown before loading, not checked) of ``input_shape`` cannot
    fit in this machine's available memory: at least one byte per value of an image
    (C, H, W), four per feature (D,), and eight per int64 label — a lower bound, so only a
    dataset that cannot load is refused (an allocation failure in generation otherwise).
    ``fix`` ends the message: what to change (a command's own flag, where it has one)."""
    available = available_memory()
    if sizes is None or available is None:
        return
    n_samples = sum(sizes)
    value_bytes = 1 if len(input_shape) == 3 else 4
    needed = n_samples * (math.prod(input_shape) * value_bytes + 8)
    if needed <= available:
        return
    raise ConfigError(f"{name} would hold {sizes[0]:,} + {sizes[1]:,} samples of shape "
                      f"{tuple(input_shape)}: at least {needed / 2**30:,.1f} GiB, but this "
                      f"machine has {available / 2**30:,.1f} GiB available; {fix}")


def rule_on_meta_bytes(rule: type[CreditRule], model: nn.Module, config: RunConfig,
                       n_classes: int) -> int:
    """Bytes ``rule`` holds beside ``model`` (built on the meta device) once bound with
    ``config``'s options (:func:`~creditaudit.methods.footprint.rule_bytes`), bound on the
    meta device too; 0 when binding it there raises anything but a refusal of its options
    (code that needs values: its size is then known only once the run binds it)."""
    try:
        with on_meta_device(), blame(RULES.guest(rule.name)):
            bound = build_rule(model, config.method, n_classes=n_classes,
                               seed=config.run.seed, cls=rule, check=False)
            return rule_bytes(bound)
    except (ConfigError, ModelContractError):
        raise
    except Exception as err:  # noqa: BLE001 - sized once the run binds it on its device
        log.debug("binding %s on the meta device failed (%s: %s); its own memory is not "
                  "counted", rule.name, type(err).__name__, err)
        return 0


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux's MemAvailable), or None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


__all__ = ["check_fits", "check_data_fits", "rule_on_meta_bytes", "available_memory",
           "TRAINING_BYTES_PER_PARAMETER", "training_bytes_per_parameter"]
