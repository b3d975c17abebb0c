"""Does a run folder's checkpoint belong to the run being rebuilt? Check, then load it.

``train --resume`` and ``audit`` rebuild a model, a credit rule (and, to resume, the optimiser,
the schedule and the RNG streams) from a run's config, then load its ``checkpoint.pt`` into
them. A checkpoint of another method or shape, a damaged optimiser or schedule state, an RNG
state of the wrong size, an epoch outside ``0 … optim.epochs``, data that changed since the
run trained, a record or checkpoint of another run (copied into this run's folder), or a
guest's code (a plugin's, a ``module`` factory's) that changed since, each end in one
:class:`~creditaudit.errors.RunRecordError` line naming the file, the run or the guest — never
in a KeyError from ``load_state_dict`` halfway through loading, nor in numbers of other code
shown as the run's. (A folder with no run to resume, and an unfinished run that may start
over instead: :mod:`creditaudit.run.unresumable`.)

A resumed run goes on with the torch thread count its epochs so far ran on
(:func:`resume_threads`): the count changes no option of the computation — it is not part of
the run id — but it changes the order in which a sum's pieces are added, so the last bits
of the numbers; on the recorded count the resumed run equals the uninterrupted one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from creditaudit.caller import FORCE, on_command_line
from creditaudit.config import RunConfig, keys_with_role
from creditaudit.data.identity import changed_files
from creditaudit.descriptions import CONTENT_DIGEST, DataIdentity
from creditaudit.errors import RunRecordError
from creditaudit.formatting import counted
from creditaudit.guests import Guest
from creditaudit.guests.blame import blame
from creditaudit.methods import CreditRule
from creditaudit.models import ResidualNet
from creditaudit.optim import optimizer_state_mismatch
from creditaudit.records import RunRecord, structure_mismatch
from creditaudit.registry import ARCHITECTURES, DATASETS, DIAGNOSTICS, RULES, Registry
from creditaudit.run.rng import restore_rng_states

log = logging.getLogger(__name__)


def force_hint() -> str:
    """What to do about a checkpoint or record of another run in a run's folder."""
    return f"it belongs to another run: start this one again with {FORCE}"


def check_checkpoint_fits(state: dict[str, Any], model: ResidualNet, rule: CreditRule,
                          config: RunConfig, path: Path,
                          optimizer: torch.optim.Optimizer | None = None) -> None:
    """One-line RunRecordError when a checkpoint belongs to another method or shape, claims
    an epoch this run does not have, or holds a damaged optimiser state: the rule's own
    optimisers' (:meth:`~creditaudit.methods.CreditRule.optimizers`) and, when given,
    ``optimizer``'s (the model's), each tensor against its parameter."""
    method = state.get("method")
    if method is not None and method != config.method.name:
        raise RunRecordError(f"checkpoint {path} was written by method {method!r}, not "
                             f"{config.method.name!r}: {force_hint()}")
    epoch = state["epoch"]
    if not 0 <= epoch <= config.optim.epochs:
        raise RunRecordError(f"checkpoint {path} is of epoch {epoch}, outside this run's "
                             f"0…{config.optim.epochs}: {force_hint()}")
    for what, expected, got in (("model", model.state_dict(), state["model"]),
                                ("rule", rule.state_dict(), state["rule"])):
        problem = structure_mismatch(expected, got, what)
        if problem:
            raise RunRecordError(f"checkpoint {path} does not fit this run's "
                                 f"{config.method.name} {model.describe().label}: {problem}; "
                                 f"{force_hint()}")
    # Checked here, not by load_state_dict: an optimiser's state is empty until its first
    # step, so the layout checks above pass any saved moments, which torch loads unchecked.
    optimizers = [(f"rule.{key}", live, state["rule"].get(key))
                  for key, live in rule.optimizers().items()]
    if optimizer is not None:
        optimizers.insert(0, ("optimizer", optimizer, state["optimizer"]))
    for where, live, saved in optimizers:
        problem = optimizer_state_mismatch(live, saved, where)
        if problem:
            raise RunRecordError(f"checkpoint {path} holds a damaged optimiser state "
                                 f"({problem}); it cannot be resumed: start the run over "
                                 f"with {FORCE}")


