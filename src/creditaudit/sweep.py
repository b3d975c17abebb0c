"""Sweeps: expand a grid of run configs and train them on a process pool or a Ray cluster.

The sweep file (TOML)
---------------------
::

    # [base]: a normal run config, same sections and keys as a config file (config.py).
    [base.data]
    n_train = 10000
    [base.optim]
    epochs = 20
    [base.run]
    out_dir = "runs/penalty_grid"

    # [grid]: dotted config keys → lists of values; the sweep is their cartesian product
    # (in file order). Quote the keys: "method.name" is one key, method.name a nested table
    # (both are accepted).
    [grid]
    "method.name" = ["bp", "fa", "dfa"]
    "method.penalty" = [0.0, 1e-3, 1e-2]
    "run.seed" = [42, 123, 456]

    # [[include]]: optional extra single runs, dotted overrides of [base].
    [[include]]
    "method.name" = "frozen"
    "run.seed" = 42

Every combination is validated with :func:`~creditaudit.config.apply_overrides`; a bad key
or value raises :class:`~creditaudit.errors.ConfigError` naming the combination. Runs with
the same run id (same semantic config) appear once.

Running
-------
Every run goes through :func:`run_one`, whichever executor calls it
(:class:`LocalExecutor`: spawned worker processes; :class:`RayExecutor`: one Ray task per run;
:class:`InlineExecutor`: this process). Before training, the worker *claims* the run by
creating ``OUT/RUN_ID/claim.json`` with ``O_CREAT | O_EXCL`` (pid, host, time, token), so two
sweeps — or two processes of one — never train the same run. The claim is refreshed (its
mtime) while the run trains and removed at the end. A claim whose process is gone (same host,
pid not alive) or whose mtime is older than ``stale_after`` seconds is broken and retaken.

A completed or diverged run is never rerun; an interrupted run (killed sweep) resumes from
its checkpoint; a failed run is skipped unless ``retry_failed``. A run that raises is
recorded as failed (record status ``failed`` plus ``error``) and the sweep goes on.
``OUT/sweep_log.jsonl`` is an append-only log of what each process did (start, end, skip,
busy, break_claim), one JSON object per line.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from creditaudit.config import RunConfig, apply_overrides, config_from_dict, semantic_dict
from creditaudit.errors import ConfigError, CreditAuditError, OutputError, RunRecordError
from creditaudit.run_ids import run_id as run_id_of
from creditaudit.safe_files import describe_os_error, ensure_folder

log = logging.getLogger(__name__)

CLAIM_FILE = "claim.json"
BREAK_LOCK_FILE = "claim.json.break"
SWEEP_LOG_FILE = "sweep_log.jsonl"
SUMMARY_FILE = "sweep_summary.json"
SUMMARY_SCHEMA = "creditaudit.sweep/1"
DEFAULT_STALE_AFTER = 900.0
# A claim file that is empty or unreadable is being written right now, unless it is older.
UNREADABLE_CLAIM_GRACE = 30.0
# A break lock left by a process that died while breaking a claim.
BREAK_LOCK_STALE = 60.0
FINISHED = ("completed", "diverged")
SWEEP_TABLES = ("base", "grid", "include")
RAY_MISSING = "the ray executor needs ray: pip install 'creditaudit[ray]'"

Outcome = dict[str, Any]


# --- the sweep file ---------------------------------------------------------------------
def flatten_keys(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"method": {"name": "fa"}, "run.seed": 1}`` → ``{"method.name": "fa", "run.seed": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_keys(value, f"{dotted}."))
        else:
            flat[dotted] = value
    return flat


def _describe(values: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in values.items())


def _section_fields() -> dict[str, list[str]]:
    import dataclasses

    from creditaudit.config import SECTION_TYPES

    return {name: [f.name for f in dataclasses.fields(cls)]
            for name, cls in SECTION_TYPES.items()}


def _with_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> RunConfig:
    """A validated config from nested ``raw`` sections plus dotted ``overrides``."""
    merged = {section: dict(values) for section, values in raw.items()}
    for key, value in overrides.items():
        section, _, name = key.partition(".")
        merged.setdefault(section, {})[name] = value
    return config_from_dict(merged)


def expand_grid(base: RunConfig | dict[str, Any], grid: dict[str, list[Any]],
                include: Iterable[dict[str, Any]] = ()) -> list[RunConfig]:
    """Every combination of ``grid`` applied to ``base``, then the ``include`` runs.

    ``base`` is a RunConfig or the nested sections of one (a ``[base]`` table may be
    incomplete on its own, e.g. ``data.name = "mnist"`` with the grid giving
    ``data.data_dir``). ``grid`` maps dotted keys (``"method.penalty"``) to non-empty
    lists; the product runs in key order, the last key fastest. Runs with an equal run id
    keep their first place. Raises ConfigError naming the key or the combination that is not
    a valid config.
    """
    raw = base.to_dict() if isinstance(base, RunConfig) else base
    grid = flatten_keys(grid)
    include = [flatten_keys(extra) for extra in include]
    fields = _section_fields()
    for key in [*grid, *(k for extra in include for k in extra)]:
        section, _, name = key.partition(".")
        if section not in fields or name not in fields[section]:
            allowed = (", ".join(f"{section}.{f}" for f in fields[section])
                       if section in fields else ", ".join(f"{s}.…" for s in fields))
            raise ConfigError(f"sweep key {key!r} is not a config field; allowed: {allowed}")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"grid key {key!r} must map to a non-empty list of values, got "
                              f"{values!r}; e.g. \"{key}\" = [{values!r}]")
    try:
        config_from_dict(raw)
        base_error = None
    except ConfigError as err:
        base_error = str(err)
    combos = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    n_grid = len(combos)
    combos += include
    configs: list[RunConfig] = []
    for index, overrides in enumerate(combos):
        try:
            configs.append(_with_overrides(raw, overrides))
        except ConfigError as err:
            if str(err) == base_error:  # the grid did not cause it
                raise ConfigError(f"[base]: {err}") from None
            where = "grid combination" if index < n_grid else "[[include]] run"
            raise ConfigError(f"{where} {{{_describe(overrides)}}} is not a valid run: "
                              f"{err}") from None
    return dedupe(configs)


@dataclass
class Sweep:
    """A parsed sweep file: the base config, the grid and the extra runs."""

    base: dict[str, Any] = field(default_factory=dict)  # nested sections of a run config
    grid: dict[str, list[Any]] = field(default_factory=dict)
    include: list[dict[str, Any]] = field(default_factory=list)
    source: str | None = None

    def configs(self, overrides: dict[str, Any] | None = None) -> list[RunConfig]:
        """The runs, with ``overrides`` (e.g. from the command line) applied to each."""
        configs = expand_grid(self.base, self.grid, self.include)
        if overrides:
            configs = dedupe([apply_overrides(c, overrides) for c in configs])
        return configs

    @property
    def grid_keys(self) -> list[str]:
        keys = list(self.grid)
        for extra in self.include:
            keys += [k for k in extra if k not in keys]
        return keys


def dedupe(configs: Iterable[RunConfig]) -> list[RunConfig]:
    """The first of each set of configs that compute the same thing on the same data folder,
    in order. (Without reading the data: the same data in two folders is deduplicated later,
    when both resolve to one run id and the second finds the first's run.)"""
    seen: set[str] = set()
    out = []
    for config in configs:
        key = json.dumps([semantic_dict(config), config.data.data_dir], sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(config)
    return out


def sweep_from_dict(raw: dict[str, Any], source: str | None = None) -> Sweep:
    """Validate the tables of a sweep file (see the module docstring)."""
    where = f"sweep file {source}" if source else "sweep"
    unknown = set(raw) - set(SWEEP_TABLES)
    if unknown:
        raise ConfigError(f"{where}: unknown table {sorted(unknown)[0]!r}; a sweep file holds "
                          "[base] (a run config), [grid] (dotted key = list of values) and "
                          "optional [[include]] tables")
    base = raw.get("base", {})
    if not isinstance(base, dict) or not all(isinstance(v, dict) for v in base.values()):
        raise ConfigError(f"{where}: [base] must hold run-config sections such as "
                          "[base.method] and [base.optim]")
    grid = raw.get("grid", {})
    if not isinstance(grid, dict):
        raise ConfigError(f"{where}: [grid] must be a table of dotted key = list of values")
    include = raw.get("include", [])
    if not isinstance(include, list) or not all(isinstance(t, dict) for t in include):
        raise ConfigError(f"{where}: include must be [[include]] tables of dotted overrides")
    return Sweep(base=base, grid=flatten_keys(grid),
                 include=[flatten_keys(t) for t in include], source=source)


def load_sweep(path: str | Path) -> Sweep:
    """Read and validate a sweep TOML file."""
    from creditaudit.config import tomllib
    from creditaudit.safe_files import read_text

    path = Path(path)
    try:
        raw = tomllib.loads(read_text(path, "sweep file", ConfigError))
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"sweep file {path} is not valid TOML: {err}") from None
    sweep = sweep_from_dict(raw, source=str(path))
    try:
        sweep.configs()  # validate every combination now, before anything runs
    except ConfigError as err:
        raise ConfigError(f"sweep file {path}: {err}") from None
    return sweep


def config_value(config: RunConfig | dict[str, Any], key: str) -> Any:
    """The value of a dotted key in a config (or its dict)."""
    raw = config.to_dict() if isinstance(config, RunConfig) else config
    section, _, name = key.partition(".")
    return raw.get(section, {}).get(name)


# --- claims ------------------------------------------------------------------------------
@dataclass
class Claim:
    """A held claim on one run folder."""

    path: Path
    token: str


def _process_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _read_claim(path: Path) -> tuple[dict[str, Any] | None, bytes | None, float | None]:
    """(parsed claim or None if unreadable, raw bytes, mtime); (None, None, None) if gone."""
    try:
        raw = path.read_bytes()
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        return None, None, None
    try:
        holder = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None, raw, mtime
    return (holder if isinstance(holder, dict) else None), raw, mtime


def claim_is_stale(holder: dict[str, Any] | None, age: float, stale_after: float) -> str | None:
    """Why a claim may be broken ("dead process", "stale"), or None while it holds.

    ``age`` is seconds since the claim file was last refreshed.
    """
    if holder is None:
        return "stale" if age > min(UNREADABLE_CLAIM_GRACE, stale_after) else None
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int) \
            and not _process_alive(holder["pid"]):
        return "dead process"
    if age > stale_after:
        return "stale"
    return None


