"""Running sweeps: rows equal ``run --json``, resume skips finished runs, interruption keeps
finished batches, the process pool gives the same rows as in-process execution."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest

import staleness_sim.cli as cli
import staleness_sim.summary as summary
from staleness_sim.config import validate
from staleness_sim.sweeps.run import run_sweep, summary_of_row
from staleness_sim.sweeps.spec import parse_sweep


@pytest.fixture
def count_runs(monkeypatch):
    """Count simulations; optionally fail at the n-th (simulating a crash or Ctrl-C)."""
    calls = {"n": 0, "fail_at": None}
    real = summary.run_summary

    def counted(scenario):
        calls["n"] += 1
        if calls["fail_at"] is not None and calls["n"] >= calls["fail_at"]:
            raise KeyboardInterrupt
        return real(scenario)

    monkeypatch.setattr(summary, "run_summary", counted)
    return calls


def test_each_row_equals_run_json_for_its_scenario_and_seed(tmp_path, tiny_sweep, capsys):
    out = run_sweep(tiny_sweep(), tmp_path / "out", jobs=1, progress=False)
    table = pd.read_parquet(tmp_path / "out" / "results.parquet")
    assert len(table) == 2 * 2 * 2 and out.ran == 8 and out.reused == 0
    assert list(table.columns[:4]) == ["point", "workers", "policy", "seed"]
    spec = parse_sweep(tiny_sweep())
    for run in spec.runs():
        row = table[(table["point"] == run.point) & (table["seed"] == run.seed)]
        assert len(row) == 1
        # the CLI's own output for the same scenario and seed
        scenario_file = tmp_path / f"sc{run.point}_{run.seed}.json"
        scenario_file.write_text(json.dumps(run.scenario))
        assert cli.main(["run", str(scenario_file), "--json"]) == 0
        expected = json.loads(capsys.readouterr().out)
        assert summary_of_row(row.iloc[0]) == expected
        assert row.iloc[0]["workers"] == run.scenario["workers"]


def test_lag_histograms_round_trip_into_the_long_table(tmp_path, tiny_sweep):
    out = run_sweep(tiny_sweep(), tmp_path, jobs=1, progress=False)
    lags = pd.read_parquet(tmp_path / "lag_hists.parquet")
    assert list(lags.columns) == ["point", "seed", "key", "lag", "count"]
    for _, row in out.results.iterrows():
        mine = lags[lags["key"] == row["key"]]
        assert dict(zip(mine["lag"].astype(str), mine["count"], strict=True)) == json.loads(
            row["lag_hist"]
        )
        assert mine["count"].sum() == row["results_accepted"]


def test_rerun_skips_finished_runs_and_extends_with_new_seeds(tmp_path, tiny_sweep, count_runs):
    run_sweep(tiny_sweep(), tmp_path, jobs=1, progress=False)
    assert count_runs["n"] == 8
    first = (tmp_path / "results.parquet").read_bytes()
    again = run_sweep(tiny_sweep(), tmp_path, jobs=1, progress=False)
    assert count_runs["n"] == 8 and again.ran == 0 and again.reused == 8
    assert pd.read_parquet(tmp_path / "results.parquet").equals(pd.read_parquet(io.BytesIO(first)))
    more = run_sweep(tiny_sweep(seeds=[0, 1, 2]), tmp_path, jobs=1, progress=False)
    assert count_runs["n"] == 8 + 4 and more.ran == 4 and more.reused == 8
    assert len(more.results) == 12


def test_interrupted_sweep_keeps_finished_batches(tmp_path, tiny_sweep, count_runs):
    count_runs["fail_at"] = 6  # batches of 2: runs 1-4 finish (two batches), run 6 dies
    with pytest.raises(KeyboardInterrupt):
        run_sweep(tiny_sweep(), tmp_path, jobs=1, progress=False, batch=2)
    parts = list((tmp_path / "parts").glob("part-*.parquet"))
    assert len(parts) == 2 and sum(len(pd.read_parquet(p)) for p in parts) == 4
    assert not (tmp_path / "results.parquet").exists()
    count_runs["fail_at"], count_runs["n"] = None, 0
    done = run_sweep(tiny_sweep(), tmp_path, jobs=1, progress=False, batch=2)
    assert count_runs["n"] == 4 and done.ran == 4 and done.reused == 4
    assert not (tmp_path / "parts").exists()  # folded into results.parquet
    fresh = run_sweep(tiny_sweep(), tmp_path / "fresh", jobs=1, progress=False)
    pd.testing.assert_frame_equal(done.results, fresh.results)


def test_process_pool_gives_the_same_rows_as_in_process(tmp_path, tiny_sweep):
    one = run_sweep(tiny_sweep(), tmp_path / "one", jobs=1, progress=False)
    two = run_sweep(tiny_sweep(), tmp_path / "two", jobs=2, progress=False, batch=3)
    pd.testing.assert_frame_equal(one.results, two.results)
    pd.testing.assert_frame_equal(one.lag_hists, two.lag_hists)


def test_changed_sweep_in_the_same_folder_reuses_matching_runs(tmp_path, tiny_sweep, count_runs):
    run_sweep(tiny_sweep(), tmp_path, jobs=1, progress=False)
    # same runs reached through a different axis layout: workers moved into a zip group
    changed = tiny_sweep(grid={"policy": tiny_sweep()["grid"]["policy"]}, zip={"workers": [2, 4]})
    out = run_sweep(changed, tmp_path, jobs=1, progress=False)
    assert out.ran == 0 and count_runs["n"] == 8
    assert list(out.results.columns[:4]) == ["point", "policy", "workers", "seed"]


def test_cli_sweep_writes_results_and_prints_one_summary_line(
    tmp_path, tiny_sweep, write_sweep, capsys
):
    path = write_sweep(tiny_sweep())
    assert cli.main(["sweep", str(path), "--out", str(tmp_path / "o"), "--jobs", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "simulated 8, reused 0" in lines[0]
    assert len(pd.read_parquet(tmp_path / "o" / "results.parquet")) == 8
    validate(json.loads(pd.read_parquet(tmp_path / "o" / "results.parquet")["scenario"][0]))


def test_points_with_identical_scenarios_are_simulated_once(tmp_path, tiny_sweep, count_runs):
    out = run_sweep(
        tiny_sweep(grid={"workers": [2, 2, 3]}, seeds=[0]), tmp_path, jobs=1, progress=False
    )
    assert count_runs["n"] == 2 and out.ran == 2
    assert out.results["point"].tolist() == [0, 1, 2]
    first, second = out.results.iloc[0], out.results.iloc[1]
    assert first["key"] == second["key"] and summary_of_row(first) == summary_of_row(second)


def test_runs_of_an_earlier_sweep_in_the_folder_are_kept_for_later(
    tmp_path, tiny_sweep, count_runs
):
    run_sweep(tiny_sweep(), tmp_path, jobs=1, progress=False)  # workers 2 and 4
    narrow = tiny_sweep(grid={"workers": [4], "policy": tiny_sweep()["grid"]["policy"]})
    out = run_sweep(narrow, tmp_path, jobs=1, progress=False)
    assert out.ran == 0 and set(out.results["workers"]) == {4} and len(out.results) == 4
    back = run_sweep(tiny_sweep(), tmp_path, jobs=1, progress=False)
    assert back.ran == 0 and back.reused == 8 and count_runs["n"] == 8
    assert not (tmp_path / "parts").exists()


def test_published_setting_row_equals_run_with_set(tmp_path, write_sweep, capsys):
    from pathlib import Path

    config = Path(__file__).resolve().parents[2] / "configs" / "sim" / "paper_async1.yaml"
    sweep = {"base": str(config), "grid": {"policy.max_lag": [2]}, "seeds": [3]}
    out = run_sweep(sweep, tmp_path, jobs=1, progress=False)
    assert (
        cli.main(["run", str(config), "--set", "policy.max_lag=2", "--set", "seed=3", "--json"])
        == 0
    )
    assert summary_of_row(out.results.iloc[0]) == json.loads(capsys.readouterr().out)
