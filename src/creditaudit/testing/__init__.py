"""Public conformance suites, one per extension axis (like scikit-learn's
``check_estimator``): a plugin author runs the one of their axis on their class, and the
package's own tests run all four over every built-in.

- :func:`check_rule` / :func:`rule_checks` — credit rules (:mod:`.rules`);
- :func:`check_model` / :func:`model_checks` — architectures (:mod:`.models`);
- :func:`check_dataset` / :func:`dataset_checks` — datasets (:mod:`.datasets`);
- :func:`check_diagnostic` / :func:`diagnostic_checks` — protocol diagnostics
  (:mod:`.diagnostics`);
- :func:`check_module` / :func:`module_checks` — networks of the ``module`` architecture's
  factories (:mod:`.modules`).

The command line runs the checks that catch a lie on every plugin and outside factory the
first time a command uses it (:mod:`creditaudit.run.door`).

Each ``check_*`` raises one AssertionError listing every check that failed and returns a
:class:`Report` otherwise; each ``*_checks`` gives the checks one by one (:class:`Check`),
for one test per check. Each module's docstring lists its checks and why they matter. A check
a class fails by design is declared with its reason in ``expected_failures``
(:mod:`.common`).
"""

from creditaudit.testing.common import (
    ADAPTED_ARCHS,
    BATCH,
    BLOCKS,
    CLASSES,
    IMAGE,
    IN_DIM,
    TINY_ARCHS,
    WIDTH,
    Check,
    Outcome,
    Report,
    TinyArch,
    registered_tiny_arch,
    tiny_batch,
    tiny_model,
)
from creditaudit.testing.datasets import check_dataset, dataset_checks
from creditaudit.testing.diagnostics import check_diagnostic, diagnostic_checks
from creditaudit.testing.models import check_model, model_checks
from creditaudit.testing.modules import check_module, module_checks
from creditaudit.testing.rule_binding import make_rule
from creditaudit.testing.rules import CHECKS, check_rule, rule_checks

__all__ = ["check_rule", "rule_checks", "check_model", "model_checks", "check_dataset",
           "dataset_checks", "check_diagnostic", "diagnostic_checks", "check_module",
           "module_checks", "CHECKS", "Check",
           "Outcome", "Report", "TINY_ARCHS", "ADAPTED_ARCHS", "TinyArch", "registered_tiny_arch",
           "make_rule", "tiny_model", "tiny_batch", "BATCH", "BLOCKS", "CLASSES", "IMAGE",
           "IN_DIM", "WIDTH"]
