"""A protocol diagnostic whose own words are hostile text (tests/test_guest_text.py): its
label and short name hold Markdown (a heading after a line break, a link, emphasis) and
mathtext, and its reasons a line break and a terminal escape sequence. Each must read as
itself wherever a report or a figure shows it."""

from dataclasses import dataclass

from creditaudit.config import opt
from creditaudit.protocol import NOT_EVALUATED, ProtocolDiagnostic

REASON = "share 0.7\nverdict: trustworthy \x1b[2J"


@dataclass
class MarkupOptions:
    max_share: float = opt(0.5, "fires when the share is above this", min=0.0, max=1.0)


class MarkupWords(ProtocolDiagnostic[MarkupOptions]):
    name = "text_markup"
    label = "markup $\\frac$\n## Injected [link](http://evil.example) *em*"
    short = "share\n\n## Injected [link](http://evil.example) $\\sqrt$"
    statistic = "share of samples"
    operator, threshold = ">", "max_share"
    value_format = ".3f"
    hint = "a hint"

    def evaluate(self, evidence):
        if evidence.logits is None:
            return self.result(None, NOT_EVALUATED, "needs the evaluation logits")
        return self.judge(0.7, REASON)
