"""es.reward: graded makes the fraction of the verifier's checks the ES fitness, end to end."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest
from runner_invariants import check_run

from runner import cli as runner_cli

pytestmark = pytest.mark.docker

# Two checks any episode passes, beside the task's own full check (its partial checks left
# out), which a random tiny model does not pass: every episode scores 2 of 3.
TWO_FREE_CHECKS = """

def test_home_is_a_folder():
    assert Path('/home/user').is_dir()


def test_root_is_a_folder():
    assert Path('/').is_dir()
"""


@pytest.fixture
def graded_tasks(tmp_path, task_dir):
    out = tmp_path / "graded_tasks"
    out.mkdir()
    name = (task_dir / "train.txt").read_text().split()[0]
    shutil.copytree(task_dir / name, out / name)
    final = out / name / "test_final_state.py"
    full = final.read_text().split("\n\ndef test_partial_")[0]  # the task's own full check
    assert full.count("\ndef test_") == 1
    final.write_text(full + TWO_FREE_CHECKS)
    for split in ("train", "test"):
        (out / f"{split}.txt").write_text(name + "\n")
    return out


def test_graded_fitness_is_the_fraction_of_checks_and_success_stays_binary(
    engine, run_config, graded_tasks, tmp_path
):
    out = tmp_path / "graded"
    config = run_config(**{
        "workers": 1, "updates": 1, "policy": {"kind": "sync"}, "es.reward": "graded",
        "tasks.dir": str(graded_tasks), "max_turns": 1, "eval_every": 1,
    })  # fmt: skip
    assert runner_cli.main(["train", str(config), "--out", str(out), "--no-progress"]) == 0
    trace, _ = check_run(out, cohort=2, updates=1, workers=1, max_lag=0)
    episodes = pd.read_parquet(out / "episodes.parquet")
    assert (episodes["error"].isna()).all(), episodes["error"].tolist()
    assert episodes["graded"].tolist() == pytest.approx([2 / 3] * len(episodes))
    assert not episodes["passed"].any() and (episodes["reward"] == 0.0).all()
    accepted = trace.jobs[trace.jobs["verdict"] == "accepted"]
    assert accepted["reward"].tolist() == pytest.approx([2 / 3] * 2)  # the fitness
    ev = pd.read_parquet(out / "eval.parquet")
    assert sorted(ev["version"].unique()) == [0, 1]
    assert ev["graded"].tolist() == pytest.approx([2 / 3] * len(ev))
    assert not ev["passed"].any()