def _break_claim(path: Path, seen: bytes | None, stale_after: float) -> bool:
    """Remove a stale claim if it is still the one we saw; True if the caller may retry.

    Breaking is serialised by a second O_EXCL lock file, so two processes that both saw the
    same stale claim cannot remove each other's fresh claim.
    """
    lock = path.with_name(BREAK_LOCK_FILE)
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        with contextlib.suppress(FileNotFoundError):
            if time.time() - lock.stat().st_mtime > BREAK_LOCK_STALE:
                lock.unlink()
        return False
    try:
        holder, raw, mtime = _read_claim(path)
        if raw is None:
            return True
        if raw == seen and claim_is_stale(holder, time.time() - mtime, stale_after):
            path.unlink()
            return True
        return False
    finally:
        os.close(fd)
        lock.unlink(missing_ok=True)


def try_claim(run_dir: Path, *, stale_after: float = DEFAULT_STALE_AFTER,
              events: Callable[..., None] | None = None
              ) -> tuple[Claim | None, dict[str, Any] | None]:
    """Atomically claim ``run_dir``: (claim, None), or (None, holder) if another holds it.

    ``holder`` is the other claim's content, None if that claim is still being written.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / CLAIM_FILE
    token = uuid.uuid4().hex
    body = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                       "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "unix_time": time.time(),
                       "token": token}).encode()
    holder: dict[str, Any] | None = None
    for _ in range(5):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder, raw, mtime = _read_claim(path)
            if raw is None:  # released between our open and our read
                continue
            reason = claim_is_stale(holder, time.time() - mtime, stale_after)
            if reason is None:
                return None, holder
            if _break_claim(path, raw, stale_after):
                if events is not None:
                    events("break_claim", reason=reason, holder=holder)
                log.warning("broke the %s claim on %s (%s)", reason, run_dir, holder)
                continue
            time.sleep(0.05)
            continue
        try:
            os.write(fd, body)
            os.fsync(fd)
        except OSError as err:  # full disk: no empty claim may block the run for others
            os.close(fd)
            path.unlink(missing_ok=True)
            raise OutputError(f"cannot write {describe_os_error(err, path)}") from None
        os.close(fd)
        return Claim(path, token), None
    return None, holder


def release_claim(claim: Claim) -> None:
    """Remove the claim file if it is still ours."""
    holder, _, _ = _read_claim(claim.path)
    if holder is not None and holder.get("token") == claim.token:
        claim.path.unlink(missing_ok=True)


@contextlib.contextmanager
def _heartbeat(claim: Claim, every: float) -> Iterator[None]:
    """Refresh the claim's mtime while a run trains, so long runs never look stale."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every):
            with contextlib.suppress(OSError):
                os.utime(claim.path)

    thread = threading.Thread(target=beat, name="creditaudit-claim-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


# --- one run -----------------------------------------------------------------------------
def _append_event(out_dir: Path, event: str, run_id: str, **fields: Any) -> None:
    """One line in OUT/sweep_log.jsonl (O_APPEND: concurrent writers do not interleave)."""
    line = json.dumps({"event": event, "run_id": run_id, "pid": os.getpid(),
                       "host": socket.gethostname(), "time": time.time(), **fields},
                      default=str) + "\n"
    path = out_dir / SWEEP_LOG_FILE
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_CREAT | os.O_APPEND | os.O_WRONLY, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError as err:
        raise OutputError(f"cannot write {describe_os_error(err, path)}") from None


def disk_status(run_dir: Path) -> tuple[str | None, str | None]:
    """(status, error) of the run record in ``run_dir``; (None, None) without one.

    An unreadable record reads as ("corrupt", reason).
    """
    from creditaudit.records import RECORD_FILE, load_record

    path = run_dir / RECORD_FILE
    if not path.exists():
        return None, None
    try:
        record = load_record(path)
    except RunRecordError as err:
        return "corrupt", str(err)
    return record.status, record.error


def _write_failed_record(config: RunConfig, run_dir: Path, error: str) -> None:
    """Record a run that raised before the training loop wrote its first record."""
    from creditaudit.records import new_record, save_record

    record = new_record(config, device=config.run.device)
    record.run_id = run_dir.name
    record.status = "failed"
    record.error = error
    save_record(run_dir, record)


def run_one(config_dict: dict[str, Any], *, run_id: str | None = None,
            retry_failed: bool = False, stale_after: float = DEFAULT_STALE_AFTER) -> Outcome:
    """Claim, train (or resume, or skip) one run and release it; never raises for the run.

    ``run_id`` is the id the sweep computed for this config: a worker whose creditaudit
    computes another id (a different version on a cluster node) refuses the run instead of
    writing it to another folder.

    Returns ``{"run_id", "status", "action", "error", "seconds", "pid", "host"}`` where
    status is the run's status afterwards (completed, diverged, failed, interrupted, busy)
    and action what this call did (trained, resumed, restarted, skipped, busy).
    """
    from creditaudit.records import CHECKPOINT_FILE
    from creditaudit.training import train

    started = time.perf_counter()
    outcome: Outcome = {"run_id": run_id, "status": None, "action": "skipped",
                        "error": None, "seconds": 0.0, "pid": os.getpid(),
                        "host": socket.gethostname()}
    try:
        config = config_from_dict(config_dict)
        own_id = run_id_of(config)
        if run_id is not None and own_id != run_id:
            raise ConfigError(f"this worker computes run id {own_id} for the run the sweep "
                              f"calls {run_id}: the sweep and its workers run different "
                              "creditaudit versions or see different data")
    except CreditAuditError as err:
        if run_id is None:
            raise
        outcome.update(status="failed", action="refused", error=f"{type(err).__name__}: {err}")
        return outcome
    outcome["run_id"] = own_id
    out_dir = Path(config.run.out_dir)
    run_dir = out_dir / own_id

    def event(name: str, **fields: Any) -> None:
        _append_event(out_dir, name, own_id, **fields)

    def skip_reason() -> bool:
        status, error = disk_status(run_dir)
        if status in FINISHED or (status == "failed" and not retry_failed):
            outcome.update(status=status, error=error, action="skipped")
            return True
        return False

    if skip_reason():
        return outcome
    claim, holder = try_claim(run_dir, stale_after=stale_after, events=event)
    if claim is None:
        event("busy", holder=holder)
        outcome.update(status="busy", action="busy", holder=holder)
        return outcome
    try:
        if skip_reason():  # finished by another process between our check and our claim
            event("skip", status=outcome["status"])
            return outcome
        status, reason = disk_status(run_dir)
        has_checkpoint = (run_dir / CHECKPOINT_FILE).exists()
        if status is None:
            action, kwargs = "trained", {"force": has_checkpoint}
        elif status in ("running", "interrupted", "failed") and has_checkpoint:
            action, kwargs = "resumed", {"resume": True}
        else:  # corrupt record, or died before its first checkpoint: start over
            action, kwargs = "restarted", {"force": True}
            if status == "corrupt":
                log.warning("warning: starting %s over: %s", own_id, reason)
        outcome["action"] = action
        event("start", action=action)
        try:
            with _heartbeat(claim, every=max(1.0, min(60.0, stale_after / 4))):
                result = train(config, **kwargs)
            outcome.update(status=result.status, error=result.record.error)
        except Exception as err:  # noqa: BLE001 — one failing run must not stop the sweep
            error = f"{type(err).__name__}: {err}"
            if disk_status(run_dir)[0] in (None, "running", "corrupt"):
                _write_failed_record(config, run_dir, error)
            outcome.update(status="failed", error=error)
            log.debug("run %s failed", own_id, exc_info=True)
        except KeyboardInterrupt:
            outcome.update(status="interrupted")
            event("end", status="interrupted")
            raise
        outcome["seconds"] = time.perf_counter() - started
        event("end", status=outcome["status"], seconds=outcome["seconds"],
              error=outcome["error"])
        return outcome
    finally:
        release_claim(claim)


# --- executors ---------------------------------------------------------------------------
RunFn = Callable[[dict[str, Any]], Outcome]


# Per worker process: set by SIGTERM/SIGINT, so a worker stops after its current run.
_WORKER = {"terminating": False, "in_run": False}


def _init_worker(threads: int) -> None:
    """Worker start-up: torch threads; SIGTERM/SIGINT interrupt the current run cleanly."""
    import signal

    import torch

    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(threads)

    def terminate(signum: int, frame: object) -> None:
        _WORKER["terminating"] = True
        if _WORKER["in_run"]:
            raise KeyboardInterrupt  # the run records 'interrupted', the claim is released
        raise SystemExit(0)  # idle: leave quietly

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    _watch_parent(os.getppid())


PARENT_POLL_SECONDS = 1.0
# After the parent died: how long an interrupted run may take to record 'interrupted' and
# release its claim before the worker leaves anyway.
UNWIND_SECONDS = 60.0


def _watch_parent(parent: int) -> None:
    """End this worker when the sweep process that started it dies (kill -9 leaves its
    workers orphaned: they are re-parented, so ``getppid()`` changes). The current run is
    interrupted (SIGTERM → KeyboardInterrupt): it records 'interrupted' and releases its
    claim, so the next sweep resumes it. Then the worker exits at once — waiting for the
    next task would wait forever, as nobody is left to send one, and a normal interpreter
    exit can hang joining the pool's queue threads."""
    import signal

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_SECONDS)
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + UNWIND_SECONDS
        time.sleep(0.1)  # let the handler run before reading in_run
        while _WORKER["in_run"] and time.monotonic() < deadline:
            time.sleep(0.1)
        os._exit(0)

    threading.Thread(target=watch, name="creditaudit-parent-watch", daemon=True).start()


