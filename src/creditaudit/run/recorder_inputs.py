"""What a :class:`~creditaudit.run.recorder.Recorder` is handed, checked before it records
anything: the rule and the evaluation set it is created with, the run's folder name and
whether it may be claimed, the numbers a loop reports for an epoch, the version counters that
tell whether the evaluation arrays were changed in place since, and the network's modules
and parameters, which must stay those it had."""

from __future__ import annotations

import math
import weakref
from collections.abc import Collection, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from creditaudit.data.identity import tensor_versions
from creditaudit.errors import ConfigError, OutputError, RunRecordError
from creditaudit.files.safe_files import describe_os_error
from creditaudit.measures.user_models import check_inputs, check_same_device
from creditaudit.methods import CreditRule
from creditaudit.models.adapt_arguments import is_compiled
from creditaudit.records import RECORD_FILE, RECORD_KEYS, RUN_FILES
from creditaudit.records.claims import holding_run
from creditaudit.scalar_values import recordable_number


def checked_eval_set(rule: Any, eval_x: Tensor, eval_y: Tensor) -> Tensor:
    """``eval_x`` detached, once ``rule`` is a bound credit rule and ``eval_x`` ``(N, …)``,
    ``eval_y`` ``(N,)`` an evaluation set its model takes (:func:`~creditaudit.measures.
    user_models.check_inputs`), on its device, with labels among its classes; one-line
    ConfigError (or ModelContractError) otherwise."""
    if not isinstance(rule, CreditRule):
        raise ConfigError(f"Recorder records a credit rule, got {type(rule).__name__}: "
                          "pass creditaudit.rule(name, adapt(net, states=[…]))")
    model = rule.model
    check_inputs(model, eval_x, eval_y)
    check_same_device(model, eval_x, eval_y)
    # an eval set left requiring grad is data, as in diagnose(): the same storage and
    # version counter, so the watch on writes to it still sees them
    eval_x = eval_x.detach()
    if eval_y.numel() and not 0 <= int(eval_y.min()) <= int(eval_y.max()) < rule.n_classes:
        raise ConfigError(f"eval_y holds labels outside 0 … {rule.n_classes - 1}, the "
                          f"classes of the rule's {rule.n_classes} logits")
    return eval_x


# What may change a module's forward or its backward besides its class and its tensors:
# the hooks torch runs around it (attribute of nn.Module → what the message calls one).
HOOK_KINDS = {"_forward_pre_hooks": "forward pre-hook", "_forward_hooks": "forward hook",
              "_backward_pre_hooks": "backward pre-hook", "_backward_hooks": "backward hook"}
# (class, compiled with torch.compile, its hooks as (kind, id of the hook)) of one module
ModuleEntry = tuple[str, bool, tuple[tuple[str, int], ...]]
# (name → entry) per module, (name → (id, shape, dtype, device)) per parameter and buffer,
# the module backward hooks registered for every module (as (kind, id))
NetworkLayout = tuple[dict[str, ModuleEntry],
                      dict[str, tuple[int, tuple[int, ...], str, str]],
                      tuple[tuple[str, int], ...]]


def network_layout(net: nn.Module) -> NetworkLayout:
    """What :func:`check_network_unchanged` compares: each module's class, whether it is
    compiled and its hooks, each parameter's object, shape, dtype and device (a buffer's
    shape, dtype and device: BatchNorm updates its statistics in place, a buffer may be
    reassigned), and the backward hooks torch runs for every module."""
    modules = {name: (type(module).__qualname__, is_compiled(module),
                      _hooks(module, HOOK_KINDS)) for name, module in net.named_modules()}
    tensors = {name: (id(p), tuple(p.shape), str(p.dtype), str(p.device))
               for name, p in net.named_parameters()}
    tensors |= {f"{name} (buffer)": (0, tuple(b.shape), str(b.dtype), str(b.device))
                for name, b in net.named_buffers()}
    return modules, tensors, _hooks(torch.nn.modules.module, GLOBAL_BACKWARD_HOOKS)


# torch's backward hooks for every module (register_module_full_backward_hook, _pre_hook)
GLOBAL_BACKWARD_HOOKS = {"_global_backward_pre_hooks": "backward pre-hook",
                         "_global_backward_hooks": "backward hook"}


def _hooks(owner: Any, kinds: Mapping[str, str]) -> tuple[tuple[str, int], ...]:
    """The hooks ``owner`` (a module, or torch's module of global hooks) keeps in its
    dictionaries ``kinds``, as (what one is called, the hook's id)."""
    return tuple((what, id(hook)) for kind, what in kinds.items()
                 for hook in getattr(owner, kind).values())


