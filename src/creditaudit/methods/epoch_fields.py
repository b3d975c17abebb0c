"""What a rule's ``end_epoch`` returned last, for a second call that ends the same epoch.

A rule whose per-epoch fields are means over the epoch's steps (EP's relaxation ratio, the
bridges' errors) hands them out at ``end_epoch`` and starts the next epoch's sums. A loop that
calls ``rule.end_epoch(n, N)`` itself (as it must without a
:class:`~creditaudit.run.recorder.Recorder`) and then ``rec.epoch(n)``, which ends the epoch
too, ends epoch n twice with no step in between: the second call must return epoch n's
fields, not those of an empty epoch (NaN everywhere, and a warm-up epoch recorded as none).
"""

from __future__ import annotations


class EndedEpoch:
    """The last epoch a rule ended and the fields it returned for it.

    Not part of the rule's ``state_dict``: a restored rule ends its next epoch afresh.
    """

    def __init__(self) -> None:
        self.epoch: int | None = None
        self.fields: dict[str, float] = {}

    def again(self, epoch: int, steps: float) -> dict[str, float] | None:
        """A copy of ``epoch``'s fields when it is the epoch ended last and ``steps`` (the
        steps the rule counted since) is 0; None when the epoch is one to end now."""
        if steps == 0 and self.epoch == epoch:
            return dict(self.fields)
        return None

    def keep(self, epoch: int, fields: dict[str, float]) -> dict[str, float]:
        """Remember ``fields`` as ``epoch``'s and return them."""
        self.epoch, self.fields = epoch, dict(fields)
        return fields
