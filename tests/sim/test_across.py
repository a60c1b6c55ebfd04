"""``staleness-sim validate RUN RUN... --across``: each run predicted from each other, and
pooled by setting, on the committed run sets (``examples/runs/across_concurrency_4``,
``across_workers_12``), whose READMEs fixed the tests before the runs were made."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from staleness_sim.cli import main
from staleness_sim.validation import ModelOptions
from staleness_sim.validation.across import compare_runs, measure, setting_sets

RUNS = Path(__file__).resolve().parents[2] / "examples" / "runs"
CONCURRENCY = RUNS / "across_concurrency_4"
WORKERS = RUNS / "across_workers_12"
TURNS = ModelOptions(durations="turns")


def runner_summary(run: Path) -> float:
    """The results per hour the runner itself wrote for the run."""
    return json.loads((run / "summary.json").read_text())["results_per_hour"]


def job_noise(run: Path) -> float:
    """One standard error of results per hour, relative: from the spans of the jobs that
    were not cancelled (results per hour is 3600 over the mean span on one worker)."""
    jobs = pd.read_parquet(run / "jobs.parquet")
    done = jobs[jobs["verdict"].isin(["accepted", "discarded", "deferred"])]
    span = (done["end_time"] - done["start_time"]).dropna().to_numpy()
    return span.std(ddof=1) / span.mean() / math.sqrt(len(span))


def test_across_concurrency_from_c4_is_within_ten_percent():
    # the fourth sitting's pre-registered test: fit at C = 4, the shared CPU from the run
    runs = [CONCURRENCY / n for n in ("C4", "C1", "C2", "C8", "C16")]
    result = compare_runs(runs, TURNS, replicates=10)
    m = result.matrix
    assert len(m) == 5 * 4
    from_c4 = m[m["fit"] == str(runs[0])].set_index("setting")["error"]
    assert list(from_c4.index) == [f"G=1 C={c} D=16" for c in (1, 2, 8, 16)]
    assert (from_c4.abs() < 0.10).all(), from_c4
    for run in runs:
        row = m[m["run"] == str(run)].iloc[0]
        assert row["measured"] == pytest.approx(runner_summary(run), rel=1e-9)
        assert row["noise"] == pytest.approx(job_noise(run), rel=1e-9)
    # without the shared CPU the same fit is far off at C = 1 and 16
    off = compare_runs(runs[:2], ModelOptions(durations="turns", cores="off"), replicates=10)
    assert off.matrix.iloc[0]["error"] < -0.3


def test_across_workers_pooled_is_within_eight_percent():
    # the twelfth sitting's pre-registered pooled test: three runs of each G, alternated
    runs = [WORKERS / n for n in ("C4", "C4r", "C4s", "G2C4", "G2C4r", "G2C4s")]
    result = compare_runs(runs, TURNS, replicates=10)
    pooled = result.pooled.set_index(["fit setting", "setting"])
    assert set(pooled.index) == {("G=1 C=4 D=16", "G=2 C=4 D=16"), ("G=2 C=4 D=16", "G=1 C=4 D=16")}
    assert (pooled["fits"] == 3).all() and (pooled["runs"] == 3).all()
    assert (pooled["error"].abs() < 0.08).all(), pooled["error"]
    # the pooled prediction is the mean of the fits' predictions, the measurement the mean
    # of the runs'
    m = result.matrix
    g2 = [str(r) for r in runs[3:]]
    from_g1 = m[(m["fit setting"] == "G=1 C=4 D=16") & (m["setting"] == "G=2 C=4 D=16")]
    got = pooled.loc[("G=1 C=4 D=16", "G=2 C=4 D=16")]
    assert got["predicted"] == pytest.approx(from_g1.groupby("fit")["predicted"].first().mean())
    assert got["measured"] == pytest.approx(np.mean([runner_summary(Path(r)) for r in g2]))


def test_a_setting_is_set_as_the_job_model_allows():
    target = measure(WORKERS / "G2C4")
    cpu_job = {"episodes": 16, "concurrency": 4, "turns": {}, "engine": {}, "cpu": {"cores": 2}}
    assert setting_sets(cpu_job, target) == [
        "workers=2", "job.concurrency=4", "job.episodes=16", "job.cpu.cores=1"
    ]  # fmt: skip
    assert setting_sets({"duration": {}}, target) == ["workers=2"]  # durations cannot change


def test_the_command_prints_the_matrix_and_the_pooled_table(capsys):
    runs = [str(CONCURRENCY / n) for n in ("C4", "C1")]
    args = ["validate", *runs, "--across", "--durations", "turns", "--replicates", "2"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["run"] for r in out["runs"]] == runs
    assert len(out["matrix"]) == 2 and len(out["pooled"]) == 2
    assert out["options"]["durations"] == "turns" and out["replicates"] == 2
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "each run predicted from each other" in text and "pooled" in text


@pytest.mark.parametrize(
    "extra, message",
    [
        ([], "2 runs given: one, or several with --across"),
        (["--across", "--plot", "figs"], "--plot goes with one run"),
    ],
)
def test_bad_across_use_exits_2_in_one_line(extra, message, capsys):
    runs = [str(CONCURRENCY / n) for n in ("C4", "C1")]
    assert main(["validate", *runs, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_across_needs_two_runs(capsys):
    assert main(["validate", str(CONCURRENCY / "C4"), "--across"]) == 2
    assert "--across needs at least two runs" in capsys.readouterr().err
