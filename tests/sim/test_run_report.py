"""One report of one run (``staleness-sim report RUN_DIR``): every figure is drawn from the
trace, checked on the figures' own data against the trace tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from staleness_sim.cli import main
from staleness_sim.config import load_scenario
from staleness_sim.core.trace import Trace
from staleness_sim.run_report import FIGURES, default_window, run_figures, write_run_report
from staleness_sim.summary import simulate_scenario

REPO = Path(__file__).resolve().parents[2]
MEASURED = REPO / "examples/runs/cpu_tiny_bounded"


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sim") / "async1"
    scenario = load_scenario(REPO / "configs/sim/paper_async1.yaml", ["updates=40", "workers=6"])
    simulate_scenario(scenario).write(out)
    return out


def drawn_widths(ax, gid: str) -> float:
    """The total width of the bars a collection drew (from its paths, not its input)."""
    total = 0.0
    for coll in ax.collections:
        if coll.get_gid() == gid:
            for path in coll.get_paths():
                x = path.vertices[:, 0]
                total += x.max() - x.min()
    return total


def state_time(trace: Trace, window) -> pd.DataFrame:
    w = trace.workers
    lo, hi = window
    spent = (np.minimum(w["end"], hi) - np.maximum(w["start"], lo)).clip(lower=0)
    return spent.groupby([w["worker"], w["state"]]).sum()


def check_timeline(ax, trace: Trace, window) -> None:
    expected = state_time(trace, window)
    for (worker, state), seconds in expected.items():
        assert drawn_widths(ax, f"{state}/{worker}") == pytest.approx(seconds, rel=1e-9)
    assert ax.get_xlim() == pytest.approx(window)


def figures(trace, evaluations=None, **kw) -> dict:
    return {d.stem: d for d in run_figures(trace, evaluations, **kw)}


def test_a_simulated_run_draws_every_figure_it_can(simulated):
    trace = Trace.read(simulated)
    whole = (0.0, float(trace.workers["end"].max()))
    drawn = figures(trace, window=whole)
    # the timeline: each worker's busy, idle and syncing time is the trace's
    check_timeline(drawn["timeline"].figure.axes[0], trace, whole)
    # stale results are marked: as many markers as used results with lag > 0
    stale = ((trace.jobs["verdict"] == "accepted") & (trace.jobs["lag"] > 0)).sum()
    ax = drawn["timeline"].figure.axes[0]
    marks = [c for c in ax.collections if c.get_gid() == "stale/accepted"]
    assert stale > 0 and len(marks[0].get_offsets()) == stale
    # the lag histogram: the used results' lags
    bars = drawn["lag_histogram"].figure.axes[0].patches
    counts = trace.jobs.loc[trace.jobs["verdict"] == "accepted", "lag"].value_counts()
    assert {round(b.get_x() + b.get_width() / 2): b.get_height() for b in bars} == counts.to_dict()
    # results and updates against wall time: the curves end at the trace's counts
    a1, a2 = drawn["progress"].figure.axes
    lines = {line.get_gid(): line for line in a1.lines + a2.lines}
    assert lines["used"].get_ydata()[-1] == (trace.jobs["verdict"] == "accepted").sum()
    assert lines["updates"].get_ydata()[-1] == len(trace.updates) == 40
    assert lines["updates"].get_xdata()[-1] == trace.updates["time"].max()
    # idle over time: the binned shares add up to the trace's idle time
    (ax,) = drawn["idle_fraction"].figure.axes
    idle = next(line for line in ax.lines if line.get_gid() == "share/idle")
    width = whole[1] / 40
    n = trace.workers["worker"].nunique()
    assert np.sum(idle.get_ydata()) * width * n == pytest.approx(
        state_time(trace, whole).xs("idle", level="state").sum(), rel=1e-9
    )
    # a simulated run has no rewards and no evaluation: said, not drawn
    assert drawn["reward_vs_lag"].figure is None and "reward" in drawn["reward_vs_lag"].note
    assert drawn["held_out_success"].figure is None


def test_a_long_run_shows_a_window_of_its_first_updates(simulated):
    trace = Trace.read(simulated)
    window = default_window(trace)
    assert window == (0.0, float(trace.updates["time"].sort_values().iloc[29]))
    check_timeline(figures(trace)["timeline"].figure.axes[0], trace, window)


def test_a_measured_run_draws_every_figure(tmp_path):
    trace = Trace.read(MEASURED)
    evaluations = pd.read_parquet(MEASURED / "eval.parquet")
    drawn = figures(trace, evaluations)
    assert all(d.figure is not None for d in drawn.values()), [d.note for d in drawn.values()]
    check_timeline(drawn["timeline"].figure.axes[0], trace, default_window(trace))
    # held-out success against the update and the wall time
    by_version, by_time = drawn["held_out_success"].figure.axes
    expected = evaluations.groupby("version")["passed"].mean()
    line = by_version.lines[0]
    assert list(line.get_xdata()) == list(expected.index)
    assert list(line.get_ydata()) == pytest.approx(expected.to_list())
    when = dict(zip(trace.updates["version"], trace.updates["time"], strict=True)) | {0: 0.0}
    assert list(by_time.lines[0].get_xdata()) == [when[v] for v in expected.index]
    # reward against lag: the mean at each lag
    (ax,) = drawn["reward_vs_lag"].figure.axes
    mean = next(line for line in ax.lines if line.get_gid() == "mean_reward")
    used = trace.jobs[trace.jobs["verdict"].isin(["accepted", "dropped"])]
    assert list(mean.get_ydata()) == pytest.approx(used.groupby("lag")["reward"].mean().to_list())
    # the files: report.md, report.html and one PNG per figure
    paths = write_run_report(MEASURED, tmp_path)
    assert {p.name for p in paths} == {"report.md", "report.html", "timeline.png"} | {
        f"{stem}.png" for stem in FIGURES
    }
    html = (tmp_path / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(FIGURES) + 1


def test_the_prediction_is_drawn_below_the_measurement(simulated, tmp_path):
    trace, predicted = Trace.read(MEASURED), Trace.read(simulated)
    window = (0.0, 150.0)
    fig = figures(trace, predicted=predicted, window=window)["timeline"].figure
    measured_ax, predicted_ax = fig.axes
    check_timeline(measured_ax, trace, window)
    check_timeline(predicted_ax, predicted, window)


def test_cli_dispatches_on_the_folder_and_run_report_is_one_step(tmp_path, capsys):
    out = tmp_path / "run"
    config = str(REPO / "configs/sim/paper_sync.yaml")
    assert main(["run", config, "--set", "updates=5", "--out", str(out), "--report"]) == 0
    assert (out / "report" / "timeline.png").is_file() and (out / "report/report.html").is_file()
    assert main(["report", str(MEASURED), "--out", str(tmp_path / "m"), "--format", "md"]) == 0
    assert (tmp_path / "m" / "report.md").is_file() and not (tmp_path / "m/report.html").exists()
    capsys.readouterr()
    assert main(["report", str(tmp_path)]) == 2
    assert "no results.parquet" in capsys.readouterr().err
    assert main(["run", config, "--report"]) == 2
    assert "--out" in capsys.readouterr().err
    assert main(["report", str(MEASURED), "--window", "9:3", "--out", str(tmp_path / "w")]) == 2
