"""``staleness-sim report``: Markdown + HTML + non-empty PNG figures; figures a sweep cannot
draw are skipped with a note saying what it lacks."""

from __future__ import annotations

import pytest

import staleness_sim.cli as cli
from staleness_sim.sweeps.run import run_sweep

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURES = (
    "throughput_vs_workers",
    "lag_distributions",
    "speedup_vs_tail",
    "stale_vs_bound",
    "frontier",
)


@pytest.fixture
def full_sweep(tmp_path, tiny_sweep):
    """Workers x policies (sync and two bounds) x tail: every figure is drawable."""
    sweep = tiny_sweep(
        grid={
            "workers": [2, 4],
            "policy": [
                {"kind": "sync"},
                {"kind": "bounded", "max_lag": 0, "on_stale": "drop"},
                {"kind": "bounded", "max_lag": 2, "on_stale": "drop"},
            ],
            "job.episode.sigma": [0.5, 1.5],
        },
        seeds=[0, 1],
    )
    out = tmp_path / "full"
    run_sweep(sweep, out, jobs=2, progress=False)
    return out


def test_report_writes_markdown_html_and_every_figure(full_sweep, capsys):
    assert cli.main(["report", str(full_sweep)]) == 0
    assert "report written" in capsys.readouterr().out
    report = full_sweep / "report"
    for name in FIGURES:
        png = (report / f"{name}.png").read_bytes()
        assert png.startswith(PNG_MAGIC) and len(png) > 5_000, name
    md = (report / "report.md").read_text()
    assert all(f"({name}.png)" in md for name in FIGURES)
    assert "skipped" not in md
    assert md.count("\n| ") == 1 + 2 * 3 * 2  # the header, then one row per point
    html = (report / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(FIGURES)  # self-contained


def test_figures_lacking_axes_are_skipped_with_a_note(tmp_path, tiny_sweep, capsys):
    # only the bound varies: no workers axis, no sync runs, no tail axis
    sweep = tiny_sweep(grid={"policy.max_lag": [0, 1, 2]}, seeds=[0])
    run_sweep(sweep, tmp_path, jobs=1, progress=False)
    assert cli.main(["report", str(tmp_path), "--format", "md"]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "*skipped: workers is not a swept axis*" in md
    assert "*skipped: no tail-heaviness axis" in md
    assert (tmp_path / "report" / "stale_vs_bound.png").stat().st_size > 5_000
    assert not (tmp_path / "report" / "report.html").exists()


def test_report_on_a_folder_without_results_exits_2(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no results.parquet" in err[0]


def test_pareto_frontier_and_zip_partners_held_together():
    import numpy as np
    import pandas as pd

    from staleness_sim.sweeps.plot_data import SweepData, pareto

    x = np.array([0.0, 0.5, 1.0, 1.0, 2.0])
    y = np.array([1.0, 0.9, 1.5, 1.2, 1.4])
    # (0.5, 0.9) is beaten by (0, 1.0); (1, 1.2) by (1, 1.5); (2, 1.4) by (1, 1.5)
    assert sorted(pareto(x, y).tolist()) == [0, 2]
    results = pd.DataFrame(
        {
            "a.shape": [1.5, 2.0, 1.5, 2.0],
            "a.scale": [22.0, 44.0, 22.0, 44.0],
            "workers": [4, 4, 8, 8],
            "policy_label": ["p"] * 4,
            "scenario": ["{}"] * 4,
        }
    )
    data = SweepData(
        results,
        axes=("workers", "a.shape", "a.scale"),
        base={"workers": 8},
        zip_groups=(("a.shape", "a.scale"),),
    )
    kept, held = data.slice(("a.shape",))
    assert kept["a.scale"].tolist() == [22.0, 44.0] and held == "workers=8"
