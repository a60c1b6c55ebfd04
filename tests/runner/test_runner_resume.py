"""Kill a real training process (SIGKILL, and Ctrl-C) and resume it; then evaluate it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, cli
from runner_invariants import check_run, journal

from runner.machine import cpu_model
from runner.terminal.reaper import LABEL_SANDBOX

pytestmark = pytest.mark.docker


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "runner.cli", "train", *args, "--no-progress"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for(run: Path, proc: subprocess.Popen, commits: int, running: bool, timeout=300):
    """Until the journal holds ``commits`` commits (and, if asked, a job in flight)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        events = journal(run) if (run / "journal.jsonl").exists() else []
        done = sum(e["e"] == "commit" for e in events)
        in_flight = {e["job"] for e in events if e["e"] == "run"} - {
            e["job"] for e in events if e["e"] in ("result", "cancel")
        }
        if done >= commits and (in_flight or not running):
            return events
        time.sleep(0.2)
    raise AssertionError("the run did not get there in time")


def containers_of(engine, pid: int) -> list:
    # a container removed between the listing and its inspection is gone: not an error
    found = engine.containers.list(
        all=True, filters={"label": f"{LABEL_SANDBOX}=1"}, ignore_removed=True
    )
    return [c for c in found if f'"pid": {pid},' in c.labels.get("es-runner.owner", "")]


@pytest.fixture(scope="module")
def resumed_run(engine, tmp_path_factory, tiny_model, task_dir):
    """A bounded-staleness run killed with SIGKILL mid-job, then resumed to the end."""
    import yaml

    tmp = tmp_path_factory.mktemp("resume")
    base = yaml.safe_load((REPO / "configs/runner/cpu_tiny.yaml").read_text())
    base.update(workers=2, cohort=2, updates=4, episodes_per_job=2, concurrency=2, max_turns=2)
    base.update(eval_every=0, tasks={"dir": str(task_dir), "split": "train"})
    base["model"]["path"] = str(tiny_model)
    base["sampling"]["max_new_tokens"] = 12
    base["eval"] = {"split": "test", "seeds": [42], "max_tasks": 2}
    config = tmp / "run.yaml"
    config.write_text(yaml.safe_dump(base))
    run = tmp / "run"
    proc = start(str(config), "--out", str(run))
    wait_for(run, proc, commits=1, running=True)
    deadline = time.monotonic() + 120
    while not containers_of(engine, proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # kill while episodes are live, so containers are left behind
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    before = journal(run)
    left = containers_of(engine, proc.pid)
    resumed = cli("train", "--resume", str(run), "--no-progress")
    return {
        "run": run,
        "before": before,
        "dead_pid": proc.pid,
        "left_at_kill": len(left),
        "resumed": resumed,
        "engine": engine,
    }


def test_sigkill_then_resume_loses_no_update_and_applies_none_twice(resumed_run):
    run, before = resumed_run["run"], resumed_run["before"]
    assert resumed_run["resumed"].returncode == 0, resumed_run["resumed"].stderr
    trace, _ = check_run(run, cohort=2, updates=4, workers=2, max_lag=1)
    events = journal(run)
    # the dead process's events are kept verbatim, the new process appended after them
    assert events[: len(before)] == before
    commits_before = [e for e in before if e["e"] == "commit"]
    commits = [e for e in events if e["e"] == "commit"]
    assert commits[: len(commits_before)] == commits_before
    segments = [e for e in events if e["e"] == "segment"]
    assert [s["n"] for s in segments] == [1, 2] and segments[1]["pid"] != segments[0]["pid"]
    # the jobs the dead process had in flight are cancelled with a reason, at its last moment
    dead = {e["job"] for e in before if e["e"] == "dispatch"} - {
        e["job"] for e in before if e["e"] in ("result", "cancel")
    }
    assert dead
    jobs = trace.jobs.set_index("job_id")
    for job in dead:
        assert jobs.loc[job, "verdict"] == "cancelled"
        assert jobs.loc[job, "reason"].startswith("resumed: the previous process stopped")
        # (its last timed event: the trackers' `logged` bookkeeping carries no time)
        last = max(e["t"] for e in before if "t" in e)
        assert jobs.loc[job, "end_time"] == pytest.approx(last)
    # versions continue and time is continuous across the two processes
    assert trace.updates["time"].is_monotonic_increasing
    assert len(trace.meta["segments"]) == 2
    # each process recorded the machine it ran on
    assert [s["machine"]["cpu"] for s in trace.meta["segments"]] == [cpu_model()] * 2
    # the killed process could not say how busy the machine was; the one that finished did
    first, second = trace.meta["segments"]
    assert "machine_busy_cores" not in first
    assert "process_busy_cores" not in first
    assert 0 < second["process_busy_cores"] <= second["machine_busy_cores"] + 0.1
    assert second["machine_busy_cores"] <= os.cpu_count()


def test_no_container_of_the_killed_process_is_left(resumed_run):
    assert resumed_run["left_at_kill"] >= 1  # the kill really left containers behind...
    assert containers_of(resumed_run["engine"], resumed_run["dead_pid"]) == []  # ...reaped


def test_update_log_replays_on_the_base_model(resumed_run, tiny_model):
    from runner.es import load_checkpoint
    from runner.models import load_tiny_model

    model, _ = load_tiny_model(tiny_model)
    opt = load_checkpoint(model, resumed_run["run"] / "checkpoint")
    assert opt.version == 4


def test_eval_command_writes_success_per_seed(resumed_run):
    run = resumed_run["run"]
    done = cli(
        "eval", str(run), "--split", "test", "--seeds", "42", "43", "--max-tasks", "2", "--json"
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    rows = pd.read_parquet(run / "eval.parquet")
    assert set(rows["seed"]) == {42, 43} and set(rows["version"]) == {4}
    per_seed = rows.groupby("seed")["reward"].mean()
    assert {int(k): v for k, v in result["per_seed"].items()} == per_seed.to_dict()
    assert result["success"] == pytest.approx(per_seed.mean())
    # an earlier version, added beside the first
    done = cli("eval", str(run), "--version", "0", "--seeds", "42", "--max-tasks", "2", "--json")
    assert done.returncode == 0, done.stderr
    assert set(pd.read_parquet(run / "eval.parquet")["version"]) == {0, 4}
    bad = cli("eval", str(run), "--version", "9")
    assert bad.returncode == 2 and "versions 0..4" in bad.stderr


def test_ctrl_c_stops_cleanly_and_the_run_resumes(engine, run_config, tmp_path):
    run = tmp_path / "interrupted"
    proc = start(str(run_config(updates=3)), "--out", str(run))
    wait_for(run, proc, commits=0, running=True)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    end = journal(run)[-1]
    assert end["e"] == "end" and end["reason"] == "interrupted (SIGINT)"
    assert containers_of(engine, proc.pid) == []
    jobs = pd.read_parquet(run / "jobs.parquet")  # the state was saved
    assert (jobs.loc[jobs.verdict == "cancelled", "reason"] == "interrupted (SIGINT)").any()
    done = cli("train", "--resume", str(run), "--no-progress")
    assert done.returncode == 0, done.stderr
    check_run(run, cohort=2, updates=3, workers=2, max_lag=1)
    again = cli("train", "--resume", str(run), "--no-progress")
    assert again.returncode == 0 and "already finished" in again.stdout
