"""The chaos script's short form against a real engine: a training run that meets a SIGKILL
mid-commit (a torn journal line), a SIGKILL in the first second of a resume, a truncated
trace file and a half-written transcript line, and a killed episode container; it loses
nothing and leaves nothing behind."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO

pytestmark = pytest.mark.docker


def test_short_chaos_run_loses_nothing(engine, tiny_model, tmp_path):
    done = subprocess.run(
        [sys.executable, "benchmarks/chaos.py", "--short", "--seed", "0", "--json"]
        + ["--model", str(tiny_model), "--out", str(tmp_path / "chaos")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    v = json.loads(done.stdout.strip().splitlines()[-1])
    assert v["injected"] == {
        "sigkill-commit": 1,
        "sigkill-resume": 1,
        "truncated-trace": 1,
        "docker-kill-episode": 1,
    }, v
    assert v["survived"] == {"docker-kill-episode": 1} and not v["not_reached"], v
    assert v["restarts"] >= 2 and v["final_exit_code"] == 0, v
    assert v["updates_lost"] == v["updates_applied_twice"] == 0, v
    assert v["versions_skipped"] == v["versions_repeated"] == 0, v
    assert v["jobs_without_verdict"] == 0 and v["checkpoint_log_equals_journal"], v
    # a transcript line torn by a kill was glued to the next process's first line
    assert v["transcript_lines_damaged"] == 0, v
    assert v["containers_left"] == v["processes_left"] == 0, v
    assert v["hashes_equal"], v


def test_sigterm_during_start_up_ends_like_ctrl_c(engine, run_config, tmp_path):
    """Found by the long chaos run: SIGTERM before the run loop (loading the model, building
    the task pool) exited 143 where the run loop's handler, and the documentation, say 130."""
    import os
    import signal
    import time

    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner.cli", "train", str(run_config()), "--out", str(run)]
        + ["--no-progress"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (run / "config.yaml").exists() and time.monotonic() < deadline:
        time.sleep(0.01)  # the run directory is made once the command (and its handler) runs
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "es-runner: interrupted" in err, (proc.returncode, err)
    assert not (run / "journal.jsonl").read_text().strip()  # it stopped before the run began


def test_a_journal_on_a_full_disk_fails_the_write_and_closes_quietly(tmp_path):
    """Found by chaos --disk-full: closing the journal after a failed write flushed the same
    bytes again and raised, so the run ended in a traceback instead of its one-line 'cannot
    write the journal ...; free space and resume'."""
    from runner.journal import Journal, read_events

    path = tmp_path / "journal.jsonl"
    j = Journal(path)
    j.append({"e": "a"}, durable=True)
    j._file.close()
    j._file = open("/dev/full", "a", encoding="utf-8")  # every write: ENOSPC  # noqa: SIM115
    with pytest.raises(OSError, match="No space left"):
        j.append({"e": "b"}, durable=True)
    j.close()
    assert j._file.closed
    assert read_events(path)[0] == [{"e": "a"}]
