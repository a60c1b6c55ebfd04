"""A real Ctrl-C (SIGINT to the whole process group, as a terminal sends it) in the middle
of a parallel sweep: exit status 130, the finished batches stay on disk, and the re-run
simulates only what was missing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[2]


def test_ctrl_c_keeps_finished_batches_and_resume_completes(tmp_path, tiny_sweep, write_sweep):
    # 1,920 runs of about 10 ms in batches of 4: some 10 s of work on 2 cores, interrupted
    # early (with a quarter of the runs, a CI machine that stalled this test for 2 s once
    # let the sweep finish before the Ctrl-C came)
    runs = 1920
    sweep = tiny_sweep(
        set={"updates": 40},
        grid={"workers": [2, 3, 4, 6], "policy.max_lag": [0, 1, 2]},
        seeds=list(range(runs // 12)),
    )
    path = write_sweep(sweep)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "staleness_sim.cli", "sweep", str(path), "--out", str(out)]
    proc = subprocess.Popen(
        [*cmd, "--jobs", "2", "--batch", "4", "--no-progress"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, so we can signal the group
        # as from a terminal: a shell without job control starts background commands with
        # SIGINT ignored, and Python then leaves it ignored (CI run with `&`)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    # a generous wait: a loaded machine may take long to start the sweep; what is checked
    # is what the interrupt keeps, not how fast the sweep runs
    deadline = time.monotonic() + 600
    while (
        time.monotonic() < deadline
        and proc.poll() is None
        and len(list(out.glob("parts/part-*.parquet"))) < 3
    ):
        time.sleep(0.05)
    assert proc.poll() is None, "the sweep ended before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "staleness-sim: interrupted"
    assert not (out / "results.parquet").exists()
    finished = sum(len(pd.read_parquet(p)) for p in out.glob("parts/part-*.parquet"))
    assert 12 <= finished < runs
    done = subprocess.run(
        [*cmd, "--jobs", "2"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert f"simulated {runs - finished}, reused {finished}" in done.stdout
    assert len(pd.read_parquet(out / "results.parquet")) == runs
