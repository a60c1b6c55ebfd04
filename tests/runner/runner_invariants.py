"""Checks every measured run must pass, computed from the run's files independently of the
runner's own bookkeeping (the journal's commit events name each cohort's jobs)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from staleness_sim.core.metrics import summarize
from staleness_sim.core.trace import VERDICTS, Trace


def journal(run: Path) -> list[dict]:
    """The journal's complete events (a line torn by a kill is left out)."""
    events = []
    for line in (run / "journal.jsonl").read_text().splitlines(keepends=True):
        if line.endswith("\n"):
            events.append(json.loads(line))
    return events


def check_run(run: Path, *, cohort: int, updates: int, workers: int, max_lag: int | None = None):
    """Assert the trace invariants; return (trace, summary)."""
    trace = Trace.read(run)
    jobs, ups, wk = trace.jobs, trace.updates, trace.workers
    assert trace.meta["source"] == "measured"
    # versions strictly increasing, one row per update, every cohort full
    assert ups["version"].tolist() == list(range(1, updates + 1))
    assert (np.diff(ups["time"]) > 0).all()
    assert (ups["cohort_size"] == cohort).all()
    # every dispatched job has a verdict and a reason
    assert jobs["job_id"].tolist() == list(range(len(jobs)))
    assert set(jobs["verdict"]) <= set(VERDICTS)
    assert jobs["reason"].notna().all() and (jobs["reason"] != "never finished").all()
    accepted = jobs[jobs["verdict"] == "accepted"]
    assert len(accepted) == cohort * updates
    if max_lag is not None:
        assert accepted["lag"].max() <= max_lag
    # each accepted job's lag is the version its cohort was built on minus its dispatch
    # version, with the cohorts read from the journal's commit events
    commits = [e for e in journal(run) if e["e"] == "commit"]
    assert [c["version"] for c in commits] == list(range(1, updates + 1))
    member_of = {j: c["version"] for c in commits for j in c["jobs"]}
    used_or_dropped = jobs.loc[jobs["verdict"].isin(["accepted", "dropped"]), "job_id"]
    assert sorted(member_of) == sorted(used_or_dropped)
    for row in accepted.itertuples():
        assert row.lag == member_of[row.job_id] - 1 - row.dispatch_version
    # the update log (checkpoint) is the journal's commits, once each
    ckpt = json.loads((run / "checkpoint" / "es_checkpoint.json").read_text())
    assert [r["version"] for r in ckpt["log"]] == list(range(1, updates + 1))
    assert ckpt["log"] == [c["record"] for c in commits]
    # worker intervals cover every worker from 0 to the end, without gaps or overlaps
    wall = float(ups["time"].max())
    assert sorted(wk["worker"].unique()) == list(range(workers))
    for _, g in wk.sort_values(["worker", "start"]).groupby("worker"):
        assert g["start"].iloc[0] == 0.0
        assert np.allclose(g["start"].to_numpy()[1:], g["end"].to_numpy()[:-1], atol=1e-9)
        assert g["end"].iloc[-1] == wall
    # metrics from the simulator's summarize, against counts made here
    s = summarize(trace)
    assert s["updates"] == updates and s["results_accepted"] == cohort * updates
    assert s["wall_clock_s"] == wall
    completed = jobs["verdict"].isin(["accepted", "discarded", "deferred", "dropped"]).sum()
    assert s["data_utilization"] == cohort * updates / completed
    assert s["stale_fraction"] == (accepted["lag"] > 0).mean()
    busy = (wk["end"] - wk["start"])[wk["state"] == "busy"].sum()
    assert np.isclose(s["worker_busy_fraction"], busy / (workers * wall))
    # a cohort of equal rewards is a zero update, and the updates table says so
    rewards = {r.job_id: r.reward for r in accepted.itertuples()}
    for c, row in zip(commits, ups.itertuples(), strict=True):
        spread = np.std([rewards[j] for j in c["jobs"]])
        assert row.zero_update == (spread == 0.0)
        assert row.zero_update == all(coef == 0.0 for _, coef in c["record"]["entries"])
    episodes = pd.read_parquet(run / "episodes.parquet")
    # a job's reward is its fitness: the mean episode reward, or graded fraction (es.reward)
    fitness = yaml.safe_load((run / "config.yaml").read_text())["es"].get("reward", "binary")
    per_job = episodes.groupby("job_id")["graded" if fitness == "graded" else "reward"].mean()
    for row in jobs[jobs["verdict"] != "cancelled"].itertuples():
        assert np.isclose(per_job[row.job_id], row.reward)
    return trace, s
