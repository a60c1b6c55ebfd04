"""``placement: ray``: workers as Ray actors (a local Ray instance), real containers, tiny model.

Select with ``pytest -m ray tests/runner`` (``-m "ray and not slow"`` leaves out the
SIGKILL-and-resume test, the longest). The runs are the sizes of the other runner
tests (2 workers, cohort 2, 2-3 updates, 2 episodes per job, 2 turns of 12 tokens).

A random model solves nothing: every reward is 0 and every update is zero, so comparing
update logs would compare zeros. These tests therefore give each job a reward that
depends on its job id only (:func:`synthetic_rewards`, set in the orchestrator when the
result lands, in the episodes too, so the trace stays consistent), with a larger sigma
and alpha: the updates are real, the actors must replay them, and what an actor
generates depends on its perturbed, updated weights.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, cli
from runner_invariants import check_run, journal

from runner import cli as runner_cli
from runner.orchestrator import Orchestrator
from runner.terminal.reaper import LABEL_OWNER, LABEL_SANDBOX

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.docker, pytest.mark.ray]

REAL_UPDATES = {"es": {"sigma": 0.05, "alpha": 0.05}}


@pytest.fixture(scope="module")
def local_ray():
    """One small local Ray instance for the module (the runner uses an initialised Ray)."""
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


def train(*args: str) -> int:
    return runner_cli.main(["train", *args, "--no-progress"])


def reward_of(job: int) -> float:
    return ((job * 5) % 7) / 6  # distinct for any 7 consecutive jobs


@pytest.fixture
def synthetic_rewards(monkeypatch):
    original = Orchestrator._land

    def land(self, job, outcome):
        outcome.reward = reward_of(job)
        for e in outcome.episodes:
            e["reward"] = outcome.reward
        return original(self, job, outcome)

    monkeypatch.setattr(Orchestrator, "_land", land)


@pytest.fixture
def actor_hashes(monkeypatch):
    """(version, weights sha256) of every Ray actor, read just before it is closed."""
    from runner.workers.ray_driver import RayWorker

    seen: list[tuple[int, str]] = []
    original = RayWorker.close

    def close(self):
        if not self._dead:
            seen.append(tuple(ray.get(self.actor.weights_hash.remote())))
        return original(self)

    monkeypatch.setattr(RayWorker, "close", close)
    return seen


def sandboxes(engine, owner: str | None = None) -> list[str]:
    """Ids of sandbox containers (of ``owner``): one listing call, safe while they come and go."""
    found = engine.api.containers(all=True, filters={"label": f"{LABEL_SANDBOX}=1"})
    labels = {c["Id"]: c.get("Labels") or {} for c in found}
    return [i for i, lab in labels.items() if owner is None or lab.get(LABEL_OWNER) == owner]


def owned_by_pid(engine, pid: int) -> list[str]:
    found = engine.api.containers(all=True, filters={"label": f"{LABEL_SANDBOX}=1"})
    mine = f'"pid": {pid},'
    return [c["Id"] for c in found if mine in (c.get("Labels") or {}).get(LABEL_OWNER, "")]


def actor_pids(run: Path) -> list[int]:
    """The pids of the run's actors, from run.log (``worker i: Ray actor pid P on HOST``)."""
    pids = []
    for line in (run / "run.log").read_text().splitlines():
        if ": Ray actor pid " in line:
            pids.append(int(line.split(": Ray actor pid ")[1].split()[0]))
    return pids


# -- what the two placements must agree on -----------------------------------------------------


def dispatches(run: Path) -> dict[int, dict]:
    return {
        e["job"]: {k: e[k] for k in ("version", "seed", "sign", "sampling_seed", "tasks")}
        for e in journal(run)
        if e["e"] == "dispatch"
    }


def commits(run: Path) -> dict[int, dict]:
    """Each update: its cohort and its record, with entries in seed order (they are stored in
    landing order, which is timing; with two entries the sum does not depend on it)."""
    out = {}
    for e in journal(run):
        if e["e"] == "commit":
            record = dict(e["record"])
            record["entries"] = sorted(map(tuple, record["entries"]))
            record["lags"] = sorted(record["lags"])
            out[e["version"]] = {"jobs": sorted(e["jobs"]), "record": record}
    return out


def replies(run: Path) -> dict[tuple[int, int], list[str]]:
    """What the model said, per (job, episode)."""
    out = {}
    for line in (run / "transcripts.jsonl").read_text().splitlines():
        t = json.loads(line)
        out[t["job_id"], t["index"]] = [turn["assistant"] for turn in t["turns"]]
    return out


