"""Sweeps, reports and compare work on the queue pipeline unchanged."""

import json

import pandas as pd
import pytest

from staleness_sim.cli import compare_table
from staleness_sim.config import validate
from staleness_sim.summary import run_summary
from staleness_sim.sweeps.report import write_report
from staleness_sim.sweeps.run import run_sweep, summary_of_row

BASE = {
    "pipeline": "queue",
    "name": "qs",
    "updates": 30,
    "rollout": {"concurrency": 16, "group_size": 2, "sample": {"dist": "exponential", "mean": 1.0}},
    "trainer": {"batch": 8, "step": {"dist": "constant", "value": 0.5}},
    "queue": {"capacity": 1, "rule": "drop_oldest"},
}
SWEEP = {
    "name": "qs",
    "base": BASE,
    "grid": {
        "trainer.step.value": [0.25, 0.5, 1.0],
        "queue.capacity": [1, 2],
        "queue.rule": ["drop_oldest", "block"],
    },
    "seeds": [0, 1],
}


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("qs")
    return run_sweep(SWEEP, out, jobs=1, progress=False)


def test_rows_equal_run_json(swept):
    res = swept.results
    assert len(res) == 24 and res["rho"].notna().all()
    row = res.iloc[5]
    scenario = validate(json.loads(row["scenario"]))
    expected = json.loads(json.dumps(run_summary(scenario)))
    assert summary_of_row(row) == expected
    assert set(res["policy_kind"]) == {"drop_oldest", "block"}
    assert "drop_oldest(q=2)" in set(res["policy_label"])


def test_report_draws_the_queue_figure(swept):
    paths = write_report(swept.folder, formats=("md",))
    names = {p.name for p in paths}
    assert "queue_vs_rho.png" in names and "report.md" in names
    text = (swept.folder / "report" / "report.md").read_text()
    assert "trainer idle %" in text and "closed form" in text


def test_compare_puts_queue_and_cohort_scenarios_side_by_side():
    queue = validate(BASE)
    cohort = validate(
        {
            "workers": 4,
            "cohort": 4,
            "updates": 5,
            "policy": {"kind": "sync"},
            "job": {"duration": {"dist": "exponential", "mean": 1.0}},
        }
    )
    table = compare_table([queue, cohort])
    assert isinstance(table, pd.DataFrame) and list(table["G"]) == [16, 4]
    assert table["policy"].tolist() == ["drop_oldest(q=1)", "sync"]
