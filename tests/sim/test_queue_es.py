"""ES as a special case of the queue pipeline: an ES scenario written with groups of one job,
B = N, the update as the trainer's step and the cohort rule gives exactly the cohort
engine's results (summaries, job and update tables) on the published configs and around them."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from staleness_sim import load_scenario, simulate, summarize
from staleness_sim.config import validate, with_overrides
from staleness_sim.queue.config import es_as_queue
from staleness_sim.summary import policy_label, run_summary, simulate_scenario

SIM = Path(__file__).resolve().parents[2] / "configs" / "sim"
PUBLISHED = ["paper_sync", "paper_async1", "paper_async4", "paper_async8"]


def assert_same_run(es):
    cohort = simulate(es)
    queue_sc = validate(es_as_queue(es))
    queue = simulate_scenario(queue_sc)
    assert summarize(queue) == summarize(cohort)
    cols = list(cohort.jobs.columns)
    jobs = queue.jobs[cols].astype({"verdict": object, "reason": object})
    pd.testing.assert_frame_equal(jobs, cohort.jobs, check_dtype=False)
    pd.testing.assert_frame_equal(
        queue.updates[list(cohort.updates.columns)], cohort.updates, check_dtype=False
    )

    # worker time in each state, per worker (the queue trace may merge adjacent intervals)
    def per_state(t):
        w = t.workers.assign(d=t.workers.end - t.workers.start)
        return w.groupby(["worker", "state"]).d.sum()

    pd.testing.assert_series_equal(per_state(queue), per_state(cohort), rtol=1e-12)
    return queue_sc


@pytest.mark.parametrize("name", PUBLISHED)
def test_published_configs_give_the_cohort_engines_results(name):
    es = load_scenario(SIM / f"{name}.yaml")
    queue_sc = assert_same_run(es)
    assert policy_label(queue_sc) == policy_label(es)
    s = run_summary(queue_sc)
    assert s["m_tail"] == 1.0 and s["rho"] is None  # groups of one; updates take no time
    assert s["mean_staleness"] == s["mean_lag"]


def test_the_config_file_is_the_published_async1_run():
    written = load_scenario(SIM / "queue_es_async1.yaml")
    derived = validate(es_as_queue(load_scenario(SIM / "paper_async1.yaml")))
    assert written == derived


HEAVY = {"dist": "lomax", "shape": 1.5, "scale": 1.0}
BASE = {
    "name": "t",
    "seed": 1,
    "workers": 16,
    "cohort": 8,
    "updates": 40,
    "policy": {"kind": "unbounded"},
    "job": {"duration": HEAVY},
}
VARIANTS = [
    {"policy": {"kind": "sync"}, "update_seconds": 0.7},
    {"policy": {"kind": "unbounded"}, "sync_seconds": 0.3},
    {"policy": {"kind": "bounded", "max_lag": 1, "on_stale": "drop"}, "drain_every": 5},
    {"policy": {"kind": "bounded", "max_lag": 2, "on_stale": "pace"}, "update_seconds": 0.5},
    {"policy": {"kind": "bounded", "max_lag": 0, "on_stale": "cancel"}, "sync_seconds": 0.2},
    {"policy": {"kind": "controlled_delay", "fraction": 0.25, "delay": 3}, "workers": 3},
    {
        "policy": {"kind": "bounded", "max_lag": 1, "on_stale": "cancel"},
        "update_seconds": 0.5,
        "sync_seconds": 0.2,
        "workers": 3,
    },
]


@pytest.mark.parametrize("overrides", VARIANTS, ids=range(len(VARIANTS)))
def test_around_the_published_setting_update_and_sync_costs_and_every_policy(overrides):
    assert_same_run(validate(with_overrides(BASE, overrides)))


def test_update_time_becomes_the_trainers_busy_time():
    es = validate(with_overrides(BASE, {"policy": {"kind": "sync"}, "update_seconds": 0.7}))
    s = run_summary(validate(es_as_queue(es)))
    wall = s["wall_clock_s"]
    assert s["trainer_idle_fraction"] == pytest.approx(1 - 40 * 0.7 / wall)
    assert np.isfinite(s["rho"])