def check_episode_clock(run: Path) -> None:
    """Episode times (the actor's clock) lie within their job's run-time interval."""
    jobs = pd.read_parquet(run / "jobs.parquet").set_index("job_id")
    episodes = pd.read_parquet(run / "episodes.parquet")
    done = jobs.loc[episodes["job_id"]]
    assert (episodes["start_time"].to_numpy() >= done["start_time"].to_numpy()).all()
    assert (episodes["end_time"].to_numpy() <= done["end_time"].to_numpy()).all()
    assert (episodes["end_time"] > episodes["start_time"]).all()


def check_replays(run: Path, hashes: list[tuple[int, str]]) -> None:
    """Each actor's weights are, bit for bit, the base weights plus the log it was sent."""
    from runner.orchestrator import replay_log
    from runner.run_dir import RunDir
    from runner.workers import build_backend

    assert hashes and any(v > 0 for v, _ in hashes)  # some actor replayed real updates
    log = replay_log(RunDir.open(run))
    backend = build_backend(RunDir.open(run).config())
    for version, digest in sorted(hashes):
        backend.sync(log[:version])
        assert backend.weights_hash() == digest, version
    backend.close()


# -- the tests ------------------------------------------------------------------------------


def test_sync_run_on_ray_actors_equals_the_local_run(
    engine, local_ray, run_config, tmp_path, synthetic_rewards, actor_hashes
):
    config = run_config(**{"policy": {"kind": "sync"}, **REAL_UPDATES})
    local, remote = tmp_path / "local", tmp_path / "ray"
    assert train(str(config), "--out", str(local)) == 0
    assert train(str(config), "--out", str(remote), "--set", "placement=ray") == 0
    check_run(local, cohort=2, updates=2, workers=2, max_lag=0)
    trace, _ = check_run(remote, cohort=2, updates=2, workers=2, max_lag=0)
    assert not trace.updates["zero_update"].any()  # real updates, replayed by the actors
    check_episode_clock(remote)
    # Behind the barrier the schedule is deterministic: the same jobs at the same versions
    # with the same seeds and tasks, the same cohorts, the same update records...
    assert dispatches(remote) == dispatches(local)
    assert commits(remote) == commits(local)
    # ...and each actor generated exactly what the local worker did, after perturbing and
    # replaying the same (seed, coefficient) lists; the text does depend on the weights
    # (members of one version share tasks and sampling seeds, not their replies).
    said = replies(remote)
    assert said == replies(local)
    assert said[0, 0] != said[1, 0] or said[0, 1] != said[1, 1]
    check_replays(remote, actor_hashes)
    pids = actor_pids(remote)
    assert len(pids) == 2 and os.getpid() not in pids
    assert all(owned_by_pid(engine, pid) == [] for pid in [os.getpid(), *pids])


def test_bounded_run_on_ray_actors_agrees_with_local_where_it_is_deterministic(
    engine, local_ray, run_config, tmp_path, synthetic_rewards, actor_hashes
):
    config = run_config(
        **{"updates": 3, "policy": {"kind": "bounded", "max_lag": 1, "on_stale": "drop"}},
        **REAL_UPDATES,
    )
    local, remote = tmp_path / "local", tmp_path / "ray"
    assert train(str(config), "--out", str(local)) == 0
    assert train(str(config), "--out", str(remote), "--set", "placement=ray") == 0
    check_run(remote, cohort=2, updates=3, workers=2, max_lag=1)
    check_episode_clock(remote)
    check_replays(remote, actor_hashes)
    # Asynchronous: which job lands first (so cohorts, dispatch versions, and everything
    # after) is timing. Deterministic: a job id's seeds, a version's tasks and sampling
    # seed, and what a job generates given its version's update log.
    ray_d, local_d = dispatches(remote), dispatches(local)
    for job in ray_d.keys() & local_d.keys():
        assert (ray_d[job]["seed"], ray_d[job]["sign"]) == (
            local_d[job]["seed"],
            local_d[job]["sign"],
        )
    per_version = {}
    for d in (*ray_d.values(), *local_d.values()):
        per_version.setdefault(d["version"], set()).add((d["sampling_seed"], tuple(d["tasks"])))
    assert all(len(v) == 1 for v in per_version.values())
    ray_c, local_c = commits(remote), commits(local)
    same_log = 0  # versions up to which both runs committed the same updates
    while same_log + 1 in ray_c and ray_c.get(same_log + 1) == local_c.get(same_log + 1):
        same_log += 1
    ray_said, local_said = replies(remote), replies(local)
    compared = 0
    for (job, index), said in ray_said.items():
        same = job in local_d and ray_d[job]["version"] == local_d[job]["version"] <= same_log
        if same and (job, index) in local_said:
            assert said == local_said[job, index], (job, index)
            compared += 1
    assert compared >= 4  # at least both version-0 jobs, two episodes each
    assert all(owned_by_pid(engine, pid) == [] for pid in [os.getpid(), *actor_pids(remote)])