def check_network_unchanged(before: NetworkLayout, net: nn.Module) -> None:
    """ConfigError (one line, naming the first change) when ``net`` is no longer the network
    whose ``before`` layout the Recorder took: a module added, removed or replaced by one of
    another class, compiled with torch.compile, a hook added to or removed from a module (or
    a module backward hook for every module), a parameter replaced by a new object (the
    optimiser steps the old one), resized, cast or moved to another device. The record (its
    model, parameter count, dtype and device, run id) describes the network as it was then,
    and its reference check ran on it: a backward hook added since may return another
    gradient than autograd's, which every cosine would then take for the reference."""
    (modules, tensors, hooks), (now_modules, now_tensors, now_hooks) = before, \
        network_layout(net)
    changes = [f"module {n!r} {what}" for n, what in (
        *((n, "added") for n in now_modules if n not in modules),
        *((n, "removed") for n in modules if n not in now_modules),
        *((n, f"replaced by a {now_modules[n][0]}") for n in modules
          if n in now_modules and now_modules[n][0] != modules[n][0]))]
    changes += [change for n in modules if n in now_modules
                and now_modules[n][0] == modules[n][0]
                for change in _module_changes(_module_name(n, net), modules[n], now_modules[n])]
    changes += _hook_changes(hooks, now_hooks, "every module (torch.nn.modules.module."
                             "register_module_full_backward_hook)")
    changes += [f"{n!r} {what}" for n, what in (
        *((n, "added") for n in now_tensors if n not in tensors),
        *((n, "removed") for n in tensors if n not in now_tensors),
        *((n, _tensor_change(tensors[n], now_tensors[n]))
          for n in tensors if n in now_tensors and now_tensors[n] != tensors[n]))]
    if changes:
        raise ConfigError(
            f"the network changed after the Recorder was created ({'; '.join(changes[:3])}), "
            "which its record, run id and reference check would not say: build the network "
            "completely, its hooks too, before creating the Recorder, keep it eager (the "
            "states are read with hooks a torch.compile graph may skip), and change its "
            "weights in place only (load_state_dict, not new nn.Parameter objects), or start "
            "a new Recorder for the new network")


def _module_name(name: str, net: nn.Module) -> str:
    """How a message names module ``name`` of ``net`` (the network itself for ``''``)."""
    return f"module {name!r}" if name else f"the network ({type(net).__name__})"


def _module_changes(where: str, before: ModuleEntry, now: ModuleEntry) -> list[str]:
    """How one module of an unchanged class changed (its layout entries): compiled since,
    or no longer, and hooks added or removed."""
    compiled = [] if now[1] == before[1] else [
        f"{where} {'compiled with torch.compile' if now[1] else 'no longer compiled'}"]
    return compiled + _hook_changes(before[2], now[2], where)


def _tensor_change(before: tuple[Any, ...], now: tuple[Any, ...]) -> str:
    """How one parameter or buffer changed (its layout entries ``before`` and ``now``)."""
    if now[0] != before[0]:
        return "replaced"
    if now[1:3] != before[1:3]:
        return "resized or cast"
    # .to(device) keeps the parameter objects: the evaluation arrays stay where they were
    return f"moved from {before[3]} to {now[3]}"


def _hook_changes(before: tuple[tuple[str, int], ...], now: tuple[tuple[str, int], ...],
                  where: str) -> list[str]:
    """The hooks of ``where`` added or removed between two layouts."""
    return [*(f"a {what} added to {where}" for what, hook in now if (what, hook) not in before),
            *(f"a {what} removed from {where}" for what, hook in before
              if (what, hook) not in now)]


def check_epoch_number(epoch: Any, last: int | None, *, epochs: int | None,
                       every_epoch: str | None) -> None:
    """ConfigError (one line) unless ``epoch`` may be recorded after the ``last`` recorded
    one: an integer ≥ 0 past it, within ``epochs`` (the run's length, when the config gives
    it), and ``last + 1`` when ``every_epoch`` says why the rule must hear of every epoch."""
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0 or (
            last is not None and epoch <= last):
        after = f" after the last recorded epoch {last}" if last is not None else ""
        raise ConfigError(f"epoch={epoch!r} must be an integer ≥ 0{after}: record each "
                          "epoch once, in order")
    if every_epoch and epoch >= 1 and epoch != (last or 0) + 1:
        raise ConfigError(f"epoch={epoch} skips epoch {(last or 0) + 1}: {every_epoch}: "
                          "record every epoch")
    if epochs is not None and epoch > epochs:
        raise ConfigError(f"epoch={epoch} is past optim.epochs={epochs}, which the config "
                          "gives as the run's length: give the epochs your loop runs, or "
                          "leave optim.epochs out (the record then follows the last "
                          "recorded epoch)")


