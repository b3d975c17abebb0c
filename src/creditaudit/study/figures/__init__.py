"""The paper's figures (hero, temporal, penalty, λ sweep, summary, literature), drawn from
run records with the toolkit's figure helpers (:mod:`creditaudit.figures`). Importing this
package registers the first five with :func:`creditaudit.figures.render_all`; the literature
figure is drawn by its experiment."""

from __future__ import annotations

from creditaudit.figures import register_figures
from creditaudit.study.figures import hero, lambda_sweep, penalty, summary, temporal

register_figures(hero, temporal, penalty, lambda_sweep, summary)

__all__ = ["hero", "lambda_sweep", "penalty", "summary", "temporal"]
