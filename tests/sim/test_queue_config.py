"""Queue-pipeline scenarios: the public keys, the default pipeline left alone, and every kind
of bad input (exit status 2, one line naming the field)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from staleness_sim import load_scenario
from staleness_sim.config import ConfigError, Scenario, scenario_dict, validate
from staleness_sim.queue.config import QueueScenario
from staleness_sim.summary import run_summary

ROOT = Path(__file__).resolve().parents[2]
SIM = ROOT / "configs" / "sim"

SMALL = {
    "pipeline": "queue",
    "name": "small",
    "seed": 1,
    "updates": 40,
    "rollout": {
        "concurrency": 32,
        "group_size": 4,
        "sample": {"dist": "lognormal", "mean": 1.0, "cv": 0.5},
    },
    "trainer": {"batch": 16, "step": {"dist": "constant", "value": 0.6}},
    "queue": {"capacity": 2, "rule": "drop_oldest", "max_staleness": None},
    "in_flight_updates": False,
}
CONTRACT_KEYS = (
    "mean_staleness",
    "staleness_hist",
    "rho",
    "m_tail",
    "trainer_idle_fraction",
    "rollout_idle_fraction",
    "samples_dropped",
    "mean_generated_duration",
    "mean_consumed_duration",
)


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "staleness_sim.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL, sort_keys=False))
    return path


def test_run_json_has_the_contract_keys_and_the_cohort_keys(small):
    r = cli("run", small, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in CONTRACT_KEYS:
        assert key in out, key
    assert out["updates"] == 40 and out["results_accepted"] == 40 * 16
    assert out["staleness_hist"] == out["lag_hist"]
    assert out["mean_staleness"] == pytest.approx(out["mean_lag"])
    assert out["samples_dropped"] == out["results_discarded"]
    # rho set by the scenario: C * step / (B * mean length) = 32 * 0.6 / 16 = 1.2
    assert out["rho"] == pytest.approx(1.2, rel=0.05)


def test_readable_summary_and_trace_folder(small, tmp_path):
    r = cli("run", small, "--out", tmp_path / "run")
    assert r.returncode == 0, r.stderr
    assert "mean staleness" in r.stdout and "rho (rollout / trainer)" in r.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["mean_staleness"] >= 0
    for table in ("jobs", "updates", "workers"):
        assert (tmp_path / "run" / f"{table}.parquet").exists()


def test_the_issue_keys_load_as_written():
    sc = load_scenario(SIM / "queue_grpo.yaml")
    assert isinstance(sc, QueueScenario)
    assert (sc.rollout.concurrency, sc.rollout.group_size, sc.trainer.batch) == (128, 8, 128)
    assert sc.queue.capacity == 2 and sc.queue.rule == "drop_oldest"
    assert sc.queue.max_staleness is None and sc.in_flight_updates is False
    assert sc.capacity_samples == 256


def test_scenario_round_trips_with_an_unbounded_queue():
    data = {**SMALL, "queue": {"capacity": None, "rule": "max_staleness", "max_staleness": 2}}
    sc = validate(data)
    again = validate(scenario_dict(sc))
    assert again == sc and again.queue.capacity is None


@pytest.mark.parametrize("name", ["paper_sync", "paper_async1", "paper_async4", "paper_async8"])
def test_the_default_pipeline_is_the_cohort_engine_unchanged(name):
    plain = load_scenario(SIM / f"{name}.yaml")
    explicit = load_scenario(SIM / f"{name}.yaml", ["pipeline=cohort"])
    assert isinstance(plain, Scenario) and explicit == plain
    assert "pipeline" not in scenario_dict(plain)  # sweep keys of existing scenarios unchanged


def test_cohort_pipeline_summaries_gain_no_keys(tiny_cohort):
    s = run_summary(tiny_cohort)
    assert not set(CONTRACT_KEYS) & set(s)


@pytest.fixture
def tiny_cohort():
    return validate(
        {
            "workers": 2,
            "cohort": 2,
            "updates": 3,
            "policy": {"kind": "sync"},
            "job": {"duration": {"dist": "exponential", "mean": 1.0}},
        }
    )


BAD = [
    ("pipeline=queued", "pipeline: must be one of cohort, queue (got 'queued')"),
    ("rollout.concurency=4", "rollout.concurency: unknown key (allowed: concurrency, group_size"),
    ("rollout.concurrency=0", "rollout.concurrency: Input should be greater than or equal to 1"),
    ("rollout.group_size=3", "trainer.batch: must be a multiple of rollout.group_size (3)"),
    ("trainer.batch=two", "trainer.batch: Input should be a valid integer"),
    ("trainer.step={dist: constant, value: 0}", "trainer.step: a step must take time"),
    ("trainer.step={dist: normal, mean: 1}", "trainer.step: Input tag 'normal' found using 'dist'"),
    ("queue.rule=lifo", "queue.rule: Input should be 'block', 'drop_oldest', 'max_staleness'"),
    ("queue.capacity=0.5", "queue.capacity: Input should be greater than or equal to 1"),
    ("queue.rule=max_staleness", "queue.max_staleness: required by rule max_staleness"),
    ("queue.admission=true", "queue.max_staleness: required by queue.admission"),
    ("queue.max_staleness=2", "queue.max_staleness: only used by rule max_staleness"),
    ("queue.max_staleness=-1", "queue.max_staleness: Input should be greater than or equal to 0"),
    ("queue.policy={kind: sync}", "queue.policy: only used by rule cohort"),
    ("queue.rule=cohort", "queue.policy: required by rule cohort"),
    ("rollout.job={duration: {dist: constant, value: 1}}", "rollout: give exactly one of sample"),
    ("rollout.sample={dist: constant, value: 0}", "rollout.sample: durations must not all be 0"),
    ("in_flight_updates=maybe", "in_flight_updates: Input should be a valid boolean"),
    ("workers=4", "workers: unknown key (allowed: pipeline, name, seed, updates, rollout"),
]


@pytest.mark.parametrize("assignment,message", BAD, ids=[b[0] for b in BAD])
def test_bad_input_exits_2_with_one_line_naming_the_field(small, assignment, message):
    r = cli("run", small, "--set", assignment)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"staleness-sim: error: {small}: ")
    assert message in lines[0], lines[0]


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            {"queue": {"rule": "cohort", "policy": {"kind": "sync"}}, "rollout.group_size": 2},
            "rollout.group_size: rule cohort takes groups of one job (got 2)",
        ),
        (
            {
                "queue": {"rule": "cohort", "policy": {"kind": "sync"}, "capacity": 2},
                "rollout.group_size": 1,
            },
            "queue.capacity: not used by rule cohort",
        ),
        (
            {
                "queue": {"rule": "cohort", "policy": {"kind": "sync"}},
                "rollout.group_size": 1,
                "in_flight_updates": True,
            },
            "in_flight_updates: not available with rule cohort",
        ),
        (
            {"in_flight_updates": True, "rollout.sync_seconds": 1.0},
            "rollout.sync_seconds: not modelled with in_flight_updates",
        ),
        (
            {
                "queue": {
                    "rule": "cohort",
                    "policy": {"kind": "bounded", "max_lag": 1, "max_lagg": 1},
                },
                "rollout.group_size": 1,
            },
            "queue.policy.max_lagg: unknown key (allowed: kind, max_lag, on_stale)",
        ),
    ],
)
def test_cross_field_mistakes_name_their_field(overrides, message):
    from staleness_sim.config import with_overrides

    with pytest.raises(ConfigError) as e:
        validate(with_overrides(SMALL, overrides), "s.yaml")
    assert str(e.value).startswith(f"s.yaml: {message}"), str(e.value)


def test_sweep_points_are_validated_with_the_queue_rules(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {"base": SMALL, "grid": {"rollout.group_size": [4, 5]}, "seeds": [0]}, sort_keys=False
        )
    )
    r = cli("sweep", sweep, "--out", tmp_path / "out", "--jobs", "1", "--no-progress")
    assert r.returncode == 2
    assert "point 1 (rollout.group_size=5): trainer.batch: must be a multiple" in r.stderr
    assert not (tmp_path / "out").exists()
