"""The published reference values a summary quotes agree with science.md §7 and with the
arithmetic on them (a reader compares their own runs with these numbers)."""

from __future__ import annotations

import re

from creditaudit.study.experiments import get_experiment
from test_experiments import fake_record


def test_capacity_cost_quotes_the_penalty_cost_and_gap_of_the_published_2x2():
    experiment = get_experiment("capacity_cost")
    runs = [fake_record(method, 42, acc=acc, penalty=lam)
            for method, lam, acc in (("bp", 0.0, 0.5), ("bp", 1e-2, 0.45), ("dfa", 0.0, 0.3),
                                     ("dfa", 1e-2, 0.35), ("frozen", 0.0, 0.3))]
    markdown = experiment.to_markdown(experiment.summarise(runs))
    found = re.search(r"BP \.(\d{3}) → \.(\d{3}), DFA \.(\d{3}) → \.(\d{3}), frozen \.(\d{3}) "
                      r"\(BP penalty cost ([−+-][\d.]+) pp; gap ([\d.]+) pp", markdown)
    assert found, markdown
    bp0, bp1, dfa0, dfa1, frozen = (int(found.group(i)) / 1000 for i in range(1, 6))
    # science.md §7: BP .585 → .532 and DFA .301 → .360 with the penalty, frozen .349
    assert (bp0, bp1, dfa0, dfa1, frozen) == (0.585, 0.532, 0.301, 0.360, 0.349)
    assert float(found.group(6).replace("−", "-")) == round(100 * (bp1 - bp0), 1)  # −5.3
    assert round(float(found.group(7))) == round(100 * (bp1 - dfa1))  # 17
