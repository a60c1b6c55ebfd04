"""The turn model (``job: {episodes, concurrency, turns, engine}``): the engine model's closed
cases, the flat curve against today's independent episodes, and bad input.

Every expected value is worked out by hand here from the curve and the token counts."""

from __future__ import annotations

import heapq

import numpy as np
import pytest
import yaml

from staleness_sim import simulate
from staleness_sim.cli import main
from staleness_sim.cohort.config import validate_cohort
from staleness_sim.durations import Engine, EngineSpec, make_job, makespan

CURVE = {"batch": [1, 2, 4], "step_s": [0.01, 0.015, 0.03]}  # s per decode step


def job_of(job: dict):
    base = {"workers": 1, "cohort": 1, "updates": 1, "policy": {"kind": "sync"}}
    return make_job(validate_cohort({**base, "job": job}).job)


def table(**cols) -> dict:
    n = len(cols["turns"])
    for key in ("prompt_tokens", "reply_tokens", "command_s"):
        cols.setdefault(key, [0.0] * n)
    return cols


def durations(job, n=3, seed=0) -> np.ndarray:
    return job.sample(np.random.default_rng(seed), n)


def test_one_sequence_alone_decodes_at_the_batch_1_rate():
    # one turn: prefill 50 tokens at 1 ms, decode 100 tokens at 10 ms, command 0.3 s
    job = job_of(
        {
            "episodes": 1,
            "concurrency": 1,
            "turns": {
                "table": table(turns=[1], prompt_tokens=[50], reply_tokens=[100], command_s=[0.3])
            },  # fmt: skip
            "engine": {"curve": CURVE, "prefill_s_per_token": 0.001},
        }
    )
    assert durations(job) == pytest.approx([0.05 + 1.0 + 0.3] * 3, rel=1e-12)


def test_k_identical_turns_that_start_together_end_together_at_the_batch_k_rate():
    for k, step in ((2, 0.015), (4, 0.03), (3, 0.0225)):  # batch 3: halfway from 2 to 4
        job = job_of(
            {
                "episodes": k,
                "concurrency": k,
                "turns": {"table": table(turns=[2], reply_tokens=[100], command_s=[0.5])},
                "engine": {"curve": CURVE},
            }
        )
        # two turns, each: all k decode 100 tokens together, then run their command
        assert durations(job) == pytest.approx([2 * (100 * step + 0.5)] * 3, rel=1e-12)


def test_a_turn_that_joins_midway_slows_the_others_by_the_curves_ratio():
    # A decodes 100 tokens from t = 0; B joins after a 0.5 s start. A alone: 0.5 s = 50
    # tokens at 0.01; then both at 0.015 s a step, so A's rest takes 0.015 / 0.01 longer.
    joined = {"episodes": 2, "concurrency": 2, "engine": {"curve": CURVE}}
    # B with 50 tokens: both finish their last 50 together, at 0.5 + 50 * 0.015
    same_end = table(turns=[1, 1], reply_tokens=[100, 50], start_s=[0.0, 0.5], order="cycle")
    assert durations(job_of({**joined, "turns": {"table": same_end}})) == pytest.approx(
        [0.5 + 50 * 0.015] * 3, rel=1e-12
    )
    # B with 20 tokens: B ends at 0.8 (A has done 70), then A alone for its last 30
    early = table(turns=[1, 1], reply_tokens=[100, 20], start_s=[0.0, 0.5], order="cycle")
    assert durations(job_of({**joined, "turns": {"table": early}})) == pytest.approx(
        [0.5 + 20 * 0.015 + 30 * 0.01] * 3, rel=1e-12
    )


def test_a_cpu_share_needs_the_turn_model():
    with pytest.raises(ValueError, match="cpu .* needs turns"):
        job_of({"duration": {"dist": "constant", "value": 1}, "cpu": {"cores": 2}})
    with pytest.raises(ValueError, match="cores"):
        job_of(
            {
                "episodes": 1,
                "concurrency": 1,
                "turns": {"table": table(turns=[1])},
                "engine": {"curve": CURVE},
                "cpu": {"cores": 0},
            }
        )


def hand_makespan(episodes: list[float], sessions: int) -> float:
    free = [0.0] * sessions
    for d in episodes:  # the next episode goes to the first session to free up
        heapq.heapreplace(free, free[0] + d)
    return max(free)