def folder_name(name: Any) -> str:
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name \
            or "\\" in name or "\0" in name:
        raise ConfigError(f"name={name!r} must be one folder name (no / or \\), e.g. "
                          "'resnet20-dfa'")
    return name


@contextmanager
def released_on_error(held: ExitStack) -> Iterator[None]:
    """Close ``held`` (release the run's folder) when the block raises, and re-raise."""
    try:
        yield
    except BaseException:
        held.close()
        raise


def claim_folder(run_dir: Path, overwrite: bool) -> ExitStack:
    """Hold ``run_dir`` (its claim: RunBusyError while another process holds it, as
    ``train`` holds a run's folder), refuse a folder that holds a record unless
    ``overwrite``, then clear every run file (:data:`~creditaudit.records.RUN_FILES`).
    Files without a record — a run killed before its record was written, one whose record
    was deleted — belong to no record, and must not lie beside the new one (an audit or a
    resume would take another run's checkpoint or initial weights for this run's), so they
    go too. Returns the hold, which the Recorder closes when its run ends."""
    held = ExitStack()
    held.enter_context(holding_run(run_dir))
    with released_on_error(held):
        if (run_dir / RECORD_FILE).exists() and not overwrite:
            raise RunRecordError(f"{run_dir} holds a run record already: pass another name= "
                                 "or overwrite=True to replace it")
        clear_run_files(run_dir, again="then create the Recorder again, or pass another name=")
    return held


def clear_run_files(run_dir: Path, *, again: str, keep: Collection[str] = ()) -> None:
    """Remove ``run_dir``'s run files (:data:`~creditaudit.records.RUN_FILES`, but those
    named in ``keep``) to start its run over. A folder standing under one of their names
    (never a run's: the run writes files) is refused before anything is removed — neither
    the old record nor what the folder holds is lost — and so is a file that cannot be
    removed: OutputError (one line, ending in ``again``: how to start over once it is out
    of the way)."""
    for file in RUN_FILES:
        if (run_dir / file).is_dir():
            raise OutputError(f"{run_dir / file} is a folder where the run keeps its own "
                              f"{file} file: move it away, {again}")
    for file in (file for file in RUN_FILES if file not in keep):
        try:
            (run_dir / file).unlink(missing_ok=True)
        except OSError as err:
            raise OutputError(f"cannot clear {describe_os_error(err, run_dir / file)}: "
                              f"remove it, {again}") from None


# A run folder (resolved) → the Recorder of this process that writes it (weakly).
_FOLDER_WRITERS: weakref.WeakValueDictionary[Path, Any] = weakref.WeakValueDictionary()


def replaced_writer(run_dir: Path, overwrite: bool) -> Any:
    """Before a Recorder claims ``run_dir``: with ``overwrite``, the unfinished Recorder of
    this process writing it (the cell of a notebook run again, a loop restarted after it
    raised), which the new one stops — its claim released, its later writes refused
    (:func:`check_folder_written`) — so that the new run holds the folder alone; None when
    there is none, or without ``overwrite`` (:func:`claim_folder` refuses the folder's
    record)."""
    earlier = _FOLDER_WRITERS.get(run_dir.resolve())
    return earlier if overwrite and earlier is not None and not earlier.finished else None


def write_folder(run_dir: Path, recorder: Any) -> None:
    """``recorder`` now writes ``run_dir`` (:func:`replaced_writer`)."""
    _FOLDER_WRITERS[run_dir.resolve()] = recorder


def check_folder_written(recorder: Any) -> None:
    """ConfigError (one line) when a Recorder created since with ``overwrite=True`` on the
    same folder replaced ``recorder``'s run: its epochs would be written over that run's."""
    if recorder.replaced:
        raise ConfigError(f"a Recorder created since with overwrite=True replaced this one's "
                          f"run in {recorder.run_dir}: record its epochs with that Recorder, "
                          "or give each run its own name=")


# A rule → the last Recorder created on it (weakly) and that Recorder's run name.
_RULE_HOLDERS: weakref.WeakKeyDictionary[Any, tuple[weakref.ref[Any], str]] = \
    weakref.WeakKeyDictionary()


def hold_rule(rule: Any, recorder: Any, name: str) -> None:
    """``recorder`` (recording run ``name``) now records ``rule``: the Recorder created on
    it before, if any, may record no more epochs (:func:`check_rule_held`)."""
    _RULE_HOLDERS[rule] = (weakref.ref(recorder), name)


