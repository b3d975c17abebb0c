"""Auditing: a finished run rebuilt from its folder (:mod:`~creditaudit.audit.checkpoint`)
and any model diagnosed on a batch (:mod:`~creditaudit.audit.diagnose`).

::

    from creditaudit.audit import load_run, audit_run
    run = load_run("runs/dfa-resmlp-synthetic-s42-…")      # record, rule (model inside), data
    report = audit_run("runs/dfa-resmlp-synthetic-s42-…")  # a DiagnosticReport
"""

from __future__ import annotations

from creditaudit.audit.checkpoint import (
    LoadedRun,
    audit_run,
    frozen_accuracy,
    frozen_baseline_beside,
    load_run,
    rule_fields,
)

__all__ = ["LoadedRun", "audit_run", "frozen_accuracy", "frozen_baseline_beside", "load_run",
           "rule_fields"]
