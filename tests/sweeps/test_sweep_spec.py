"""Sweep files: grid and zip expansion counts from combinatorics, keys, base resolution."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from staleness_sim.config import ConfigError
from staleness_sim.sweeps.spec import load_sweep, parse_sweep


def test_grid_is_the_cartesian_product(tiny_sweep):
    spec = parse_sweep(
        tiny_sweep(grid={"workers": [1, 2, 3], "cohort": [2, 4], "updates": [3, 4, 5, 6]})
    )
    points = list(spec.points())
    assert spec.n_points == len(points) == 3 * 2 * 4
    got = {(p["workers"], p["cohort"], p["updates"]) for p in points}
    assert got == set(itertools.product([1, 2, 3], [2, 4], [3, 4, 5, 6]))
    runs = spec.runs()
    assert len(runs) == spec.n_runs == 24 * 2  # two seeds
    assert {(r.point, r.seed) for r in runs} == set(itertools.product(range(24), [0, 1]))


def test_zip_axes_vary_together_and_multiply_with_the_grid(tiny_sweep):
    spec = parse_sweep(
        tiny_sweep(
            grid={"workers": [2, 4]},
            zip={"cohort": [2, 3, 4], "updates": [5, 6, 7]},
            seeds=3,
        )
    )
    points = list(spec.points())
    assert len(points) == 2 * 3  # the zip group counts once per row, not 3 x 3
    assert {(p["cohort"], p["updates"]) for p in points} == {(2, 5), (3, 6), (4, 7)}
    assert spec.run_seeds == [0, 1, 2]
    assert spec.n_runs == 18
    assert spec.axes == ["workers", "cohort", "updates"]


def test_several_zip_groups_are_crossed(tiny_sweep):
    spec = parse_sweep(
        tiny_sweep(grid=None, zip=[{"cohort": [2, 3], "updates": [5, 6]}, {"workers": [1, 2, 3]}])
    )
    assert spec.n_points == 2 * 3


def test_keys_hash_the_full_scenario_and_seed(tiny_sweep, tiny_base):
    runs = parse_sweep(tiny_sweep()).runs()
    assert len({r.key for r in runs}) == len(runs)
    # the same scenario written differently (a default spelled out) gets the same key
    again = parse_sweep(tiny_sweep(base={**tiny_base, "update_seconds": 0.0})).runs()
    assert [r.key for r in again] == [r.key for r in runs]


def test_without_seeds_the_base_seed_is_used(tiny_sweep, tiny_base):
    spec = parse_sweep(tiny_sweep(seeds=None, base={**tiny_base, "seed": 7}))
    assert {r.seed for r in spec.runs()} == {7}


def test_set_overrides_the_base_before_the_axes(tiny_sweep):
    spec = parse_sweep(tiny_sweep(set={"updates": 3, "job.episode.median": 5.0}))
    assert {r.scenario["updates"] for r in spec.runs()} == {3}
    assert {r.scenario["job"]["episode"]["median"] for r in spec.runs()} == {5.0}


def test_base_path_is_resolved_against_the_sweep_folder_then_cwd(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "base.yaml").write_text("workers: 2\n")
    sweep = tmp_path / "sub" / "s.yaml"
    sweep.write_text("base: base.yaml\ngrid: {cohort: [1]}\n")
    assert load_sweep(sweep).base == {"workers": 2}
    # not beside the sweep file: found relative to the current directory
    sweep.write_text("base: sub/base.yaml\ngrid: {cohort: [1]}\n")
    monkeypatch.chdir(tmp_path)
    assert load_sweep(Path("sub/s.yaml")).base == {"workers": 2}


def test_the_published_sweep_configs_validate():
    repo = Path(__file__).resolve().parents[2]
    for path in sorted((repo / "configs" / "sweeps").glob("*.yaml")):
        spec = load_sweep(path)
        assert len(spec.runs()) == spec.n_runs > 0, path


def test_paper_sweep_covers_workers_bound_and_tail():
    repo = Path(__file__).resolve().parents[2]
    spec = load_sweep(repo / "configs" / "sweeps" / "paper_published.yaml")
    assert {"workers", "policy", "job.episode.sigma"} <= set(spec.axes)
    assert spec.base["cohort"] == 30 and spec.base["job"]["episodes"] == 256


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"grid": {"workers": []}}, "grid.workers: empty"),
        ({"grid": {}}, "grid: empty"),
        ({"grid": {"workers": 4}}, "grid.workers: expected a list"),
        ({"zip": {"workers": [1, 2], "cohort": [1]}}, "zip: axes must have equal lengths"),
        ({"seeds": [0, -1]}, "seeds:"),
        ({"grid": {"seed": [1, 2]}}, "grid.seed:"),
        ({"bogus": 1}, "bogus: unknown key"),
        ({"grid": {"workers": [1]}, "zip": {"workers": [2]}}, "axis 'workers' is given twice"),
    ],
)
def test_malformed_sweeps_name_the_problem(tiny_sweep, overrides, field):
    with pytest.raises(ConfigError, match=field):
        parse_sweep(tiny_sweep(**overrides), source="s.yaml")


def test_the_run_limit_counts_points_times_seeds(tiny_sweep):
    from staleness_sim.sweeps.spec import MAX_RUNS, check_size

    spec = parse_sweep(tiny_sweep(grid={"workers": list(range(1, 50_001))}, seeds=[0, 1]))
    assert spec.n_runs == 100_000 == MAX_RUNS
    check_size(spec, yes=False)  # exactly at the limit: allowed
    spec = parse_sweep(tiny_sweep(grid={"workers": list(range(1, 50_002))}, seeds=[0, 1]))
    with pytest.raises(ConfigError, match="100,002 runs"):
        check_size(spec, yes=False)
    check_size(spec, yes=True)