def check_rule_held(rule: Any, recorder: Any) -> None:
    """ConfigError (one line) when a Recorder was created on ``rule`` after ``recorder``:
    each Recorder ends the rule's epochs, so the two would end each twice (the second time
    with no step since: a bridge's errors NaN, a warm-up's sums restarted)."""
    holder, name = _RULE_HOLDERS.get(rule, (None, ""))
    if holder is not None and holder() is not recorder:
        raise ConfigError(f"Recorder {name!r} was created on this {rule.name} rule since, and "
                          "each Recorder ends the rule's epochs: record every epoch with one "
                          "Recorder (the last created), or bind a new rule (creditaudit.rule) "
                          "for each run")


def checked_number(name: str, value: Any, *, fraction: bool = False, loss: bool = False
            ) -> float | None:
    """``value`` as a float (None stays None); ConfigError for a non-number, an accuracy
    outside [0, 1] (NaN and ±inf included: a count of right answers is never NaN, even a
    diverged network's) or a negative cross-entropy. A loss's NaN and ±inf are kept: the
    record marks the run diverged."""
    if value is None:
        return None
    number = recordable_number(value)
    if number is None:
        raise ConfigError(f"{name} must be a number, got {type(value).__name__}")
    if fraction and not math.isfinite(number):
        raise ConfigError(f"{name}={value!r} is not a fraction in [0, 1]: an accuracy counts "
                          "right answers, so it is never NaN or Inf; pass the fraction your "
                          "loop measured (a diverged network still scores one)")
    if fraction and not 0.0 <= number <= 1.0:
        raise ConfigError(f"{name}={value!r} is not a fraction in [0, 1]: pass e.g. 0.349, not "
                          "34.9")
    if loss and number < 0:
        raise ConfigError(f"{name}={value!r} is negative; a cross-entropy is ≥ 0")
    return number


def checked_extras(extras: Any) -> dict[str, float | None]:
    """An epoch's ``extras`` (None or a mapping of names to numbers) as the floats a record
    holds (:func:`checked_number`); ConfigError (one line) for another object (a list of
    pairs raised AttributeError), a key that is not a string (``1`` and ``"1"`` were both
    written as ``"1"``, one number lost), an empty or blank key (logged as the bare tag
    ``train/``), or a name the entry writes itself
    (:func:`refuse_record_keys`)."""
    if extras is None:
        return {}
    if not isinstance(extras, Mapping):
        raise ConfigError(f"extras must be a mapping of names to numbers, e.g. "
                          f"{{'val_acc': 0.91}}, got {type(extras).__name__}")
    if odd := [key for key in extras if not isinstance(key, str)]:
        raise ConfigError(f"extras key {odd[0]!r} ({type(odd[0]).__name__}) is not a name: "
                          "name each number with a string, e.g. {'val_acc': 0.91}")
    if blank := [key for key in extras if not key.strip()]:  # logged as the tag "train/"
        raise ConfigError(f"extras key {blank[0]!r} is not a name: name each number with "
                          "a string that says what it is, e.g. {'val_acc': 0.91}")
    kept = {key: checked_number(f"extras[{key!r}]", value) for key, value in extras.items()}
    refuse_record_keys(kept)
    return kept


def refuse_record_keys(extras: Mapping[str, float | None]) -> None:
    """ConfigError (one line) when an extra is named like a key the epoch entry writes
    itself (:data:`~creditaudit.records.RECORD_KEYS`): record.json would hold the extra in
    its place."""
    taken = sorted(key for key in extras if key in RECORD_KEYS)
    if not taken:
        return
    own = [key for key in taken if key in _EPOCH_NUMBERS]
    instead = (f" (pass {', '.join(f'{key}=…' for key in own)} as "
               f"{'its own argument' if len(own) == 1 else 'their own arguments'})"
               if own else "")
    raise ConfigError(f"extras {', '.join(map(repr, taken))}: keys the record writes for "
                      "every epoch, which an extra would replace in record.json: give yours "
                      f"other names{instead}")


# The epoch's numbers epoch() takes as arguments of their own.
_EPOCH_NUMBERS = ("test_acc", "test_loss", "train_loss", "train_acc")


__all__ = ["checked_eval_set", "folder_name", "replaced_writer", "write_folder",
           "check_folder_written", "hold_rule", "check_rule_held", "claim_folder",
           "clear_run_files", "released_on_error", "checked_number", "tensor_versions",
           "checked_extras", "refuse_record_keys", "recordable_number"]
