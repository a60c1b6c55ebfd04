"""The turn model of a measured run (``--durations turns``): the decode curve from per-turn
records, the flat fallback without them, jobs replayed whole, and the command line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from staleness_sim.cli import main
from staleness_sim.cohort.config import validate_cohort
from staleness_sim.durations import make_job
from staleness_sim.validation import read_run
from staleness_sim.validation.turn_fit import fit_engine, turn_job

ROOT = Path(__file__).resolve().parents[2]
G1 = ROOT / "examples" / "runs" / "cpu_tiny_g1"


def synthetic_episodes(a: float, s: float, batches=(1, 2, 3, 4, 2, 1)) -> pd.DataFrame:
    """Jobs whose k sessions generate exactly together (batch k) for every turn, generation
    seconds from the curve a + s * (k - 1) per token."""
    rows = []
    for job, k in enumerate(batches):
        t = 0.0
        starts, outs = [], []
        for turn in range(3):
            out = 10 + 5 * turn + job
            gen = out * (a + s * (k - 1))
            starts.append(t)
            outs.append((out, gen))
            t += gen + 0.5  # then a command of 0.5 s
        for index in range(k):
            rows.append(
                {
                    "job_id": job,
                    "index": index,
                    "turns": 3,
                    "tokens_in": 300,
                    "tokens_out": sum(o for o, _ in outs),
                    "generation_s": sum(g for _, g in outs),
                    "container_s": 1.5,
                    "sandbox_start_s": 0.0,
                    "verify_s": 0.0,
                    "duration_s": t,
                    "start_time": 0.0,
                    "end_time": t,
                    "turn_start": starts,
                    "turn_gen_s": [g for _, g in outs],
                    "turn_tokens_out": [o for o, _ in outs],
                }
            )
    return pd.DataFrame(rows)


def test_the_curve_is_recovered_from_the_batches_the_turns_went_through():
    engine, how = fit_engine(synthetic_episodes(0.004, 0.0015), concurrency=4)
    assert engine["curve"]["batch"] == [1, 4]
    assert engine["curve"]["step_s"] == pytest.approx([0.004, 0.004 + 3 * 0.0015], rel=1e-9)
    assert "turns went through" in how


def test_a_run_only_at_large_batches_never_gets_a_batch_1_step_below_the_slope():
    # Steps of 0.5 ms at batch 12 and 4.5 ms at 16 (1 ms a sequence), the only batches
    # seen, extrapolate to -10.5 ms at batch 1 unconstrained (the old fit raised).
    # Batching cannot make one more sequence cost more than a sequence alone, so the fit
    # is the least-squares line with base >= slope, through the origin here: slope =
    # sum(x y) / sum(x x) over every session's turns (x = tokens * k, y = their seconds)
    turns = [
        (10 + 5 * t + j, k) for j, k in enumerate((12, 16)) for t in range(3) for _ in range(k)
    ]
    x = np.array([out * k for out, k in turns], float)
    y = np.array([out * (-0.0105 + 0.001 * (k - 1)) for out, k in turns])
    slope = float((x * y).sum() / (x * x).sum())
    engine, _ = fit_engine(synthetic_episodes(-0.0105, 0.001, batches=(12, 16)), concurrency=16)
    assert engine["curve"]["step_s"] == pytest.approx([slope, 16 * slope], rel=1e-9)


def test_a_run_only_at_batch_1_gets_a_flat_curve():
    # no batching cost was seen, so none is predicted (the curve is not made proportional)
    engine, _ = fit_engine(synthetic_episodes(0.004, 0.0015, batches=(1, 1, 1)), concurrency=1)
    assert engine["curve"]["step_s"] == pytest.approx([0.004, 0.004], rel=1e-9)


def test_without_per_turn_records_the_curve_is_flat_at_the_runs_rate():
    eps = synthetic_episodes(0.004, 0.0015).drop(columns=["turn_start", "turn_gen_s"])
    engine, how = fit_engine(eps, concurrency=4)
    rate = eps["generation_s"].sum() / eps["tokens_out"].sum()
    assert engine["curve"]["step_s"] == pytest.approx([rate, rate], rel=1e-12)
    assert "flat" in how


def test_a_simulated_job_replays_one_measured_jobs_episodes():
    # two measured jobs of two episodes each: (1, 3) s and (2, 2) s (flat curve, no tokens)
    table = {"turns": [1] * 4, "prompt_tokens": [0] * 4, "reply_tokens": [0] * 4,
             "command_s": [1.0, 3.0, 2.0, 2.0], "job": [7, 7, 9, 9]}  # fmt: skip
    base = {"workers": 1, "cohort": 1, "updates": 1, "policy": {"kind": "sync"}}
    job = {"episodes": 2, "concurrency": 2, "turns": {"table": table},
           "engine": {"curve": {"batch": [1], "step_s": [0.01]}}}  # fmt: skip
    got = make_job(validate_cohort({**base, "job": job}).job).sample(np.random.default_rng(0), 200)
    # whole jobs: 3 s or 2 s; never a mix of the two (which could give 1, 2 or 3 s)
    assert set(np.round(got, 12)) == {2.0, 3.0}
    job["concurrency"] = 1  # one session: the job's episodes one after the other
    got = make_job(validate_cohort({**base, "job": job}).job).sample(np.random.default_rng(0), 50)
    assert set(np.round(got, 12)) == {4.0}


def test_the_runs_episodes_become_the_table():
    run = read_run(G1)
    job, _ = turn_job(run)
    eps = run.episodes
    t = job["turns"]["table"]
    assert (job["episodes"], job["concurrency"]) == (4, 4) and len(t["turns"]) == len(eps)
    first = eps.sort_values(["job_id", "index"]).iloc[0]
    assert t["reply_tokens"][0] == pytest.approx(first.tokens_out / first.turns)
    assert t["end_s"][0] == pytest.approx(first.verify_s)
    other = first.duration_s - first.generation_s - first.container_s
    assert t["start_s"][0] == pytest.approx(first.sandbox_start_s + other)
    assert job["turns"]["timeout_s"] == 60.0


def test_fit_and_validate_with_durations_turns(capsys):
    assert main(["fit", str(G1), "--durations", "turns", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    eps = pd.read_parquet(G1 / "episodes.parquet")
    rate = eps["generation_s"].sum() / eps["tokens_out"].sum()  # no per-turn records here
    assert out["job"]["engine"]["curve"]["step_s"] == pytest.approx([rate, rate])
    assert main(["validate", str(G1), "--durations", "turns", "--replicates", "4", "--json"]) == 0
    v = json.loads(capsys.readouterr().out)
    # replaying the run's own jobs at its own concurrency: within 5 % (measured +1.9 %)
    assert abs(v["results_per_hour_error"]) < 0.05
    assert v["durations"] == "turns"


def test_what_ifs_on_sessions_per_worker_from_a_run(capsys):
    runs = {}
    for c in (4, 16):
        sets = ["--set", f"job.concurrency={c}", "--set", "job.episodes=16"]
        assert main(["run", "--from-run", str(G1), "--durations", "turns", *sets, "--json"]) == 0
        runs[c] = json.loads(capsys.readouterr().out)
    # a flat curve: 16 sessions finish 16 episodes about 4 x as fast as 4 sessions do
    ratio = runs[16]["results_per_hour"] / runs[4]["results_per_hour"]
    assert 2.5 < ratio < 4.0


def test_a_run_without_episodes_exits_2(tmp_path, capsys):
    for name in ("jobs.parquet", "updates.parquet", "workers.parquet", "meta.json"):
        (tmp_path / name).write_bytes((G1 / name).read_bytes())
    assert main(["validate", str(tmp_path), "--durations", "turns"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs episodes.parquet" in err[0]


def test_the_sweep_report_names_a_mapping_axis_by_what_differs():
    from staleness_sim.sweeps.report import point_table

    h200 = {"params": 7.6e9, "bandwidth": 4.8e12}
    h100 = {"params": 7.6e9, "bandwidth": 3.35e12}
    res = pd.DataFrame(
        {
            "point": [0, 1],
            "job.engine.roofline": [json.dumps(h200), json.dumps(h100)],
            "policy": ['{"kind": "sync"}'] * 2,
            "policy_label": ["sync"] * 2,
            "seed": [0, 0],
            "results_per_hour": [10.0, 7.0],
        }
    )
    table = point_table(res, ("job.engine.roofline", "policy"))
    assert list(table["job.engine.roofline"]) == ["bandwidth=4.8e+12", "bandwidth=3.35e+12"]
    assert "policy" in table.columns and len(table) == 2


def test_a_run_partly_without_per_turn_records_falls_back_to_the_flat_curve():
    eps = synthetic_episodes(0.004, 0.0015)
    eps.loc[0, "turn_gen_s"] = np.nan  # an episode recorded before per-turn records (a resume)
    _, how = fit_engine(eps, concurrency=4)
    assert "flat" in how


def test_cores_go_with_the_turn_model_only(capsys):
    assert main(["run", "--from-run", str(G1), "--cores", "2", "--json"]) == 2
    assert "--durations turns" in capsys.readouterr().err
