"""benchmarks/sitting_drift.py on the committed eleventh sitting, and
benchmarks/cpu_probe.py on this machine: what they read and write."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
SITTING = ROOT / "examples" / "runs" / "across_workers_11"
RUNS = ["C4", "G2C4", "C4r", "G2C4r", "C4s", "G2C4s"]


def run_bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=BENCH, capture_output=True, text=True, timeout=timeout
    )


def test_sitting_drift_reads_the_runs_and_the_probe_before_each():
    out = run_bench("sitting_drift.py", *[str(SITTING / r) for r in RUNS], "--json")
    assert out.returncode == 0, out.stderr
    table = json.loads(out.stdout)
    probes = {
        row["label"]: row
        for row in map(json.loads, (SITTING / "probes.jsonl").read_text().splitlines())
    }
    for row in table["runs"]:
        meta = json.loads((SITTING / row["run"] / "meta.json").read_text())
        summary = json.loads((SITTING / row["run"] / "summary.json").read_text())
        busy = [s["machine_busy_cores"] for s in meta["segments"]]
        assert row["G"] == meta["config"]["workers"]
        assert row["results per hour"] == pytest.approx(summary["results_per_hour"])
        # core-seconds a result times results an hour: the busy cores over the hour
        assert row["core-s a result"] * row["results per hour"] / 3600 == pytest.approx(
            sum(busy) / len(busy)
        )
        assert row["probe torch"] == probes[f"before {row['run']}"]["torch"]["ratio"]
    rates = {r["run"]: r["results per hour"] for r in table["runs"]}
    spreads = {g["G"]: g["results per hour spread"] for g in table["by_G"]}
    g1 = [rates[r] for r in ("C4", "C4r", "C4s")]
    assert spreads[1] == pytest.approx(max(g1) / min(g1) - 1)


def test_cpu_probe_appends_one_line_a_probe(tmp_path):
    out_file = tmp_path / "probes.jsonl"
    for label in ("first", "second"):
        out = run_bench(
            "cpu_probe.py", "--seconds", "0.3", "--label", label, "--out", str(out_file)
        )
        assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [r["label"] for r in rows] == ["first", "second"]
    for row in rows:
        for workload in ("torch", "python", "weights"):
            probe = row[workload]
            assert probe["alone"] > 0 and len(probe["pair"]) == 2
            assert probe["ratio"] == pytest.approx(sum(probe["pair"]) / 2 / probe["alone"])
        assert 0 <= row["steal_share"] < 1


def test_cpu_probe_refuses_a_time_that_is_not_positive():
    out = run_bench("cpu_probe.py", "--seconds", "0")
    assert out.returncode == 2
    assert "--seconds must be > 0" in out.stderr


def test_pooled_sets_the_mean_prediction_against_the_mean_run():
    sys.path.insert(0, str(BENCH))
    try:
        from across_workers import WAYS, pooled
    finally:
        sys.path.remove(str(BENCH))
    g1, g2 = {"A": 100.0, "B": 110.0}, {"X": 150.0, "Y": 170.0}
    predicted = {("A", 2): 160.0, ("B", 2): 180.0, ("X", 1): 99.0, ("Y", 1): 111.0}
    predicted |= {("A", 1): 1e9, ("X", 2): 1e9}  # same-G replays: left out of the pool
    runs = {**{r: (1, m) for r, m in g1.items()}, **{r: (2, m) for r, m in g2.items()}}
    rows = []
    for fit, (fit_g, _) in runs.items():
        for run, (g, measured) in runs.items():
            if run == fit or (fit, g) not in predicted:
                continue
            row = {"fit": fit, "run": run, "fit G": fit_g, "G": g, "measured": measured}
            rows.append(row | {way: predicted[fit, g] for way in WAYS})
    out = {(r["fit G"], r["G"]): r for r in pooled(rows)}
    assert set(out) == {(1, 2), (2, 1)}
    up, down = out[1, 2], out[2, 1]
    assert (up["fits"], up["runs"], up["measured"]) == (2, 2, 160.0)
    assert up["moment fitted"] == 170.0
    assert up["moment fitted error"] == pytest.approx(170 / 160 - 1)
    assert down["measured"] == 105.0 and down["cpu error"] == pytest.approx(0.0)
