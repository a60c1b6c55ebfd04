"""Real training runs: tiny model, real containers, the simulator's policy objects."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
from conftest import BROKEN_BUILD, BROKEN_LOAD
from runner_invariants import check_run, journal

from runner import cli as runner_cli
from runner.terminal.reaper import LABEL_SANDBOX
from staleness_sim.core import policies

pytestmark = pytest.mark.docker


def train(*args: str) -> int:
    return runner_cli.main(["train", *args, "--no-progress"])


def own_containers(engine) -> list:
    """Sandbox containers this test process still owns."""
    mine = f'"pid": {os.getpid()},'
    found = engine.containers.list(  # one removed between listing and inspecting is gone
        all=True, filters={"label": f"{LABEL_SANDBOX}=1"}, ignore_removed=True
    )
    return [c for c in found if mine in c.labels.get("es-runner.owner", "")]


def test_sync_run_drives_the_simulators_policy_and_skips_broken_tasks(
    engine, run_config, task_dir, tmp_path, monkeypatch
):
    # Spy on the simulator's own classes: a runner with its own policy copy never calls them.
    calls = {"on_idle": 0, "on_result": 0, "commit": 0}
    for name in calls:
        original = getattr(policies.Policy, name)

        def spy(self, *a, _name=name, _original=original):
            calls[_name] += 1
            return _original(self, *a)

        monkeypatch.setattr(policies.Policy, name, spy)
    out = tmp_path / "sync"
    config = run_config(**{"policy": {"kind": "sync"}, "eval_every": 2})
    assert train(str(config), "--out", str(out)) == 0
    trace, summary = check_run(out, cohort=2, updates=2, workers=2, max_lag=0)
    jobs = trace.jobs
    assert calls["commit"] == 2
    assert calls["on_result"] == int(jobs["verdict"].isin(["accepted", "discarded"]).sum())
    assert calls["on_idle"] >= len(jobs)
    # behind the barrier every result is fresh and nothing is discarded
    assert summary["stale_fraction"] == 0.0 and summary["results_discarded"] == 0
    assert (jobs.loc[jobs.verdict == "accepted", "dispatch_version"].value_counts() == 2).all()
    # the broken tasks were recorded and never drawn
    skipped = {s["task"]: s for s in json.loads((out / "tasks_skipped.json").read_text())}
    assert skipped[BROKEN_BUILD]["stage"] == "build"
    error = skipped[BROKEN_BUILD]["error"]  # one readable line: the exit code, the task's output
    assert "exited with code 3" in error and "this task cannot build" in error
    assert len(error) < 600 and "\n" not in error and "\x1b" not in error
    assert (
        skipped["broken_load"]["stage"] == "load" and "task.json" in skipped[BROKEN_LOAD]["error"]
    )
    episodes = pd.read_parquet(out / "episodes.parquet")
    assert not set(episodes["task_id"]) & {BROKEN_BUILD, BROKEN_LOAD}
    contract = ["job_id", "version", "task_id", "category", "reward", "turns", "tokens_in",
                "tokens_out", "generation_s", "container_s", "duration_s", "timed_out", "error"]  # fmt: skip
    assert list(episodes.columns[: len(contract)]) == contract
    assert (episodes["tokens_out"] > 0).all() and (episodes["turns"] >= 1).all()
    assert (episodes["generation_s"] > 0).all() and (episodes["container_s"] > 0).all()
    # per turn, for the turn model's fit: one entry a turn, adding up to the episode's
    for e in episodes.itertuples():
        assert len(e.turn_start) == len(e.turn_gen_s) == len(e.turn_tokens_out) == e.turns
        assert sum(e.turn_tokens_out) == e.tokens_out and sum(e.turn_tokens_in) == e.tokens_in
        assert abs(sum(e.turn_gen_s) - e.generation_s) < 1e-9
        assert e.start_time <= e.turn_start[0] and e.turn_start[-1] <= e.end_time
        assert list(e.turn_start) == sorted(e.turn_start)
    # common random numbers: members dispatched at one version share tasks and sampling seed
    for _, group in episodes.groupby("version"):
        per_job = group.sort_values("index").groupby("job_id")["task_id"].apply(tuple)
        assert per_job.nunique() == 1
    # evaluation during training: versions 0 and 2 on the test split
    ev = pd.read_parquet(out / "eval.parquet")
    assert sorted(ev["version"].unique()) == [0, 2]
    assert list(ev.columns[:5]) == ["version", "split", "seed", "task", "reward"]
    n_test = min(2, len((task_dir / "test.txt").read_text().split()))  # eval.max_tasks: 2
    assert (ev["split"] == "test").all() and len(ev) == 2 * n_test
    assert own_containers(engine) == []


def test_bounded_drop_run_and_crashed_worker_restarts(engine, run_config, tmp_path, monkeypatch):
    from runner.workers import LocalWorker

    original = LocalWorker.run_job
    crashed = []

    def flaky(self, job, abort, **kwargs):
        if not crashed and self.index == 1:
            crashed.append(job.job_id)
            raise RuntimeError("simulated backend crash")
        return original(self, job, abort, **kwargs)

    monkeypatch.setattr(LocalWorker, "run_job", flaky)
    out = tmp_path / "bounded"
    config = run_config(**{"updates": 3, "policy": {"kind": "bounded", "max_lag": 1}})
    assert train(str(config), "--out", str(out)) == 0
    trace, summary = check_run(out, cohort=2, updates=3, workers=2, max_lag=1)
    row = trace.jobs.set_index("job_id").loc[crashed[0]]
    assert row["verdict"] == "cancelled"
    assert row["reason"] == "worker 1 crashed: RuntimeError: simulated backend crash"
    assert "worker 1 restarted" in (out / "run.log").read_text()
    # the restarted worker ran later jobs
    assert (trace.jobs.loc[trace.jobs.job_id > crashed[0], "worker"] == 1).any()
    assert own_containers(engine) == []


def test_journal_replays_into_the_same_state(engine, run_config, tmp_path):
    from runner.run_dir import RunDir
    from runner.run_state import RunState

    out = tmp_path / "replay"
    assert train(str(run_config()), "--out", str(out)) == 0
    config = RunDir.open(out).config()
    state = RunState(config, config.es.update_rule())
    for ev in journal(out):
        state.replay(ev)
    assert state.version == 2 and state.finished
    replayed = state.trace({}).jobs
    written = pd.read_parquet(out / "jobs.parquet")
    pd.testing.assert_frame_equal(replayed, written, check_dtype=False)


def test_memo_answers_repeated_training_episodes(engine, run_config, tmp_path):
    """tasks.memo: members that share tasks and sampling seeds and barely differ in weights
    send the same commands; all but the first of each are answered without a container and
    get the verdict the first one's container gave."""
    out = tmp_path / "memo"
    config = run_config(
        **{"workers": 1, "cohort": 4, "updates": 1, "es.sigma": 1e-7, "tasks.memo": {"audit": 0}}
    )
    assert train(str(config), "--out", str(out)) == 0
    check_run(out, cohort=4, updates=1, workers=1, max_lag=0)
    episodes = pd.read_parquet(out / "episodes.parquet").sort_values(["job_id", "index"])
    first = episodes[episodes.job_id == episodes.job_id.min()]
    assert set(first["memo"]) <= {"miss", "hit"}  # a task drawn twice repeats its first
    later = episodes[episodes.job_id > episodes.job_id.min()]
    hits = later[later["memo"] == "hit"]
    assert len(hits) >= len(later) // 2 and (hits["sandbox_start_s"] == 0).all()
    verdicts = first.groupby("task_id")[["passed", "graded", "reward"]].first()
    for hit in hits.itertuples():
        assert (hit.passed, hit.graded, hit.reward) == tuple(verdicts.loc[hit.task_id])
    assert not episodes["memo_mismatch"].any()
    assert "training episodes' memo" in (out / "run.log").read_text()
