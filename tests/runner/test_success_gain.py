"""The gain in held-out success between two versions, and its standard error."""

from __future__ import annotations

import pandas as pd
import pytest


def test_success_gain_pairs_tasks_and_seeds_and_clusters_by_task():
    from runner.evaluation import success_gain

    # 3 tasks x 2 seeds. Per task, after - before averaged over seeds: a: (1-0 + 1-1)/2 = 0.5,
    # b: (0-0 + 1-0)/2 = 0.5, c: (0-1 + 0-0)/2 = -0.5 -> gain 1/6; sample std of
    # (0.5, 0.5, -0.5) is sqrt(1/3), so se = sqrt(1/3) / sqrt(3) = 1/3.
    passed = {("a", 1): (0, 1), ("a", 2): (1, 1), ("b", 1): (0, 0), ("b", 2): (0, 1),
              ("c", 1): (1, 0), ("c", 2): (0, 0)}  # fmt: skip
    rows = pd.DataFrame(
        [
            {"version": v, "split": "test", "task": t, "seed": s, "passed": bool(p[i])}
            for (t, s), p in passed.items()
            for i, v in enumerate((0, 10))
        ]  # fmt: skip
        + [{"version": 10, "split": "test", "task": "d", "seed": 1, "passed": True}]  # unpaired
    )
    got = success_gain(rows, 0, 10)
    assert got["tasks"] == 3 and got["episodes"] == 6
    assert got["gain"] == pytest.approx(1 / 6) and got["se"] == pytest.approx(1 / 3)
    assert got["z"] == pytest.approx(0.5)