def other_runs_record(record: RunRecord, run_id: str, path: Path | str) -> str | None:
    """What is wrong, in words (no advice), when the record read from ``path`` (a run
    folder's record.json, or the copy inside its checkpoint) is of another run than
    ``run_id``, the run whose folder holds it; None when it is this run's (or too old to
    say). ``train``, ``sweep`` and ``experiment`` each add what to do about it."""
    if record.run_id and record.run_id != run_id:
        return (f"{path} holds the record of run {record.run_id}, not of {run_id} whose "
                "folder it is in (a file copied from another run's folder, or a folder "
                "copied or renamed by hand?)")
    return None


def check_same_run(record: RunRecord, run_id: str, path: Path | str) -> None:
    """One-line RunRecordError when the record read from ``path`` is of another run than
    ``run_id`` (:func:`other_runs_record`): a file copied from another run's folder would
    otherwise be resumed or served as this run's."""
    fact = other_runs_record(record, run_id, path)
    if fact is not None:
        raise RunRecordError(f"{fact}: {force_hint()}")


# How to point at a run's data folder when its files differ (``audit`` has its --data-dir).
FOLDER_FIX = "point data.data_dir at the run's data"


def check_same_data(record: RunRecord, identity: DataIdentity, path: Path | str, *,
                    folder_fix: str = FOLDER_FIX, audit: bool = False) -> None:
    """One-line RunRecordError when the data loaded now is not the data the run trained on:
    another fingerprint (files or generator arguments), or — the fingerprint equal — other
    arrays (``identity``: of the data loaded, :meth:`~creditaudit.run.plan.RunPlan.data_identity`).
    A record from before array digests is checked by its fingerprint only, said in one
    warning. ``folder_fix``: how the caller points at the run's data folder (``audit``
    has its ``--data-dir``); ``audit``: the caller audits the run (it neither serves nor
    trains it: a run of another default dtype is audited from Python)."""
    if record.data is None or not record.data.fingerprint:
        return  # records written before data fingerprints existed
    if record.data.fingerprint != identity.fingerprint:
        why, fix = data_change(record.data, identity, folder_fix=folder_fix)
        raise RunRecordError(
            f"{path}: the run trained on {record.data.name} data with fingerprint "
            f"{record.data.fingerprint[:12]}…, but the data found now has "
            f"{identity.fingerprint[:12]}… ({why}); {fix}")
    # a plugin's data that changed is its code's doing (a guest's failure names the guest)
    guest = DATASETS.guest(record.data.name)
    name = record.data.name if guest is None else guest.what
    recorded = record.data.provenance.get(CONTENT_DIGEST)
    found = identity.provenance.get(CONTENT_DIGEST)
    if recorded and found and recorded != found:
        raise RunRecordError(
            f"{path}: the run trained on {name} arrays with digest "
            f"{str(recorded)[:12]}…, but its generator now makes {str(found)[:12]}… from the "
            f"same arguments (another numpy or generator build?); rerun it with {FORCE}")
    arrays, loaded = record.data.arrays_sha256, identity.arrays_sha256
    if loaded is None:
        return  # nothing loaded yet: the caller checks again once it is
    if arrays is None:
        log.warning("%s: recorded before creditaudit kept the digest of the arrays a run "
                    "trains on, so the data was checked by its fingerprint only, not by its "
                    "content", path)
    elif arrays != loaded:
        held = record.model.dtype if record.model is not None else None
        default = str(torch.get_default_dtype()).removeprefix("torch.")
        if held in ("float32", "float64") and held != default:
            # features load in torch's default dtype: the caller's differs from the run's
            fix = (f"call torch.set_default_dtype(torch.{held}) first to serve or resume it, "
                   f"or train it again in {default} with {FORCE}")
            if audit and on_command_line():  # a command's torch is float32: Python audits it
                fix = (f"audit it from Python after torch.set_default_dtype(torch.{held}) "
                       "(creditaudit.audit.checkpoint.audit_run)")
            elif audit:
                fix = f"call torch.set_default_dtype(torch.{held}) first to audit it"
            raise RunRecordError(
                f"{path}: the run trained with torch's default dtype {held} (its features "
                f"and parameters), but this process has {default}, so its data loads as "
                f"other arrays; {fix}")
        raise RunRecordError(
            f"{path}: the data changed: {name} loads arrays with digest "
            f"{loaded[:12]}… now, but the run trained on {arrays[:12]}… (same fingerprint: "
            "a dataset whose load() gives other data each call, or files changed in place); "
            f"train it again on the data loaded now with {FORCE}, or restore the data it "
            "trained on")


