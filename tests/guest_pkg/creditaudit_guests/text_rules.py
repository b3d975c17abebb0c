"""Credit rules whose labels are text no figure may parse (tests/test_guest_text.py): a
guest's label is drawn as itself.

- ``text-math-label``: a label holding an invalid mathtext expression (``$\\frac$``), which
  stopped every figure that drew it;
- ``text-dollar-label``: a label with two dollar signs, whose middle was typeset as math;
- ``text-control-label``: a label with a line break and a terminal escape sequence;
- ``text-verdict-label``: a label that reads exactly like a verdict (``trustworthy``), which
  report.html coloured as one in the method cell.
"""

from creditaudit.methods.bp import BP


class MathLabel(BP):
    name = "text-math-label"
    label = r"BP $\frac$ | <b>x</b>"


class DollarLabel(BP):
    name = "text-dollar-label"
    label = "costs $5 or $6"


class ControlLabel(BP):
    name = "text-control-label"
    label = "BP\nrandom labels \x1b[31mred"


class VerdictLabel(BP):
    name = "text-verdict-label"
    label = "trustworthy"
