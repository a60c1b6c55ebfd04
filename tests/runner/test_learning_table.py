"""The schedule table (runner.learning_table) on hand-made run folders: figures known by
construction, unfinished runs left out, one clear line for a folder with no run."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from runner.learning_table import main, runs_table, schedule_table


def _run(root, name, passed_v0, passed_last, *, updates=2, stale=0.0, lag=0.0, wall=600.0):
    """A run folder: 2 tasks x 2 seeds evaluated at version 0 and ``updates``."""
    run = root / name
    run.mkdir()
    rows = []
    for version, passed in ((0, passed_v0), (updates, passed_last)):
        for (task, seed), p in zip([("a", 1), ("a", 2), ("b", 1), ("b", 2)], passed, strict=True):
            rows.append(
                {"version": version, "split": "test", "seed": seed, "task": task, "passed": p}
            )
    pd.DataFrame(rows).to_parquet(run / "eval.parquet")
    summary = {"updates": updates, "stale_fraction": stale, "mean_lag": lag, "wall_clock_s": wall}
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_rows_and_schedules_from_hand_made_runs(tmp_path):
    # sync_s0: 1/4 -> 3/4 (task a 0/2 -> 2/2, task b 1/2 -> 1/2): gain 0.5, per-task
    # differences 1.0 and 0.0, so SE = std([1, 0], ddof=1) / sqrt(2) = 0.5
    _run(tmp_path, "sync_s0", [False, False, True, False], [True, True, True, False])
    # sync_s1: 1/4 -> 2/4: per-task 0.5 and 0.0, gain 0.25
    _run(tmp_path, "sync_s1", [False, False, True, False], [True, False, True, False], wall=1200.0)
    _run(
        tmp_path,
        "cd4_s0",
        [False, False, True, False],
        [False, False, True, False],
        stale=0.1,
        lag=0.4,
    )
    # still going: a summary of 1 update, only version 0 evaluated
    going = _run(tmp_path, "cd8_s0", [True] * 4, [True] * 4, updates=0)
    (going / "summary.json").write_text(json.dumps({"updates": 1}))
    (tmp_path / "notes").mkdir()

    runs = runs_table(tmp_path).set_index(["schedule", "seed"])
    assert sorted(runs.index) == [("cd4", 0), ("sync", 0), ("sync", 1)]
    assert runs.loc[
        ("sync", 0), ["success_v0", "success", "gain", "gain_se"]
    ].tolist() == pytest.approx([0.25, 0.75, 0.5, 0.5])
    assert runs.loc[("sync", 1), "gain"] == pytest.approx(0.25)
    assert runs.loc[("cd4", 0), ["gain", "stale_fraction", "mean_lag"]].tolist() == pytest.approx(
        [0.0, 0.1, 0.4]
    )

    table = schedule_table(runs.reset_index()).set_index("schedule")
    assert table.loc["sync", "seeds"] == 2
    assert table.loc["sync", "gain"] == pytest.approx(0.375)
    assert table.loc["sync", "gain_sd"] == pytest.approx(0.25 / 2**0.5)  # sample sd of 0.5, 0.25
    assert table.loc["sync", "success"] == pytest.approx(0.625)
    assert table.loc["sync", "minutes"] == pytest.approx(15.0)


def test_the_command_writes_both_tables_and_refuses_an_empty_folder(tmp_path, capsys):
    _run(tmp_path, "bounded_s2", [False] * 4, [True] * 4)
    assert main([str(tmp_path)]) == 0
    assert pd.read_csv(tmp_path / "schedules.csv")["schedule"].tolist() == ["bounded"]
    assert pd.read_csv(tmp_path / "schedules_runs.csv")["seed"].tolist() == [2]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([str(empty)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no finished run" in err[0]


def test_eval_initial_false_leaves_out_version_0_only():
    from types import SimpleNamespace

    from runner.config import load_run_config
    from runner.evaluation import Evaluator

    path = "configs/runner/cpu_learn.yaml"  # eval_every 30, updates 30
    for sets, wanted in (((), [0, 30]), (("eval.initial=false",), [30])):
        config = load_run_config(path, sets)
        got = [v for v in range(31) if Evaluator.wanted(SimpleNamespace(config=config), v)]
        assert got == wanted
    config = load_run_config(path, ("eval_every=10", "eval.initial=false"))
    assert [v for v in range(31) if Evaluator.wanted(SimpleNamespace(config=config), v)] == [
        10,
        20,
        30,
    ]


def test_a_run_without_version_0_takes_it_from_the_shared_base(tmp_path):
    _run(tmp_path, "sync_s0", [False, False, True, False], [True, True, True, False])
    late = _run(tmp_path, "cd8_s1", [True] * 4, [True, True, True, False])
    rows = pd.read_parquet(late / "eval.parquet")
    rows[rows["version"] > 0].to_parquet(late / "eval.parquet")  # made with eval.initial false
    with pytest.raises(ValueError, match="cd8_s1: no version-0 evaluation"):
        runs_table(tmp_path)
    base = pd.read_parquet(tmp_path / "sync_s0" / "eval.parquet")
    base[base["version"] == 0].to_parquet(tmp_path / "eval_base.parquet")
    runs = runs_table(tmp_path).set_index("schedule")
    assert runs.loc["cd8", "success_v0"] == pytest.approx(0.25)  # the base's 1 of 4
    assert runs.loc["cd8", "gain"] == pytest.approx(0.5)  # 3/4 - 1/4
