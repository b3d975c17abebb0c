"""A set of run records read together: the frozen baseline of each recipe, verdicts with
diagnostic (d) evaluated against it, and the records that could not be read.

Diagnostic (d) compares a run's accuracy with the frozen-blocks baseline of the *same
recipe* (same data, model, optimiser and precision; :attr:`RunRecord.recipe_key`). Runs are
trained without ``diagnostics.frozen_acc``, so wherever the frozen-blocks runs of a recipe
are among the records, (d) is evaluated against their mean final accuracy — by default;
``use_frozen_runs=False`` keeps each record's own (d).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from creditaudit.errors import CreditAuditError
from creditaudit.protocol import DiagnosticReport
from creditaudit.records.files import load_records
from creditaudit.records.parts import Verdict
from creditaudit.records.schema import RunRecord


class RecordSet:
    """Records (with the paths they came from) plus the unreadable ones (path, reason)."""

    def __init__(self, records: Iterable[RunRecord], *, paths: Iterable[Path] | None = None,
                 skipped: Iterable[tuple[Path, str]] = (), root: Path | None = None,
                 use_frozen_runs: bool = True) -> None:
        self.records = list(records)
        self.paths = list(paths) if paths is not None else [Path(r.run_id)
                                                            for r in self.records]
        self.skipped = list(skipped)
        self.root = root
        self.use_frozen_runs = use_frozen_runs
        self._baselines: dict[str, tuple[float, int] | None] = {}

    @classmethod
    def from_folder(cls, root: str | Path, *, dataset: str | None = None,
                    use_frozen_runs: bool = True) -> RecordSet:
        """Every record below ``root`` (``dataset``: only runs on that dataset); unreadable
        records are named in one warning each and listed in ``skipped``."""
        root = Path(root)
        if not root.is_dir():
            raise CreditAuditError(f"results folder {root} does not exist: pass the folder "
                                   "your runs were written to (train/sweep --out)")
        good, bad = load_records(root)
        kept = [(p, r) for p, r in good if dataset is None or r.dataset == dataset]
        return cls([r for _, r in kept], paths=[p for p, _ in kept], skipped=bad, root=root,
                   use_frozen_runs=use_frozen_runs)

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self):  # noqa: ANN204 - an iterator of records
        return iter(self.records)

    @property
    def finished(self) -> list[RunRecord]:
        return [r for r in self.records if r.is_finished]

    def frozen_baseline(self, record: RunRecord) -> tuple[float, int] | None:
        """(mean final accuracy, number of runs) of the finished frozen-blocks runs of
        ``record``'s recipe, or None when there are none."""
        key = record.recipe_key
        if key not in self._baselines:
            accs = [r.final_acc for r in self.records
                    if r.is_frozen_baseline and r.is_finished and r.recipe_key == key
                    and r.final_acc is not None]
            self._baselines[key] = (sum(accs) / len(accs), len(accs)) if accs else None
        return self._baselines[key]

    def _baseline_for(self, record: RunRecord) -> tuple[float | None, int]:
        if not self.use_frozen_runs or record.is_frozen_baseline:
            return None, 0
        baseline = self.frozen_baseline(record)
        return (None, 0) if baseline is None else baseline

    def verdict(self, record: RunRecord) -> Verdict:
        """``record``'s verdict, (d) against its recipe's frozen runs when there are any."""
        frozen_acc, n = self._baseline_for(record)
        return record.verdict(frozen_acc, n)

    def protocol_report(self, record: RunRecord) -> DiagnosticReport | None:
        """``record``'s protocol report, (d) against its recipe's frozen runs if any."""
        frozen_acc, n = self._baseline_for(record)
        return record.protocol_report(frozen_acc, n)
