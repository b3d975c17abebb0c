"""One run id is one run: copies of a run found in several folders below a results folder.

Two experiments written under one parent share runs (the same config, data and code give
the same run id), and a run copied or trained again elsewhere leaves a second
``record.json`` of the same id. Readers of a folder (report, figures, export, the frozen
baseline of (d)) count each run once:

- copies whose results are the same (every logged number, the final results, the
  end-of-run block and the protocol state; wall-clock times, timestamps, the environment
  and the output folder aside) are one run, read from the first path;
- copies that differ where exactly one is finished (completed or diverged: an interrupted
  or running copy beside its finished run) are the finished one;
- copies that differ otherwise (two finished runs with other numbers: another device,
  another version of creditaudit) are left out, both named: no reader picks one of two
  answers for the researcher.

A run of a user's own loop (``Recorder``) may have a name its user gave for its id, which
says nothing of what ran (and what its user's loop did unrecorded, a seed, may differ):
records of such runs that share an id but differ are different runs, and each is counted;
only identical copies are counted once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from creditaudit.files import strict_json
from creditaudit.records.reading import FINISHED
from creditaudit.records.schema import RunRecord
from creditaudit.registry import ARCHITECTURES

# What a copy may differ in and still be the same run: when and where it ran (the output
# folder is in the config, which the run id already covers).
_NOT_RESULTS = ("config", "created", "updated", "environment", "resumed")
_ENTRY_NOT_RESULTS = ("seconds",)


def results_text(record: RunRecord) -> str:
    """The record's results as one canonical text (strict JSON: NaN compares equal to
    NaN), without what :data:`_NOT_RESULTS` names."""
    raw: dict[str, Any] = {k: v for k, v in record.to_dict(stored=True).items()
                           if k not in _NOT_RESULTS}
    raw["log"] = [{k: v for k, v in entry.items() if k not in _ENTRY_NOT_RESULTS}
                  for entry in raw["log"]]
    return strict_json.dumps(raw, indent=None)


@dataclass(frozen=True)
class Copies:
    """The copies of one run id found below a folder, and which one is read."""

    run_id: str
    paths: tuple[Path, ...]  # every copy's record.json, in the order found
    kept: Path | None  # the copy read; None: they differ and none is chosen
    differ: bool  # whether their results differ
    statuses: tuple[str, ...]  # each copy's status, in the order of ``paths``

    def text(self) -> str:
        """The one line that says what was done with them."""
        where = ", ".join(f"{_folder(p)} ({s})" if self.differ else str(_folder(p))
                          for p, s in zip(self.paths, self.statuses))
        n = len(self.paths)
        if not self.differ:
            return f"{n} copies of run {self.run_id}: counted once ({where})"
        if self.kept is not None:
            others = ", ".join(f"{_folder(p)} ({s})" for p, s in zip(self.paths, self.statuses)
                               if p != self.kept)
            status = self.statuses[self.paths.index(self.kept)]
            return (f"{n} copies of run {self.run_id} differ: counted the finished one, "
                    f"{_folder(self.kept)} ({status}), not {others}")
        finished = sum(s in FINISHED for s in self.statuses)
        return (f"{n} copies of run {self.run_id} differ and {finished or 'none'} of them "
                f"{'is' if finished == 1 else 'are'} finished, so none is counted ({where}): "
                "keep the copy you mean and move the others out, or report each folder "
                "on its own")


def _folder(path: Path) -> Path:
    return path.parent


def distinct_runs(found: Sequence[tuple[Path, RunRecord]]
                  ) -> tuple[list[tuple[Path, RunRecord]], list[Copies]]:
    """``found`` (path, record) with one entry per run id, in the order found, and the
    :class:`Copies` of every run id found more than once (the module docstring says which
    copy is read)."""
    by_id: dict[str, list[tuple[Path, RunRecord]]] = {}
    for path, record in found:
        by_id.setdefault(record.run_id, []).append((path, record))
    kept: set[Path] = set()
    copies: list[Copies] = []
    for run_id, group in by_id.items():
        texts = [results_text(record) for _, record in group] if len(group) > 1 else []
        if len(set(texts)) > 1 and any(_named_by_user(r) for _, r in group):
            # runs of users' loops that share only a name: one run per distinct record
            first = {text: path for (path, _), text in reversed(list(zip(group, texts)))}
            kept.update(first.values())
            continue
        if len(group) == 1:
            kept.add(group[0][0])
            continue
        differ = len(set(texts)) > 1
        choice: Path | None = group[0][0]
        if differ:
            finished = {text for text, (_, r) in zip(texts, group) if r.status in FINISHED}
            choice = (next(p for (p, r), t in zip(group, texts) if t in finished)
                      if len(finished) == 1 else None)
        if choice is not None:
            kept.add(choice)
        copies.append(Copies(run_id, tuple(p for p, _ in group), choice, differ,
                             tuple(r.status for _, r in group)))
    return [(p, r) for p, r in found if p in kept], copies


def _named_by_user(record: RunRecord) -> bool:
    """Whether the record's id may be a name its user gave, not an id computed from what
    ran: a run of an architecture creditaudit only describes (``unbuildable``: a network
    trained in its user's own loop and recorded by a ``Recorder``)."""
    arch = ARCHITECTURES.find(record.config.model.arch)
    return arch is not None and bool(arch.unbuildable)


__all__ = ["Copies", "distinct_runs", "results_text"]
