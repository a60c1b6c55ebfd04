"""The success model on the command line: run, compare, fit --learning, sweeps, bad input."""

import json

import numpy as np
import pandas as pd
import pytest
import yaml

from staleness_sim.cli import main
from staleness_sim.cohort.config import validate_cohort
from staleness_sim.cohort.engine import simulate
from staleness_sim.learning.model import learn
from staleness_sim.learning.schedule import schedule_from_trace
from staleness_sim.learning.spec import LearningSpec
from staleness_sim.sweeps.report import point_table
from staleness_sim.sweeps.run import run_sweep, summary_of_row

SMALL = {
    "name": "small",
    "seed": 1,
    "workers": 2,
    "cohort": 6,
    "updates": 8,
    "policy": {"kind": "sync"},
    "job": {"episodes": 16, "concurrency": 4,
            "episode": {"dist": "lognormal", "median": 20, "sigma": 1.0}},
}  # fmt: skip
LEARNING = {"effect": 300.0, "sigma": 0.01, "alpha": 0.01, "dimension": 16, "target": 0.1}


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    return path


@pytest.fixture
def learning(tmp_path):
    path = tmp_path / "learning.yaml"
    path.write_text(yaml.safe_dump({**SMALL, "learning": LEARNING}))
    return path


def run_json(capsys, *args):
    assert main(["run", *map(str, args), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_run_json_gains_the_success_keys_only_with_learning(small, learning, capsys):
    plain = run_json(capsys, small)
    assert not any(k.startswith(("success", "hours_to")) for k in plain)
    out = run_json(capsys, learning)
    assert {k: out[k] for k in plain} == plain  # the schedule's numbers are unchanged
    curve = out["success_curve"]
    assert [v for v, _ in curve] == list(range(9))
    assert out["success_initial"] == curve[0][1] and out["success_final"] == curve[-1][1]
    assert out["success_initial"] == pytest.approx(0.093, abs=1e-9)
    assert out["hours_to_success"] is None or out["hours_to_success"] > 0


@pytest.mark.parametrize(
    "key, value",
    [("dimension", -1), ("base_rate", 1.5), ("base_rate", 0.0), ("target", 1.2),
     ("shaping", "softmax")],
)  # fmt: skip
def test_bad_learning_input_exits_2_naming_the_field(learning, capsys, key, value):
    assert main(["run", str(learning), "--set", f"learning.{key}={value}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"learning.{key}" in err


def test_learning_needs_episodes_where_the_job_has_none(tmp_path, capsys):
    data = {**SMALL, "job": {"duration": {"dist": "exponential", "mean": 5}}, "learning": {}}
    path = tmp_path / "direct.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["run", str(path)]) == 2
    assert "learning.episodes" in capsys.readouterr().err
    assert run_json(capsys, path, "--set", "learning.episodes=8")["success_curve"]


def test_compare_gains_success_columns(learning, capsys):
    assert main(["compare", str(learning), "--workers", "1", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert all("success %" in r and "h to target" in r for r in rows)
    assert main(["compare", str(learning)]) == 0
    assert "success %" in capsys.readouterr().out


def test_sweep_results_and_report_take_success_with_a_seed_spread(learning, tmp_path):
    sweep = {"base": str(learning), "grid": {"workers": [1, 2]}, "seeds": [0, 1]}
    out = run_sweep(sweep, tmp_path / "sw", jobs=1, progress=False)
    res = out.results
    assert res["success_final"].between(0, 1).all()
    row = summary_of_row(res.iloc[0])
    assert row["success_curve"][0][0] == 0 and len(row["success_curve"]) == 9
    table = point_table(res, ("workers",))
    assert {"success %", "success sd", "h to target"} <= set(table.columns)
    never = res.assign(hours_to_success=None)  # no seed reaches the target
    assert set(point_table(never, ("workers",))["h to target"]) == {"never"}


# -- fit --learning ---------------------------------------------------------------------


def measured_run(folder, effect):
    """A hand-made run directory: a simulated schedule written as a measured trace
    (signs, seeds, episodes per job), its config's es block, and an eval.parquet whose
    curve is the model's own mean at ``effect`` (so the fit must recover it)."""
    sc = validate_cohort({**SMALL, "updates": 10, "learning": {**LEARNING, "effect": effect}})
    trace = simulate(sc)
    trace.jobs["sign"] = 1
    trace.jobs["episodes"] = 16
    trace.write(folder)
    es = {"sigma": 0.01, "alpha": 0.01, "shaping": "zscore", "antithetic": False}
    (folder / "config.yaml").write_text(yaml.safe_dump({"es": es}))
    sched = schedule_from_trace(trace, 16, False)
    spec = LearningSpec(**{**LEARNING, "effect": effect})
    curve = np.mean([learn(sched, spec, s).success for s in range(2)], axis=0)
    rows = [{"version": v, "seed": 1, "task": t, "passed": float(t < curve[v] * 1000) }
            for v in (0, 5, 10) for t in range(1000)]  # fmt: skip
    pd.DataFrame(rows).to_parquet(folder / "eval.parquet")
    trace.updates["mean_reward"] = 0.1
    trace.updates.to_parquet(folder / "updates.parquet")
    return curve


def test_fit_learning_recovers_the_effect_of_a_run(tmp_path, capsys):
    folder = tmp_path / "run"
    curve = measured_run(folder, effect=300.0)
    assert curve[-1] > curve[0] + 0.01  # there is a gain to fit
    args = ["fit", "--learning", str(folder), "--seeds", "2", "--json"]
    args += ["--set", "learning.dimension=16"]  # as made; sigma, alpha come from config.yaml
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["learning"]["effect"] == pytest.approx(300.0, rel=0.15)
    assert out["learning"]["base_rate"] == pytest.approx(curve[0], abs=1e-3)
    assert not out["no_gain"] and "train_reward" in out


def test_fit_learning_of_a_run_without_gain_is_effect_zero(tmp_path, capsys):
    folder = tmp_path / "run"
    measured_run(folder, effect=300.0)
    ev = pd.read_parquet(folder / "eval.parquet")
    ev.loc[ev["version"] > 0, "passed"] = 0.0  # success falls
    ev.to_parquet(folder / "eval.parquet")
    assert main(["fit", "--learning", str(folder), "--seeds", "2"]) == 0
    text = capsys.readouterr().out
    assert "effect: 0.0" in text and "no gain" in text


def test_fit_learning_of_a_scenario_meets_its_endpoints(learning, capsys):
    args = ["fit", "--learning", str(learning), "--endpoints", "0.1", "0.2", "--seeds", "2"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    last = out["versions"][-1]
    assert last["version"] == 8 and last["predicted"] == pytest.approx(0.2, abs=0.01)


def test_fit_learning_refuses_scenario_fields_for_a_run(tmp_path, capsys):
    folder = tmp_path / "run"
    measured_run(folder, effect=100.0)
    assert main(["fit", "--learning", str(folder), "--set", "workers=3"]) == 2
    assert "learning" in capsys.readouterr().err
