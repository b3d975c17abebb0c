"""What readers ask of a run record: its epochs, its headline numbers, its protocol.

:class:`RecordAccessors` holds the read-only accessors of
:class:`~creditaudit.records.schema.RunRecord` (``final_acc``, ``deep_cos``, ``series``,
``first_fired``, …): readers never index the JSON, so a change of layout is made here.
The headline numbers of a diverged run are read at its last epoch whose evaluation was
finite (:attr:`RecordAccessors.numbers_epoch`), never at the epoch that overflowed; every
number of a row is of that one epoch, so a measure it did not take (``diagnostics.every`` >
1) is None — not measured — rather than an earlier epoch's.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from creditaudit.deep_layers import deep_mean
from creditaudit.descriptions import BELOW_FLOOR, EpochMeasures, deep_invalid
from creditaudit.descriptions.fields import as_number, finite_number
from creditaudit.records.parts import EpochEntry

if TYPE_CHECKING:
    from creditaudit.records.run_parts import EndOfRun, FinalResults, ProtocolState


class RecordAccessors:
    """The accessors of a run record's numbers (a base of RunRecord, which holds the
    fields they read: ``log``, ``final``, ``status``, ``diagnostics``, ``protocol``)."""

    if TYPE_CHECKING:
        log: list[EpochEntry]
        final: FinalResults | None
        status: str
        diagnostics: EndOfRun
        protocol: ProtocolState

    # --- epochs -----------------------------------------------------------------------------
    def last_measures(self) -> EpochMeasures | None:
        """The diagnostics of the last epoch that measured them."""
        return next((e.measures for e in reversed(self.log) if e.has_diagnostics), None)

    @property
    def numbers_epoch(self) -> int | None:
        """The epoch whose entry holds the headline numbers: the final results' (a diverged
        run's are those of its last epoch whose evaluation was finite), else the last
        logged one; None where there are none (no epoch logged; a diverged run with no
        finite evaluation)."""
        final = self.final
        if final is None:
            return self.log[-1].epoch if self.log else None
        if self.status == "diverged" and final.test_acc is None:
            return None
        return final.epochs_completed if final.from_epoch is None else final.from_epoch

    @property
    def numbers_finite(self) -> bool:
        """Whether the evaluation of :attr:`numbers_epoch` was finite (False where there is
        none; a test loss not recorded says nothing against it): a diverged run's record
        written before ``final.from_epoch`` existed may hold the numbers of the epoch that
        overflowed."""
        entry = self.headline_entry()
        return entry is not None and (entry.test_loss is None or math.isfinite(entry.test_loss))

    def headline_entries(self) -> list[EpochEntry]:
        """The log up to :attr:`numbers_epoch`: what is shown beside the headline numbers
        (a diverged run's overflowed epoch is not)."""
        epoch = self.numbers_epoch
        return [] if epoch is None else [e for e in self.log if e.epoch <= epoch]

    def headline_entry(self) -> EpochEntry | None:
        """The entry of :attr:`numbers_epoch`, which holds every headline number."""
        epoch = self.numbers_epoch
        return None if epoch is None else self.entry(epoch)

    def headline_measures(self) -> EpochMeasures | None:
        """The diagnostics of :attr:`numbers_epoch`; None where that epoch took none (an
        epoch between ``diagnostics.every``'s: an earlier epoch's are of another network)."""
        entry = self.headline_entry()
        return None if entry is None else entry.measures

    def headline_value(self, key: str) -> Any:
        """Per-epoch ``key`` at :attr:`numbers_epoch` (None where that epoch lacks it)."""
        entry = self.headline_entry()
        return None if entry is None else entry.value(key)

    def headline_end_of_run(self) -> EndOfRun | None:
        """The end-of-run block where it measured the network of :attr:`numbers_epoch`: a
        diverged run's measured the network it diverged with (trained past that epoch), so
        none of its numbers is a headline number."""
        return None if self.status == "diverged" else self.diagnostics

    def last_value(self, key: str) -> Any:
        """The last non-None value of per-epoch ``key`` (a field or a rule extra)."""
        for entry in reversed(self.log):
            value = entry.value(key)
            if value is not None:
                return value
        return None

    def series(self, key: str, index: int | None = None) -> tuple[list[int], list[float]]:
        """(epochs, values) of per-epoch ``key`` (``value[index]`` for per-layer lists);
        missing values are skipped, non-numbers read as NaN."""
        epochs, values = [], []
        for entry in self.log:
            value = entry.value(key)
            if value is None:
                continue
            if index is not None:
                if not isinstance(value, list) or not -len(value) <= index < len(value):
                    continue
                value = value[index]
            number = as_number(value)
            epochs.append(entry.epoch)
            values.append(math.nan if number is None else number)
        return epochs, values

    def entry(self, epoch: int) -> EpochEntry | None:
        return next((e for e in reversed(self.log) if e.epoch == epoch), None)

    # --- headline numbers -------------------------------------------------------------------
    @property
    def final_acc(self) -> float | None:
        """Headline test accuracy: the final results' (None for a diverged run with no
        finite epoch: the overflowed network's share of one class is no accuracy), else the
        last logged epoch's (unfinished runs)."""
        if self.final is not None:
            return finite_number(self.final.test_acc)
        return finite_number(self.last_value("acc_eval"))

    @property
    def deep_cos(self) -> float | None:
        """Deep cosine (mean over l ≥ 1): end of run (:meth:`headline_end_of_run`), else
        that of :attr:`numbers_epoch` (None where it took no diagnostics)."""
        end = self.headline_end_of_run()
        for value in (end.deep_cos if end else None,
                      self.final.deep_cos if self.final else None):
            if finite_number(value) is not None:
                return float(value)  # type: ignore[arg-type]
        last = self.headline_measures()
        return None if last is None else last.deep_cos

    @property
    def deep_cos_valid(self) -> bool | None:
        """Whether the deep cosine is a valid measurement: finite credits and reference
        gradients, the references at or above the floor (None: not recorded)."""
        reasons = self.deep_cos_invalid
        return None if reasons is None else not reasons

    @property
    def deep_cos_invalid(self) -> tuple[str, ...] | None:
        """Why the deep cosine is not valid (the ``cos_invalid`` reasons at the deep states,
        most fundamental first; () when it is; None: not recorded): end of run, else at
        :attr:`numbers_epoch`. End-of-run rows from before ``cos_invalid`` say only whether
        the reference was at the floor."""
        end = self.headline_end_of_run()
        table = end.cosine_table if end else None
        if table:
            return deep_invalid([row.get("cos_invalid") if "cos_invalid" in row
                                 else None if row.get("valid_reference") else BELOW_FLOOR
                                 for row in table])
        last = self.headline_measures()
        return None if last is None else last.deep_cos_invalid

    @property
    def deep_cos_coverage(self) -> float | None:
        """The smallest fraction of samples a deep state's cosine averages over (below 1:
        some credits or gradients are exactly zero); end of run, else at the numbers' epoch; None
        for records that predate the field."""
        end = self.headline_end_of_run()
        table = end.cosine_table if end else None
        if table:
            shares = [row.get("defined") for row in table]
        else:
            last = self.headline_measures()
            shares = (last.cos_defined or []) if last else []
        kept = [v for v in (finite_number(x) for x in shares[1:]) if v is not None]
        return min(kept) if kept else None

    @property
    def headline_gamma(self) -> float | None:
        """Headline Γ (samples then layers): end of run, else the cosines of :attr:`numbers_epoch`
        averaged over layers (the same aggregation)."""
        end = self.headline_end_of_run()
        gamma = (end.gamma if end else None) or {}
        value = finite_number(gamma.get("samples_then_layers"))
        if value is not None:
            return value
        last = self.headline_measures()
        kept = [v for v in (finite_number(x) for x in last.cos_per_layer)
                if v is not None] if last else []
        return sum(kept) / len(kept) if kept else None

    @property
    def deep_rho(self) -> float | None:
        return finite_number(deep_mean(self.diagnostics.perturbation_rho))

    def nudging_at(self, eta: str | None = None) -> list[float] | None:
        """Nudging Δ per deep state at step ``eta`` (default: the smallest recorded)."""
        nudging = self.diagnostics.nudging or {}
        if not nudging:
            return None
        key = eta if eta is not None else min(nudging, key=float)
        return nudging.get(key)

    # --- protocol ---------------------------------------------------------------------------
    def recorded_statuses(self) -> dict[str, str]:
        """Diagnostic id → status at the run's last training-time protocol evaluation."""
        diagnostics = (self.protocol.report or {}).get("diagnostics") or {}
        if diagnostics:
            return {i: d["status"] for i, d in diagnostics.items()
                    if isinstance(d, dict) and "status" in d}
        for entry in reversed(self.log):
            if entry.protocol:
                return dict(entry.protocol)
        return {}

    def recorded_value(self, diagnostic: str) -> float | None:
        """The statistic of ``diagnostic`` at the run's last protocol evaluation."""
        diagnostics = (self.protocol.report or {}).get("diagnostics") or {}
        return as_number((diagnostics.get(diagnostic) or {}).get("value"))

    def first_fired(self) -> dict[str, int | None]:
        """First epoch each recorded diagnostic fired during training (None = never)."""
        out: dict[str, int | None] = {}
        for entry in self.log:
            for i, status in (entry.protocol or {}).items():
                out.setdefault(i, None)
                if out[i] is None and status == "fired":
                    out[i] = entry.epoch
        for i, epoch in self.protocol.first_fired.items():
            if out.get(i) is None:
                out[i] = None if epoch is None else int(epoch)
        return out