def data_change(then: DataIdentity, now: DataIdentity, *, folder_fix: str = FOLDER_FIX
                ) -> tuple[str, str]:
    """(why, what to do) for data whose fingerprint (``now``'s) is not the fingerprint of
    the data a run trained on (``then``'s), said in one line: files that changed, or — a
    generated dataset, whose provenance holds its generator's ``args`` — a generator that
    makes other data from the same options (another version, other default arguments),
    which no data folder can bring back."""
    before, after = then.provenance, now.provenance
    if not isinstance(before.get("args"), dict):
        changed = changed_files(before, after)
        verb = "differs" if len(changed) == 1 else "differ"
        which = f": {', '.join(changed)} {verb}" if changed else ""
        return (f"the files changed or another folder holds other data{which}", folder_fix)
    args_then, args_now = before["args"], after.get("args")
    args_now = args_now if isinstance(args_now, dict) else {}
    differ = [f"{key} {before.get(key)!r} then, {after.get(key)!r} now"
              for key in ("generator", "version") if before.get(key) != after.get(key)]
    if changed := sorted(k for k in {*args_then, *args_now}
                         if args_then.get(k) != args_now.get(k)):
        differ.append(f"arguments {', '.join(map(str, changed))} differ")
    return (f"its generator makes other data from the same options now: "
            f"{'; '.join(differ) or 'another build of it'}",
            "use the generator version the run was trained with to rebuild it")


def check_same_code(record: RunRecord, guests: Mapping[str, Guest]) -> None:
    """One-line RunRecordError when the code that would rebuild ``record``'s run is not the
    code it trained with: a guest (``guests``: by the key of its component in the record's
    code block, ``method``, ``model``, ``data`` or ``diagnostic:NAME``) whose digest differs
    from the ``code_digest`` its record keeps (``environment.components``), or a component
    that ran a guest's code then and creditaudit's own now. A record from before code
    digests is rebuilt with its guests' code as it is now, said in one warning."""
    recorded = recorded_code_digests(record)
    unchecked = []
    for key, guest in guests.items():
        then = recorded.get(key)
        if then is None:
            unchecked.append(guest.what)
        elif then != guest.digest:
            raise RunRecordError(
                f"{record.run_id} was trained with other code of {guest.what} (code digest "
                f"{then[:12]}… then, {guest.digest[:12]}… now): restore the code the run "
                "was trained with to rebuild it, or train it again (the code as it is now "
                "is a new run)")
    for key, then in recorded.items():
        if key not in guests:
            raise RunRecordError(
                f"{record.run_id} ran outside code for its {key.replace(':', ' ')} (code "
                f"digest {then[:12]}…), but creditaudit's own code runs it now: install the "
                "code the run was trained with to rebuild it, or train it again")
    if unchecked:
        log.warning("%s: its record keeps no digest of the code of %s (it was written "
                    "before creditaudit kept them), so that code is rebuilt as it is now, "
                    "unchecked against the code the run trained with", record.run_id,
                    " and ".join(unchecked))