def _interrupted(task: dict[str, Any]) -> Outcome:
    return {"run_id": task["run_id"], "status": "interrupted", "action": "interrupted",
            "error": None, "seconds": 0.0, "pid": os.getpid(), "host": socket.gethostname()}


def _pool_call(fn: RunFn, task: dict[str, Any]) -> Outcome:
    """A task in a LocalExecutor worker: after an interrupt, queued runs are not started."""
    if _WORKER["terminating"]:
        return _interrupted(task)
    _WORKER["in_run"] = True
    try:
        return fn(task)
    except KeyboardInterrupt:
        return _interrupted(task)
    finally:
        _WORKER["in_run"] = False


def _failed(task: dict[str, Any], error: str) -> Outcome:
    return {"run_id": task["run_id"], "status": "failed", "action": "trained",
            "error": error, "seconds": 0.0, "pid": None, "host": None}


def run_task(task: dict[str, Any], *, retry_failed: bool = False,
             stale_after: float = DEFAULT_STALE_AFTER) -> Outcome:
    """What an executor runs: ``task = {"config": config dict, "run_id": id}``."""
    return run_one(task["config"], run_id=task["run_id"], retry_failed=retry_failed,
                   stale_after=stale_after)


class InlineExecutor:
    """Runs one run after another in this process (debugging, benchmarks, tests)."""

    name = "inline"

    def __init__(self, threads: int | None = None) -> None:
        self.threads = threads
        self.slots = 1

    def map(self, fn: RunFn, tasks: list[dict[str, Any]]) -> Iterator[Outcome]:
        if self.threads is not None:
            import torch

            torch.set_num_threads(self.threads)
        for task in tasks:
            yield fn(task)


