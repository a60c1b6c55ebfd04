"""Live metrics (``logging:``): a real run's scalars read back with TensorBoard's own reader,
checked against the trace; a killed and resumed run logs every update once; a missing
tracker package is one line at start."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np
import pandas as pd
import pytest
from runner_invariants import journal

from runner import cli as runner_cli
from tests.runner.conftest import REPO, cli

REQUIRED = (
    "train/reward_mean",
    "train/reward_std",
    "staleness/mean_lag",
    "staleness/stale_share",
    "workers/idle_fraction",
    "time/verifier_s",
)


def metrics(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def tensorboard_scalars(run):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


@pytest.mark.parametrize("sink,package", [("tensorboard", "tensorboard"), ("wandb", "wandb"),
                                          ("mlflow", "mlflow")])  # fmt: skip
def test_a_missing_tracker_package_is_one_line_at_start(
    sink, package, run_config, tmp_path, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, package, None)  # `import package` now fails
    out = tmp_path / "never"
    config = run_config(**{"logging": {"to": ["jsonl", sink]}})
    assert runner_cli.main(["train", str(config), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"'{package}' package" in err and "logging.to" in err
    assert not out.exists()  # refused before the run directory was made


def test_a_bad_logging_block_is_refused_in_one_line(run_config, tmp_path, capsys):
    config = run_config(**{"logging": {"to": ["jsonl", "csv"]}})
    assert runner_cli.main(["train", str(config), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "logging.to.1" in err and "'tensorboard'" in err


def window_fractions(workers: pd.DataFrame, t0: float, t1: float, g: int) -> dict[str, float]:
    """Each state's share of the workers' time in (t0, t1], from workers.parquet."""
    lo = np.maximum(workers["start"], t0)
    hi = np.minimum(workers["end"], t1)
    spent = (hi - lo).clip(lower=0).groupby(workers["state"]).sum()
    return {s: spent.get(s, 0.0) / (g * (t1 - t0)) for s in ("busy", "idle", "syncing")}


@pytest.mark.docker
def test_a_run_writes_its_scalars_to_jsonl_and_tensorboard(engine, run_config, tmp_path):
    out = tmp_path / "tracked"
    config = run_config(**{"eval_every": 2, "logging": {"to": ["jsonl", "tensorboard"]}})
    assert runner_cli.main(["train", str(config), "--out", str(out), "--no-progress"]) == 0
    lines = metrics(out)
    ups = [m for m in lines if "train/reward_mean" in m]
    evals = [m for m in lines if "eval/success" in m]
    assert [m["step"] for m in ups] == [1, 2]
    assert sorted(m["step"] for m in evals) == [0, 2]
    # the values, against the trace tables computed here
    updates = pd.read_parquet(out / "updates.parquet")
    jobs = pd.read_parquet(out / "jobs.parquet")
    workers = pd.read_parquet(out / "workers.parquet")
    episodes = pd.read_parquet(out / "episodes.parquet")
    commits = {e["version"]: e["jobs"] for e in journal(out) if e["e"] == "commit"}
    times = [0.0, *updates["commit_time"]]
    for m, row in zip(ups, updates.itertuples(), strict=True):
        assert set(REQUIRED) <= set(m)
        members = jobs.set_index("job_id").loc[commits[row.version]]
        assert m["train/reward_mean"] == pytest.approx(members["reward"].mean())
        assert m["train/reward_std"] == pytest.approx(members["reward"].std(ddof=0))
        assert m["staleness/mean_lag"] == pytest.approx(row.mean_lag)
        used = members[members["verdict"] == "accepted"]
        assert m["staleness/stale_share"] == pytest.approx((used["lag"] > 0).mean())
        assert m["results/accepted"] == len(used) == 2
        t0, t1 = times[row.version - 1], times[row.version]
        share = window_fractions(workers, t0, t1, 2)
        assert m["workers/idle_fraction"] == pytest.approx(share["idle"], abs=1e-9)
        assert m["workers/sync_fraction"] == pytest.approx(share["syncing"], abs=1e-9)
        landed = jobs[(jobs["end_time"] > t0) & (jobs["end_time"] <= t1)]
        landed = landed[landed["verdict"] != "cancelled"]
        eps = episodes[episodes["job_id"].isin(landed["job_id"])]
        assert len(eps) > 0
        assert m["time/verifier_s"] == pytest.approx(eps["verify_s"].sum())
        assert m["time/generation_s"] == pytest.approx(eps["generation_s"].sum())
        assert m["throughput/episodes_per_min"] == pytest.approx(60 * len(eps) / (t1 - t0))
    ev = pd.read_parquet(out / "eval.parquet")
    for m in evals:
        rows = ev[ev["version"] == m["step"]]
        assert m["eval/success"] == pytest.approx(rows["passed"].mean())
        for cat, group in rows.groupby("category"):
            assert m[f"eval/success/{cat}"] == pytest.approx(group["passed"].mean())
    # TensorBoard's own reader sees the same scalars at the same steps
    acc = tensorboard_scalars(out)
    for name in REQUIRED:
        got = acc.Scalars(name)
        assert [s.step for s in got] == [1, 2]
        assert [s.value for s in got] == pytest.approx([m[name] for m in ups], rel=1e-6)
    assert sorted(s.step for s in acc.Scalars("eval/success")) == [0, 2]
    # the journal says what was logged: each update once
    assert [e["version"] for e in journal(out) if e["e"] == "logged"] == [1, 2]


@pytest.mark.docker
def test_a_killed_and_resumed_run_logs_every_update_once(engine, run_config, tmp_path):
    import subprocess

    run = tmp_path / "killed"
    config = run_config(**{"updates": 3, "logging": {"to": ["jsonl", "tensorboard"]}})
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner.cli", "train", str(config), "--out", str(run),
         "--no-progress"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 900  # a busy machine: the first update can take minutes
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if (run / "journal.jsonl").exists() and any(e["e"] == "logged" for e in journal(run)):
            break
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    before = [m["step"] for m in metrics(run)]
    assert before and before == sorted(set(before))
    done = cli("train", "--resume", str(run), "--no-progress")
    assert done.returncode == 0, done.stderr
    assert [m["step"] for m in metrics(run)] == [1, 2, 3]
    assert [e["version"] for e in journal(run) if e["e"] == "logged"] == [1, 2, 3]
    assert len(list((run / "tensorboard").iterdir())) == 2  # one event file per process
    steps = [s.step for s in tensorboard_scalars(run).Scalars("train/reward_mean")]
    assert steps == [1, 2, 3]