def check_installed(record: RunRecord) -> None:
    """One-line RunRecordError naming the plugin a component of ``record``'s run came from
    (``environment.components``: its ``origin``, ``dist==version``) when nothing installed
    here registers that component any more: the run can be rebuilt only with it (choosing
    another rule, architecture or dataset would be another run). A plugin installed but
    broken is left to its registry's own message."""
    components = record.environment.get("components")
    if not isinstance(components, dict):
        return  # a record from before the block: the registry's message says what is missing
    entries: list[tuple[Registry[Any], Any]] = [
        (RULES, components.get("method")), (ARCHITECTURES, components.get("model")),
        (DATASETS, components.get("data"))]
    diagnostics = components.get("diagnostics")
    if isinstance(diagnostics, list):
        entries += [(DIAGNOSTICS, entry) for entry in diagnostics]
    for registry, entry in entries:
        if not isinstance(entry, dict):
            continue
        name, origin = entry.get("name"), entry.get("origin")
        if not isinstance(name, str) or not isinstance(origin, str) or origin == "creditaudit":
            continue
        if registry.find(name) is None and name not in registry.broken():
            how = (f"pip install '{origin}'" if "?" not in origin
                   else "the package that registered it")
            raise RunRecordError(
                f"{record.run_id} was trained with the {registry.noun} {name!r} of the "
                f"plugin {origin}, which is not installed here: install it ({how}) to "
                "rebuild the run")


def recorded_code_digests(record: RunRecord) -> dict[str, str]:
    """The guests' code digests ``record`` keeps, by component key (``method``, ``model``,
    ``data``, ``diagnostic:NAME``); empty for a record from before digests (anything
    there that is not a digest is left out: the environment block is free-form)."""
    return code_digests(record.environment.get("components"))


def code_digests(components: Any) -> dict[str, str]:
    """The guests' code digests of a record's ``components`` block (a run plan's
    ``code.to_dict()``), by component key: see :func:`recorded_code_digests`."""
    if not isinstance(components, dict):
        return {}
    entries = [(axis, components.get(axis)) for axis in ("method", "model", "data")]
    diagnostics = components.get("diagnostics")
    if isinstance(diagnostics, list):
        entries += [(f"diagnostic:{d.get('name')}", d) for d in diagnostics
                    if isinstance(d, dict)]
    return {key: entry["code_digest"] for key, entry in entries
            if isinstance(entry, dict) and isinstance(entry.get("code_digest"), str)}


def check_same_question(recorded: RunConfig, config: RunConfig, path: Path | str) -> None:
    """One-line RunRecordError when resuming with ``config`` would change what the epochs
    still to come record but not the run id: an option of role ``"record"`` (such as
    ``diagnostics.frozen_acc``, the baseline of (d)) that differs from ``recorded``, the
    config every epoch so far used. A record's config is the config of all its epochs."""
    for key, (before, now) in differing_options(recorded, config, "record").items():
        raise RunRecordError(
            f"cannot resume {path} with {key}={now!r}: its epochs so far were recorded with "
            f"{key}={before!r}; resume with that value, or start the run over with {FORCE}")


def check_same_record(record: RunRecord, config: RunConfig, run_dir: Path | str) -> None:
    """One-line RunRecordError when the finished ``record`` would be served for ``config``
    though an option of role ``"record"`` differs (``diagnostics.frozen_acc``: the run id is
    the same, the record is not what ``config`` asks for): serving it would drop the value
    given now without a word."""
    differs = differing_options(record.config, config, "record")
    if not differs:
        return
    given = ", ".join(f"{key}={now!r}" for key, (_, now) in differs.items())
    kept = ", ".join(f"{key}={before!r}" for key, (before, _) in differs.items())
    frozen = differs.get("diagnostics.frozen_acc", (None, None))[1]
    audit = (f" (`creditaudit audit {run_dir} --frozen {frozen}` evaluates (d) against it)"
             if frozen is not None else "")
    raise RunRecordError(
        f"run {run_dir} already {record.status} with {kept}, which this command gives as "
        f"{given}: that changes what the run records, not its run id, so its record is not "
        f"served for it; give the recorded value, audit the finished run with yours{audit}, "
        f"or train it again with {FORCE}")