def test_a_killed_actor_is_restarted_and_its_job_cancelled(
    engine, local_ray, run_config, tmp_path, monkeypatch
):
    from runner.workers.ray_driver import RayWorker

    original = RayWorker.run_job
    killed: dict = {}

    def run_job(self, job, abort):
        if not killed and self.index == 1:
            killed.update(job=job.job_id, pid=self.pid, owner=self.owner)

            def kill(actor=self.actor, owner=self.owner):
                deadline = time.monotonic() + 60
                while not sandboxes(engine, owner) and time.monotonic() < deadline:
                    time.sleep(0.02)  # kill it with its episodes' containers running
                killed["containers"] = len(sandboxes(engine, owner))
                ray.kill(actor)

            threading.Thread(target=kill, daemon=True).start()
        return original(self, job, abort)

    monkeypatch.setattr(RayWorker, "run_job", run_job)
    out = tmp_path / "killed"
    config = run_config(**{"updates": 3, "policy": {"kind": "bounded", "max_lag": 1}})
    assert train(str(config), "--out", str(out), "--set", "placement=ray") == 0
    trace, _ = check_run(out, cohort=2, updates=3, workers=2, max_lag=1)
    row = trace.jobs.set_index("job_id").loc[killed["job"]]
    assert row["verdict"] == "cancelled"
    assert row["reason"].startswith(
        f"worker 1 crashed: WorkerDied: its Ray actor (pid {killed['pid']}) died: "
    )
    assert "ray.kill" in row["reason"]
    text = (out / "run.log").read_text()
    assert "worker 1 restarted" in text
    # a new actor (a new pid) answered as worker 1, its model loaded: until then worker 1
    # was syncing. (Whether it gets a job before this short run ends is timing: a new
    # actor takes seconds to start.)
    pids = actor_pids(out)
    assert len(pids) == 3 and pids[2] not in pids[:2]
    wk = trace.workers
    rebuild = wk[(wk.worker == 1) & (wk.state == "syncing") & (wk.start >= row["end_time"])]
    assert len(rebuild) >= 1 and rebuild["end"].iloc[0] > rebuild["start"].iloc[0]
    # the dead actor's containers were there when it was killed, and were removed
    assert killed["containers"] >= 1
    assert sandboxes(engine, killed["owner"]) == []
    assert all(owned_by_pid(engine, pid) == [] for pid in pids)


@pytest.mark.slow  # two es-runner processes, each starting its own Ray
def test_sigkill_of_a_ray_run_leaves_no_container_and_resumes(engine, run_config, tmp_path):
    """The CLI with its own local Ray: killed with SIGKILL while actors' episodes run."""
    import subprocess
    import sys

    run = tmp_path / "run"
    config = run_config(**{"policy": {"kind": "bounded", "max_lag": 1}})
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner.cli", "train", str(config), "--out", str(run),
         "--set", "placement=ray", "--no-progress"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 180
    pids: list[int] = []
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        pids = actor_pids(run) if (run / "run.log").exists() else []
        if len(pids) == 2 and any(owned_by_pid(engine, pid) for pid in pids):
            break
        time.sleep(0.05)
    left = sum(len(owned_by_pid(engine, pid)) for pid in pids)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert left >= 1
    # the actors notice the dead orchestrator, remove their containers and exit
    deadline = time.monotonic() + 30
    while any(owned_by_pid(engine, pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(owned_by_pid(engine, pid) == [] for pid in pids)
    resumed = cli("train", "--resume", str(run), "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    check_run(run, cohort=2, updates=2, workers=2, max_lag=1)
    segments = [e for e in journal(run) if e["e"] == "segment"]
    assert len(segments) == 2
    assert all(owned_by_pid(engine, pid) == [] for pid in actor_pids(run))