@pytest.mark.parametrize("timeout", [None, 2.0])
def test_a_flat_curve_reproduces_the_independent_episode_makespan(timeout):
    rng = np.random.default_rng(7)
    n, d, c, step = 9, 23, 4, 0.02
    cols = table(
        turns=[int(x) for x in rng.integers(1, 6, n)],
        prompt_tokens=[float(x) for x in rng.integers(10, 500, n)],
        reply_tokens=[float(x) for x in rng.integers(1, 64, n)],
        command_s=[float(x) for x in rng.uniform(0, 0.3, n)],
        start_s=[float(x) for x in rng.uniform(0, 0.2, n)],
        end_s=[float(x) for x in rng.uniform(0, 0.4, n)],
        order="cycle",
    )
    prefill = 1e-4
    turns = {"table": cols} | ({"timeout_s": timeout} if timeout else {})
    engine = {"curve": {"batch": [1, 8], "step_s": [step, step]}, "prefill_s_per_token": prefill}
    job = job_of({"episodes": d, "concurrency": c, "turns": turns, "engine": engine})
    # episode j is row j mod n; alone or not, its turns cost prefill + decode + command
    each = [
        cols["start_s"][i]
        + cols["turns"][i]
        * (
            prefill * cols["prompt_tokens"][i]
            + step * cols["reply_tokens"][i]
            + cols["command_s"][i]
        )
        + cols["end_s"][i]
        for i in (j % n for j in range(d))
    ]
    if timeout:
        assert max(each) > timeout  # the cut matters
        each = [min(x, timeout) for x in each]
    expected = hand_makespan(each, c)
    got = durations(job, n=5)
    assert got == pytest.approx([expected] * 5, rel=1e-12)
    assert makespan(np.array([each]), c)[0] == pytest.approx(expected, rel=1e-12)


def test_drawn_turns_on_a_flat_curve_match_the_episodic_job_in_distribution():
    # constant parts: every episode takes 3 * (10 * 0.02 + 0.1) = 0.9 s
    job = job_of(
        {
            "episodes": 10,
            "concurrency": 4,
            "turns": {
                "count": {"dist": "constant", "value": 3},
                "prompt_tokens": {"dist": "constant", "value": 0},
                "reply_tokens": {"dist": "constant", "value": 10},
                "command_s": {"dist": "constant", "value": 0.1},
            },
            "engine": {"curve": {"batch": [1], "step_s": [0.02]}},
        }
    )
    assert durations(job) == pytest.approx([3 * 0.9] * 3, rel=1e-12)  # ceil(10 / 4) rounds


def test_roofline_step_and_prefill_by_hand():
    r = {"params": 7.6e9, "bytes_per_param": 2, "kv_bytes_per_token": 57344,
         "bandwidth": 4.8e12, "flops": 989e12}  # fmt: skip
    e = Engine(EngineSpec.model_validate({"roofline": r}))
    weights = 7.6e9 * 2 / 4.8e12  # 3.17 ms: reading the weights once
    assert e.step_s(np.array([1]), np.array([0.0]))[0] == pytest.approx(weights)
    assert e.step_s(np.array([8]), np.array([1e5]))[0] == pytest.approx(
        weights + 1e5 * 57344 / 4.8e12
    )
    # compute-bound when 2 * params * batch / flops exceeds the memory time: batch > ~206
    assert e.step_s(np.array([400]), np.array([0.0]))[0] == pytest.approx(2 * 7.6e9 * 400 / 989e12)
    assert e.prefill_s_per_token == pytest.approx(2 * 7.6e9 / 989e12)


def test_beyond_the_curve_the_last_segment_continues():
    e = Engine(EngineSpec.model_validate({"curve": CURVE, "context_s_per_token": 1e-6}))
    got = e.step_s(np.array([1, 3, 8]), np.array([0.0, 0.0, 1000.0]))
    assert got == pytest.approx([0.01, 0.0225, 0.03 + 4 * 0.0075 + 1e-3])


def test_existing_scenarios_are_untouched_and_the_turn_model_runs_in_the_engine(tmp_path):
    job = {
        "episodes": 8,
        "concurrency": 4,
        "turns": {"table": table(turns=[2, 3], reply_tokens=[40, 60], command_s=[0.2, 0.4])},
        "engine": {"curve": CURVE},
    }
    sc = validate_cohort(
        {"workers": 2, "cohort": 2, "updates": 5, "policy": {"kind": "sync"}, "job": job}
    )
    trace = simulate(sc)
    assert (trace.updates["version"].max(), len(trace.jobs)) == (5, 10)