class LocalExecutor:
    """``workers`` spawned processes on this machine, each with ``threads_per_worker`` torch
    threads (workers × threads should not exceed the cores)."""

    name = "local"

    def __init__(self, workers: int | None = None, threads_per_worker: int = 1) -> None:
        workers = (os.cpu_count() or 1) if workers is None else workers
        if workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {workers}")
        if threads_per_worker < 1:
            raise ConfigError(f"--threads-per-worker must be >= 1, got {threads_per_worker}")
        self.workers, self.threads = workers, threads_per_worker
        self.slots = workers

    def map(self, fn: RunFn, tasks: list[dict[str, Any]]) -> Iterator[Outcome]:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed
        from concurrent.futures.process import BrokenProcessPool

        if not tasks:
            return
        pool = ProcessPoolExecutor(max_workers=min(self.workers, len(tasks)),
                                   mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_init_worker, initargs=(self.threads,))
        try:
            futures = {pool.submit(_pool_call, fn, task): task for task in tasks}
            for future in as_completed(futures):
                try:
                    yield future.result()
                except BrokenProcessPool as err:
                    yield _failed(futures[future], f"worker process died ({err}); the run "
                                                   "resumes from its checkpoint next time")
        except BaseException:
            # Interrupt the workers (SIGTERM → KeyboardInterrupt: they record 'interrupted'
            # and release their claims), drop what has not started.
            for process in list(getattr(pool, "_processes", {}).values()):
                with contextlib.suppress(Exception):
                    process.terminate()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)


