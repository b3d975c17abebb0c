"""The original study, built on the toolkit: the shipped experiments
(:mod:`creditaudit.study.experiments`), the paper's figures (:mod:`creditaudit.study.figures`)
and the export to the study's result-file layout (:mod:`creditaudit.study.export`).

The toolkit never imports this package (an import contract); only the command line does.
"""

from __future__ import annotations

import creditaudit.study.figures  # noqa: F401  (registers the paper's figures)