BASE = {"name": "t", "workers": 2, "cohort": 2, "updates": 2, "policy": {"kind": "sync"}}
GOOD_JOB = {
    "episodes": 4,
    "concurrency": 2,
    "turns": {"table": table(turns=[2], reply_tokens=[10])},
    "engine": {"curve": CURVE},
}
BAD = [
    ({"engine": {"curve": {"batch": [1, 2, 4], "step_s": [0.01, 0.03, 0.02]}}},
     "job.engine.curve.step_s: step time must not decrease as the batch grows"),
    ({"engine": {"curve": {"batch": [1, 4, 2], "step_s": [0.01, 0.02, 0.03]}}},
     "job.engine.curve.batch: batch sizes must increase"),
    ({"engine": {"curve": {"batch": [1, 2], "step_s": [0.01]}}}, "job.engine.curve.step_s"),
    ({"turns": {"table": table(turns=[2], reply_tokens=[-3])}},
     "job.turns.table.reply_tokens: token counts must be >= 0"),
    ({"turns": {"table": table(turns=[2], prompt_tokens=[-1])}}, "job.turns.table.prompt_tokens"),
    ({"engine": {"roofline": {"params": 7.6e9, "bytes_per_param": 2, "kv_bytes_per_token": 0,
                              "flops": 1e15}}},
     "job.engine.roofline.bandwidth: required field is missing"),
    ({"engine": None}, "job: turns and engine go together"),
    ({"episode": {"dist": "constant", "value": 1}}, "job: give either episode or turns"),
    ({"turns": {"count": {"dist": "constant", "value": 2}}}, "job.turns: needs a table"),
]  # fmt: skip


@pytest.mark.parametrize(
    "change, needle", BAD, ids=[n.split(":")[0] + str(i) for i, (_, n) in enumerate(BAD)]
)
def test_bad_turn_model_input_exits_2_with_one_line_naming_the_field(
    tmp_path, capsys, change, needle
):
    job = {k: v for k, v in {**GOOD_JOB, **change}.items() if v is not None}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**BASE, "job": job}))
    assert main(["run", str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines


def test_an_episode_cut_by_its_timeout_leaves_the_batch_at_once():
    # timeout 3 s. A decodes 1000 tokens from 0 (cut at 3). B starts 0.5 s late and
    # decodes 50 tokens beside A (batch 2): ends at 0.5 + 50 * 0.015 = 1.25. C takes B's
    # session at 1.25 with 200 tokens: 1.75 s at batch 2 (116.67 tokens) until A is cut at
    # 3.0, then alone at 0.01 s a step for the other 83.33.
    rows = table(turns=[1, 1, 1], reply_tokens=[1000, 50, 200], start_s=[0, 0.5, 0], order="cycle")
    job = job_of(
        {
            "episodes": 3,
            "concurrency": 2,
            "turns": {"table": rows, "timeout_s": 3.0},
            "engine": {"curve": CURVE},
        }
    )
    with_a = (3.0 - 1.25) / 0.015
    assert durations(job) == pytest.approx([3.0 + (200 - with_a) * 0.01] * 3, rel=1e-12)


def test_the_queue_pipeline_refuses_a_turn_model_job_in_one_line(tmp_path, capsys):
    data = {
        "pipeline": "queue",
        "updates": 5,
        "rollout": {"concurrency": 4, "group_size": 1, "job": GOOD_JOB},
        "trainer": {"batch": 4, "step": {"dist": "constant", "value": 1.0}},
        "queue": {"capacity": 2, "rule": "block"},
    }
    path = tmp_path / "q.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["run", str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "turn-model job" in lines[0], lines


def test_drawn_episodes_take_each_parts_stream_in_order():
    """A block's episodes are drawn before it is simulated, part by part, in one stream:
    every episode's turn count, then every turn's prompt, reply and command; episode e
    of job j holds turns first[j * D + e] onwards."""
    from staleness_sim.durations.turns import TurnsSpec, _Drawn

    spec = TurnsSpec.model_validate(
        {
            "count": {"dist": "lognormal", "median": 3, "sigma": 0.7, "cap": 9},
            "prompt_tokens": {"dist": "lognormal", "median": 100, "sigma": 0.5},
            "reply_tokens": {"dist": "exponential", "mean": 20},
            "command_s": {"dist": "constant", "value": 1.5},
        }
    )
    eps = _Drawn(spec).block(np.random.default_rng(5), 3, 4)
    rs = np.random.default_rng(5)
    counts = np.maximum(1, np.rint(np.minimum(np.exp(np.log(3) + 0.7 * rs.standard_normal(12)), 9)))
    np.testing.assert_array_equal(eps.turns, counts)
    total = int(counts.sum())
    np.testing.assert_allclose(
        eps.prompt, 100 * np.exp(0.5 * rs.standard_normal(total)), rtol=1e-14
    )
    np.testing.assert_allclose(eps.reply, rs.exponential(20, total), rtol=1e-14)
    np.testing.assert_array_equal(eps.command, np.full(total, 1.5))
    np.testing.assert_array_equal(eps.first, np.concatenate([[0], np.cumsum(counts)[:-1]]))
    np.testing.assert_array_equal(eps.start, np.zeros(12))