def differing_options(recorded: RunConfig, config: RunConfig, role: str
                      ) -> dict[str, tuple[Any, Any]]:
    """The options of ``role`` whose value in ``config`` differs from ``recorded``'s:
    dotted key → (recorded value, value now), in key order."""
    out = {}
    for section, key in sorted(keys_with_role(config, role)):
        before = getattr(getattr(recorded, section), key, None)
        now = getattr(getattr(config, section), key)
        if before != now:
            out[f"{section}.{key}"] = (before, now)
    return out


def resume_threads(record: RunRecord, config: RunConfig, path: Path | str) -> int | None:
    """The torch thread count resuming ``record`` with ``config`` trains on: the count its
    latest part ran on, which ``config`` may repeat (``run.threads``) or leave unset; the
    count ``config`` asks for when the record does not say (records written before the
    environment held it). One-line RunRecordError when ``config`` asks for another count:
    the run would go on adding up its sums in another order, and end with other last bits
    than the uninterrupted run."""
    recorded, asked = record.torch_threads, config.run.threads
    if recorded is None:
        return asked
    if asked is not None and asked != recorded:
        raise RunRecordError(
            f"cannot resume {path} with run.threads={asked}: its epochs so far ran on "
            f"{counted(recorded, 'torch thread')}, and another count adds up every sum in another "
            "order (other last bits than the uninterrupted run); resume without --threads "
            f"(it goes on with {recorded}) or with --threads {recorded}, or start the run "
            f"over with {FORCE}")
    return recorded


def changed_settings(recorded: RunConfig, config: RunConfig) -> dict[str, Any]:
    """The options of role ``place`` (device, threads, folders, loggers) of ``config``
    that differ from ``recorded`` (the config of the run's first part): dotted key →
    value, what a resumed part's record lists."""
    return {key: now for key, (_, now) in differing_options(recorded, config, "place").items()}


def saved_record(state: dict[str, Any], path: Path) -> RunRecord:
    """The record a checkpoint (``state``, read from ``path``) holds: its run as of its
    epoch."""
    return RunRecord.from_dict(state["record"], f"in checkpoint {path}")


def load_into(state: dict[str, Any], path: Path, config: RunConfig, *, saved: RunRecord,
              run_id: str, model: ResidualNet, rule: CreditRule,
              optimizer: torch.optim.Optimizer | None = None,
              scheduler: Any = None, generator: torch.Generator | None = None) -> None:
    """Check ``state`` (a :func:`~creditaudit.records.load_checkpoint` dict read from
    ``path``, holding the record ``saved``) against the run ``run_id``, then load it into
    ``model`` and ``rule`` — and, when given, ``optimizer``, ``scheduler``, the global torch
    RNG and the data-order ``generator``."""
    check_checkpoint_fits(state, model, rule, config, path, optimizer)
    # after the method and shape checks, which say more about a foreign file; a checkpoint
    # of another run with this run's shapes (another seed, lr, even model.residual) would
    # otherwise be resumed, audited or served as this run's
    check_same_run(saved, run_id, path)
    if scheduler is not None:
        expected, got = set(scheduler.state_dict()), set(state["scheduler"])
        if expected != got:  # torch's schedulers accept any dict silently
            raise RunRecordError(f"checkpoint {path} cannot be loaded into this run (its "
                                 f"schedule state has keys {sorted(got)}, expected "
                                 f"{sorted(expected)}); {force_hint()}")
    try:
        model.load_state_dict(state["model"])
        # the saved state fits the rule's own (checked above): a plugin's load_state_dict
        # that fails on it is its code's fault, named so, not a checkpoint "of another run"
        # whose --force would throw the run away
        with blame(RULES.guest(rule.name)):
            rule.load_state_dict(state["rule"])
        if optimizer is not None:
            optimizer.load_state_dict(state["optimizer"])
        if scheduler is not None:
            scheduler.load_state_dict(state["scheduler"])
        if generator is not None:
            restore_rng_states(state["rng"], model, generator)
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as err:
        reason = (str(err).splitlines() or [type(err).__name__])[0][:160]
        raise RunRecordError(f"checkpoint {path} cannot be loaded into this run "
                             f"({type(err).__name__}: {reason}); {force_hint()}") from None
