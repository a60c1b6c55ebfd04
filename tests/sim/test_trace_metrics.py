"""Trace files and the metrics computed from them."""

import pandas as pd
import pytest

from staleness_sim import Trace, simulate, summarize
from staleness_sim.core.metrics import SUMMARY_KEYS, time_to_updates
from staleness_sim.core.trace import JOB_COLUMNS, TraceError


@pytest.fixture
def trace(make_scenario):
    return simulate(
        make_scenario(
            workers=12,
            policy={"kind": "bounded", "max_lag": 0, "on_stale": "drop"},
            update_seconds=0.05,
            sync_seconds=0.02,
            **{"job.duration": {"dist": "lomax", "shape": 1.5, "scale": 1.0}},
        )
    )


def test_metrics_from_the_trace_equal_the_engines_own_counters(trace):
    c = trace.meta["counters"]
    s = summarize(trace)
    assert s["results_accepted"] == c["accepted"] == 50 * 8
    assert s["results_discarded"] == c["discarded"] > 0
    assert s["jobs_completed"] == c["accepted"] + c["discarded"] + c["deferred"]
    assert s["jobs_cancelled"] == c["cancelled"]
    total = 12 * s["wall_clock_s"]
    assert s["worker_idle_fraction"] == pytest.approx(c["idle_s"] / total)
    assert s["worker_busy_fraction"] == pytest.approx(c["busy_s"] / total)
    assert s["worker_sync_fraction"] == pytest.approx(c["syncing_s"] / total)
    assert s["worker_idle_fraction"] + s["worker_busy_fraction"] + s[
        "worker_sync_fraction"
    ] == pytest.approx(1)


def test_summary_has_every_contract_key_and_consistent_values(trace):
    s = summarize(trace)
    assert set(SUMMARY_KEYS) <= set(s)
    assert sum(s["lag_hist"].values()) == s["results_accepted"]
    assert s["data_utilization"] == pytest.approx(s["results_accepted"] / s["jobs_completed"])
    assert s["updates_per_hour"] == pytest.approx(50 / s["wall_clock_s"] * 3600)
    assert s["max_lag"] == 0 and s["stale_fraction"] == 0
    assert sum(s["discarded_lag_hist"].values()) == s["results_discarded"]
    assert min(s["discarded_lag_hist"]) >= 1


def test_hand_made_trace_metrics():
    # two workers over 10 s; job lags 0, 0, 1, 2 accepted; one discarded
    jobs = pd.DataFrame(
        {
            "job_id": range(5),
            "worker": [0, 1, 0, 1, 0],
            "seed": range(5),
            "dispatch_version": [0, 0, 0, 0, 0],
            "dispatch_time": [0.0] * 5,
            "start_time": [0.0] * 5,
            "end_time": [1.0] * 5,
            "completion_version": [0, 0, 1, 2, 3],
            "verdict": ["accepted", "accepted", "accepted", "accepted", "discarded"],
            "lag": [0, 0, 1, 2, 3],
            "reward": [1.0, 0.0, 1.0, 1.0, None],
        }
    )
    updates = pd.DataFrame(
        {
            "version": [1, 2],
            "time": [4.0, 10.0],
            "cohort_size": [2, 2],
            "mean_lag": [0, 1.5],
            "max_lag": [0, 2],
        }
    )
    workers = pd.DataFrame(
        {
            "worker": [0, 0, 1, 1],
            "state": ["busy", "idle", "busy", "syncing"],
            "start": [0, 6, 0, 9],
            "end": [6, 10, 9, 10],
        }
    )
    s = summarize(Trace(jobs, updates, workers))
    assert s["wall_clock_s"] == 10
    assert s["worker_idle_fraction"] == pytest.approx(4 / 20)
    assert s["stale_fraction"] == pytest.approx(2 / 4)
    assert s["mean_lag"] == pytest.approx(3 / 4)
    assert s["lag_hist"] == {0: 2, 1: 1, 2: 1}
    assert s["data_utilization"] == pytest.approx(4 / 5)
    assert s["results_per_hour"] == pytest.approx(4 * 360)
    assert s["mean_reward"] == pytest.approx(3 / 4)
    assert time_to_updates(Trace(jobs, updates, workers), 2) == 10.0


def test_parquet_round_trip_and_csv_input(trace, tmp_path):
    trace.write(tmp_path / "run")
    back = Trace.read(tmp_path / "run")
    pd.testing.assert_frame_equal(back.jobs, trace.jobs)
    assert summarize(back) == summarize(trace)
    assert list(pd.read_parquet(tmp_path / "run" / "jobs.parquet").columns) == list(JOB_COLUMNS)
    csv = tmp_path / "csv"
    csv.mkdir()
    for name in ("jobs", "updates", "workers"):
        getattr(trace, name).to_csv(csv / f"{name}.csv", index=False)
    assert summarize(Trace.read(csv))["results_accepted"] == summarize(trace)["results_accepted"]


def test_bad_traces_are_named(trace, tmp_path):
    with pytest.raises(TraceError, match="no such trace folder"):
        Trace.read(tmp_path / "missing")
    trace.write(tmp_path / "t")
    (tmp_path / "t" / "workers.parquet").unlink()
    with pytest.raises(TraceError, match="missing workers.parquet"):
        Trace.read(tmp_path / "t")
    broken = Trace(trace.jobs.drop(columns=["lag"]), trace.updates, trace.workers)
    with pytest.raises(TraceError, match="lacks column.*lag"):
        broken.check()
    odd = trace.jobs.copy()
    odd.loc[0, "verdict"] = "maybe"
    with pytest.raises(TraceError, match="unknown value"):
        Trace(odd, trace.updates, trace.workers).check()