def _call(fn: RunFn, task: dict[str, Any]) -> Outcome:
    """A Ray task body (Ray wraps functions, not partials)."""
    return fn(task)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(RAY_MISSING) from None
    return ray


class RayExecutor:
    """One Ray task per run, with ``num_cpus_per_run`` CPUs (= torch threads) and
    ``num_gpus_per_run`` GPUs each.

    ``address=None`` uses a running ``ray.init`` of this process, else starts a local Ray;
    ``"auto"`` joins the cluster started by ``ray start --head``. The results folder must be
    on a filesystem every node sees.
    """

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus_per_run: float = 1,
                 num_gpus_per_run: float = 0) -> None:
        self.ray = _import_ray()
        if num_cpus_per_run <= 0:
            raise ConfigError(f"CPUs per Ray run must be > 0, got {num_cpus_per_run}")
        if num_gpus_per_run < 0:
            raise ConfigError(f"GPUs per Ray run must be >= 0, got {num_gpus_per_run}")
        self.address = address
        self.num_cpus, self.num_gpus = num_cpus_per_run, num_gpus_per_run
        self.slots = 1

    def _connect(self) -> bool:
        """Initialise Ray if needed; True if this executor started it."""
        if self.ray.is_initialized():
            return False
        try:
            self.ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
        except (ConnectionError, ValueError, RuntimeError) as err:
            raise ConfigError(f"cannot connect to Ray at {self.address or 'a new local'} "
                              f"instance: {err}; start one with `ray start --head`") from None
        return True

    def map(self, fn: RunFn, tasks: list[dict[str, Any]]) -> Iterator[Outcome]:
        if not tasks:
            return
        ray = self.ray
        started = self._connect()
        try:
            total_cpus = ray.cluster_resources().get("CPU", 1)
            self.slots = max(1, int(total_cpus // self.num_cpus))
            remote = ray.remote(num_cpus=self.num_cpus, num_gpus=self.num_gpus,
                                max_retries=0)(_call)
            refs = {remote.remote(fn, task): task for task in tasks}
            try:
                while refs:
                    done, _ = ray.wait(list(refs), num_returns=1)
                    for ref in done:
                        task = refs.pop(ref)
                        try:
                            yield ray.get(ref)
                        except ray.exceptions.RayError as err:
                            yield _failed(task, f"Ray task failed: {str(err).splitlines()[0]}")
            except BaseException:
                for ref in refs:
                    with contextlib.suppress(Exception):
                        ray.cancel(ref)
                raise
        finally:
            if started:
                ray.shutdown()


Executor = InlineExecutor | LocalExecutor | RayExecutor


# --- the sweep ---------------------------------------------------------------------------
@dataclass
class SweepState:
    """Counts for the progress line: ``done`` (completed or diverged), ``failed``,
    ``interrupted`` (stopped by a signal; resumable), ``busy`` (claimed by another sweep)."""

    total: int
    done: int = 0
    failed: int = 0
    interrupted: int = 0
    busy: int = 0
    outstanding: int = 0
    slots: int = 1
    run_seconds: list[float] = field(default_factory=list)

    @property
    def running(self) -> int:
        return min(self.slots, self.outstanding)

    @property
    def left(self) -> int:
        return self.total - self.ended

    @property
    def ended(self) -> int:
        """Runs this sweep is finished with, whatever their status."""
        return self.done + self.failed + self.interrupted

    def count(self, status: str) -> None:
        """Count one run's end status (anything but completed/diverged/interrupted failed)."""
        if status in FINISHED:
            self.done += 1
        elif status == "interrupted":
            self.interrupted += 1
        else:
            self.failed += 1

    @property
    def eta_seconds(self) -> float | None:
        """Left runs × mean run time / parallel slots (None before the first trained run)."""
        if not self.run_seconds:
            return None
        mean = sum(self.run_seconds) / len(self.run_seconds)
        return mean * self.left / max(1, min(self.slots, self.left))


@dataclass
class SweepResult:
    """What a sweep did: one outcome per run (in sweep order) and the summary written."""

    outcomes: list[Outcome]
    summary: dict[str, Any]
    summary_path: Path


def prepare_configs(configs: list[RunConfig], *, threads: int | None) -> list[RunConfig]:
    """Absolute results folders (workers may start elsewhere), no per-run progress bars,
    and the executor's thread count; none of these change a run id."""
    out = []
    for config in configs:
        overrides: dict[str, Any] = {"run.out_dir": str(Path(config.run.out_dir).resolve()),
                                     "run.progress": False}
        if threads is not None:
            overrides["run.threads"] = threads
        out.append(apply_overrides(config, overrides))
    return out


def plan(configs: list[RunConfig], *, retry_failed: bool = False,
         stale_after: float = DEFAULT_STALE_AFTER) -> list[dict[str, Any]]:
    """What a sweep would do with each run now: ``{"run_id", "status", "todo", "holder"}``.

    ``status`` is the record's status (None: not started); ``holder`` the live claim, if any.
    """
    rows = []
    for config in configs:
        run_dir = Path(config.run.out_dir) / run_id_of(config)
        status, error = disk_status(run_dir)
        holder, raw, mtime = _read_claim(run_dir / CLAIM_FILE)
        live = raw is not None and claim_is_stale(holder, time.time() - mtime,
                                                  stale_after) is None
        todo = not (status in FINISHED or (status == "failed" and not retry_failed))
        rows.append({"run_id": run_dir.name, "status": status, "error": error, "todo": todo,
                     "holder": holder if live else None})
    return rows


def run_sweep(configs: list[RunConfig], executor: Executor, *, retry_failed: bool = False,
              stale_after: float = DEFAULT_STALE_AFTER, wait_for_others: bool = True,
              poll_seconds: float = 1.0, grid_keys: list[str] | None = None,
              on_progress: Callable[[SweepState, Outcome | None], None] | None = None,
              summary_extra: dict[str, Any] | None = None) -> SweepResult:
    """Run every config not finished yet; write ``OUT/sweep_summary.json``.

    Runs already completed or diverged (and failed ones unless ``retry_failed``) are
    skipped here without a worker. Runs another process holds are retried after the others
    until they are released (``wait_for_others``), or reported as busy.
    """
    import functools

    if not configs:
        raise ConfigError("the sweep has no runs")
    out_dirs = {config.run.out_dir for config in configs}
    if len(out_dirs) != 1:
        raise ConfigError(f"all runs of a sweep must share one results folder, got "
                          f"{sorted(out_dirs)}; set run.out_dir in [base] only, or --out")
    out_dir = Path(out_dirs.pop())
    ensure_folder(out_dir)  # a file in the way is one line before any worker starts
    if executor.name != "ray":  # runs train on this machine: a missing GPU is one error here,
        from creditaudit.training import resolve_device  # not a failed record per run

        for device in sorted({config.run.device for config in configs}):
            resolve_device(device)
    by_id = {run_id_of(config): config for config in configs}
    outcomes: dict[str, Outcome] = {}
    state = SweepState(total=len(configs), slots=executor.slots)

    def report(outcome: Outcome | None) -> None:
        if on_progress is not None:
            on_progress(state, outcome)

    todo = []
    for row in plan(configs, retry_failed=retry_failed, stale_after=stale_after):
        if row["todo"]:
            todo.append(row["run_id"])
            continue
        outcomes[row["run_id"]] = {"run_id": row["run_id"], "status": row["status"],
                                   "action": "skipped", "error": row["error"], "seconds": 0.0}
        state.count(row["status"])
    report(None)
    fn = functools.partial(run_task, retry_failed=retry_failed, stale_after=stale_after)
    while todo:
        state.outstanding, state.busy = len(todo), 0
        tasks = [{"config": by_id[run_id].to_dict(), "run_id": run_id} for run_id in todo]
        busy = []
        stream = executor.map(fn, tasks)
        state.slots = executor.slots
        report(None)
        for outcome in stream:
            state.slots = executor.slots
            state.outstanding -= 1
            outcomes[outcome["run_id"]] = outcome
            if outcome["status"] == "busy":
                busy.append(outcome["run_id"])
                state.busy += 1
            else:
                state.count(outcome["status"])
            if outcome["action"] in ("trained", "resumed", "restarted") \
                    and outcome["status"] in (*FINISHED, "failed"):
                state.run_seconds.append(outcome["seconds"])
            report(outcome)
        if not busy or not wait_for_others:
            break
        time.sleep(poll_seconds)
        todo = busy
    ordered = [outcomes.get(key, {"run_id": key, "status": None, "action": "not started",
                                  "error": None})
               for key in map(run_id_of, configs)]
    summary = sweep_summary(configs, ordered, grid_keys or [], extra=summary_extra)
    from creditaudit.records import atomic_write_json

    path = out_dir / SUMMARY_FILE
    atomic_write_json(path, summary)
    return SweepResult(ordered, summary, path)


def sweep_summary(configs: list[RunConfig], outcomes: list[Outcome], grid_keys: list[str],
                  *, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The content of sweep_summary.json: one entry per run, status read from its record."""
    runs = []
    counts: dict[str, int] = {}
    for config, outcome in zip(configs, outcomes):
        run_dir = Path(config.run.out_dir) / run_id_of(config)
        status, error = disk_status(run_dir)
        if outcome.get("status") == "busy" and status not in FINISHED:
            status = "busy"  # another process holds it right now
        status = status or outcome.get("status") or "not started"
        error = error if error is not None else outcome.get("error")
        counts[status] = counts.get(status, 0) + 1
        runs.append({"run_id": run_dir.name,
                     "grid": {key: config_value(config, key) for key in grid_keys},
                     "status": status, "error": error, "action": outcome.get("action"),
                     "seconds": round(float(outcome.get("seconds") or 0.0), 3),
                     "record": str(run_dir / "record.json")})
    return {"schema": SUMMARY_SCHEMA, "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "n_runs": len(runs), "counts": counts, **(extra or {}), "runs": runs}


__all__ = [
    "Sweep", "load_sweep", "sweep_from_dict", "expand_grid", "flatten_keys", "config_value",
    "run_one", "run_sweep", "plan", "prepare_configs", "LocalExecutor", "RayExecutor",
    "InlineExecutor", "try_claim", "release_claim", "claim_is_stale", "SweepState",
    "SweepResult",
]
