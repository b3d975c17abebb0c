"""What a sweep settles and checks before any run starts: its one results folder
(:func:`results_folder`), the settings every run of it trains with that no run id covers
(:func:`prepare_configs`: absolute folders, no per-run progress bars, one thread count, which
:func:`sweep_threads` decides), and the devices and loggers its runs ask for
(:func:`check_devices`, :func:`check_loggers`) — a one-line refusal before the sweep starts,
and in its dry run, rather than a failed record per run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from creditaudit.caller import OUT
from creditaudit.config import RunConfig, apply_overrides
from creditaudit.errors import ConfigError
from creditaudit.run.plan import RunPlan


def results_folder(plans: Sequence[RunPlan]) -> Path:
    """The one results folder of a sweep's runs (their plans); ConfigError when they name
    several (an ``[[include]]`` run with its own ``run.out_dir``)."""
    out_dirs = {plan.config.run.out_dir for plan in plans}
    if len(out_dirs) != 1:
        raise ConfigError(f"all runs of a sweep must share one results folder, got "
                          f"{sorted(out_dirs)}; set run.out_dir in [base] only, or {OUT}")
    return Path(out_dirs.pop())


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


# A sweep's torch threads per run when neither the command line nor the sweep file says.
DEFAULT_THREADS = 1


def sweep_threads(configs: Sequence[RunConfig], given: int | None, *,
                  set_by: str | None = None) -> tuple[int, str | None]:
    """(torch threads per run, a one-line warning or None) of a sweep of ``configs``:
    ``given`` (``--threads-per-worker``) when given, else the ``run.threads`` every run
    sets alike (the sweep file's), else :data:`DEFAULT_THREADS`. The warning names the
    ``run.threads`` not followed: one that ``given`` overrides, or one that only some runs
    set or that differs between runs (a sweep trains every run on one count). ``set_by``:
    where the runs' ``run.threads`` came from when not the sweep file (``CREDITAUDIT_SET``),
    as the warning names it. The count is no part of a run id: no choice here changes one."""
    asked = sorted({c.run.threads for c in configs if c.run.threads is not None})
    counts = ", ".join(map(str, asked))
    if given is not None:
        overridden = ", ".join(str(t) for t in asked if t != given)
        whose = f"{set_by}'s run.threads={overridden}" if set_by else \
            f"the sweep's run.threads = {overridden}"
        return given, (f"--threads-per-worker {given} overrides {whose}"
                       if overridden else None)
    if len(asked) == 1 and all(c.run.threads == asked[0] for c in configs):
        return asked[0], None
    if asked:
        return DEFAULT_THREADS, (f"the sweep's runs do not all set one run.threads (they "
                                 f"set {counts}): every run trains on {DEFAULT_THREADS} "
                                 "thread; set it in [base], or pass --threads-per-worker T")
    return DEFAULT_THREADS, None


def check_devices(plans: Sequence[RunPlan], executor: str) -> None:
    """ConfigError, in one line, when runs that train on this machine (every executor but
    ``ray``) ask for a device it lacks (``run.device='cuda'`` without a GPU): one error
    before the sweep starts, and in its dry run, not a failed record per run."""
    if executor == "ray":
        return
    from creditaudit.run.setup import resolve_device

    for device in sorted({plan.config.run.device for plan in plans}):
        resolve_device(device)


def check_loggers(plans: Sequence[RunPlan], executor: str) -> None:
    """ConfigError or OutputError, in one line, when runs that train on this machine (every
    executor but ``ray``, whose workers may have other packages and folders) ask for a logger
    that cannot start: its package missing (``run.wandb_project`` without wandb), its folder
    unusable (``run.tensorboard`` naming a file), a project name W&B refuses. As
    :func:`check_devices`: one error before the sweep starts, and in its dry run, not a
    failed record per run. The loggers are built and closed unstarted, which opens nothing
    (:func:`~creditaudit.loggers.build_loggers`)."""
    if executor == "ray":
        return
    from creditaudit.loggers import build_loggers

    for plan in plans:
        build_loggers(plan.config, plan.run_id, console=False).close()


__all__ = ["DEFAULT_THREADS", "check_devices", "check_loggers", "prepare_configs",
           "results_folder", "sweep_threads"]
