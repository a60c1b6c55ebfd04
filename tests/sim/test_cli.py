"""The staleness-sim command line: round trips and every kind of bad input."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from staleness_sim import Trace, load_scenario, simulate, summarize
from staleness_sim.cli import main
from staleness_sim.config import scenario_dict

ROOT = Path(__file__).resolve().parents[2]
PAPER = ROOT / "configs" / "sim"


def cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "staleness_sim.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "small",
                "seed": 3,
                "workers": 4,
                "cohort": 6,
                "updates": 20,
                "policy": {"kind": "bounded", "max_lag": 1, "on_stale": "drop"},
                "job": {"duration": {"dist": "lognormal", "mean": 2.0, "cv": 1.5}},
            }
        )
    )
    return path


def test_run_json_is_one_object_equal_to_the_api(small):
    r = cli("run", small, "--json", "--set", "workers=6")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)  # exactly one JSON document
    expected = summarize(simulate(load_scenario(small, ["workers=6"])))
    assert out["results_accepted"] == expected["results_accepted"]
    assert out["wall_clock_s"] == pytest.approx(expected["wall_clock_s"])
    assert out["lag_hist"] == {str(k): v for k, v in expected["lag_hist"].items()}
    assert out["name"] == "small" and out["seed"] == 3


def test_run_out_writes_the_trace_and_summary(small, tmp_path):
    out = tmp_path / "trace"
    r = cli("run", small, "--out", out)
    assert r.returncode == 0, r.stderr
    assert "stale fraction" in r.stdout  # the readable table
    for name in ("jobs.parquet", "updates.parquet", "workers.parquet", "summary.json", "meta.json"):
        assert (out / name).stat().st_size > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summarize(Trace.read(out))["results_accepted"] == summary["results_accepted"]
    assert pd.read_parquet(out / "updates.parquet").version.tolist() == list(range(1, 21))
    # the scenario in meta.json reproduces the run
    meta = json.loads((out / "meta.json").read_text())
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(meta["scenario"]))
    assert json.loads(cli("run", again, "--json").stdout)["wall_clock_s"] == summary["wall_clock_s"]


def test_scenario_dict_round_trips(small):
    sc = load_scenario(small)
    assert load_scenario(small) == sc
    assert scenario_dict(sc)["policy"] == {"kind": "bounded", "max_lag": 1, "on_stale": "drop"}


def test_compare_runs_the_paper_configs_at_several_worker_counts():
    configs = [PAPER / f"paper_{v}.yaml" for v in ("sync", "async1", "async4", "async8")]
    r = cli("compare", *configs, "--workers", 4, 8, "--json", "--set", "updates=20")
    assert r.returncode == 0, r.stderr
    rows = pd.DataFrame(json.loads(r.stdout))
    assert len(rows) == 8 and sorted(set(rows.G)) == [4, 8]
    sync = rows[rows.policy.str.startswith("sync")]
    assert (sync.speedup == 1.0).all() and (sync["stale %"] == 0).all()
    a1 = rows[rows.scenario == "paper-async1"]
    assert (a1["max lag"] <= 1).all()
    assert (a1.speedup > 1.0).all()  # asynchrony removes the barrier's idle time


def test_compare_prints_a_table():
    r = cli("compare", PAPER / "paper_sync.yaml", PAPER / "paper_async1.yaml", "--set", "updates=5")
    assert r.returncode == 0, r.stderr
    header = r.stdout.splitlines()[0].split()
    assert header[:3] == ["scenario", "G", "policy"] and "speedup" in header


def test_fit_recovers_a_gamma_from_a_csv(tmp_path):
    import numpy as np

    values = np.random.default_rng(0).gamma(shape=4.0, scale=10.0, size=5000)
    pd.DataFrame({"seconds": values}).to_csv(tmp_path / "d.csv", index=False)
    r = cli("fit", tmp_path / "d.csv", "--json", "--plot", tmp_path / "fit.png")
    assert r.returncode == 0, r.stderr
    best = json.loads(r.stdout)["best"]
    assert best["dist"] == "gamma" and best["mean"] == pytest.approx(40, rel=0.03)
    assert (tmp_path / "fit.png").stat().st_size > 1000


def test_entry_point_is_installed():
    exe = shutil.which("staleness-sim")
    if exe is None:
        pytest.fail("staleness-sim is not on PATH: install the project with pip install -e .")
    assert subprocess.run([exe, "--help"], capture_output=True, text=True).returncode == 0


BAD = [
    (["--set", "workers=0"], "workers"),
    (["--set", "workers=abc"], "workers"),
    (["--set", "cohort=-3"], "cohort"),
    (["--set", "updates=1.5"], "updates"),
    (["--set", "bogus=1"], "bogus: unknown key"),
    (["--set", "policy.kind=nope"], "'sync', 'bounded', 'controlled_delay', 'unbounded'"),
    (["--set", "policy.on_stale=maybe"], "policy.on_stale"),
    (["--set", "policy.max_lag=x"], "policy.max_lag"),
    (["--set", "job.duration.dist=weird"], "'exponential'"),
    (["--set", "job.duration.mean=-1"], "job.duration.mean"),
    (["--set", "job.duration={dist: weibull, shape: 2}"], "job.duration.scale: required"),
    (["--set", "job.duration.extra=1"], "job.duration.extra: unknown key"),
    (["--set", "job.episodes=10"], "job: give either duration"),
    (["--set", "policy={kind: controlled_delay, fraction: 1.5, delay: 2}"], "policy.fraction"),
    (["--set", "update_seconds=-1"], "update_seconds"),
    (["--set", "noequals"], "expected KEY=VALUE"),
]


@pytest.mark.parametrize("args, needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_exits_2_with_one_line(small, args, needle, capsys):
    # in-process for speed: an uncaught exception would fail the test like a traceback
    assert main(["run", str(small), *args]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert needle in lines[0]
    assert captured.out == ""


def test_bad_input_from_the_real_process_has_no_traceback(small):
    r = cli("run", small, "--set", "policy.kind=nope")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_missing_and_malformed_files_exit_2(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("workers: [1, 2\n")
    assert main(["run", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "not valid YAML" in err and len(err.strip().splitlines()) == 1
    bad.write_text("- just a list\n")
    assert main(["run", str(bad)]) == 2
    assert "mapping" in capsys.readouterr().err


def test_compare_policy_variants_on_one_workload(capsys):
    args = ["compare", str(PAPER / "paper_async1.yaml"), "--set", "updates=10", "--json"]
    assert main([*args, "--policy", "{kind: sync}", "--policy", "{kind: unbounded}"]) == 0
    rows = pd.DataFrame(json.loads(capsys.readouterr().out))
    assert rows.policy.str.split("+").str[0].tolist() == [
        "bounded(max_lag=1,drop)",
        "sync",
        "unbounded",
    ]
    assert rows.set_index(rows.policy.str.split("+").str[0]).speedup["sync"] == 1.0
    assert main([*args, "--policy", "{kind: bogus}"]) == 2
    assert "'sync', 'bounded'" in capsys.readouterr().err
