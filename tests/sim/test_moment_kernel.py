"""The CPU shared moment by moment (``job.cpu``): the shares against a general
water-filling written here (an independent oracle), closed cases worked out by hand, the plain turn model where
the cores suffice, the compiled loop against plain Python, and bad input."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from pydantic import ValidationError

from staleness_sim.cohort.config import validate_cohort
from staleness_sim.durations import make_job
from staleness_sim.durations.moment_kernel import shares

BASE = {"workers": 1, "cohort": 1, "updates": 1, "policy": {"kind": "sync"}}
DRAWN = {
    "count": {"dist": "lognormal", "median": 4, "sigma": 0.6, "cap": 10},
    "prompt_tokens": {"dist": "lognormal", "median": 300, "sigma": 0.5},
    "reply_tokens": {"dist": "lognormal", "median": 40, "sigma": 0.8, "cap": 200},
    "command_s": {"dist": "lognormal", "median": 0.5, "sigma": 1, "cap": 5},
    "start_s": {"dist": "exponential", "mean": 1},
    "end_s": {"dist": "constant", "value": 0.3},
}
CURVE = {"curve": {"batch": [1, 4], "step_s": [0.01, 0.016]}, "prefill_s_per_token": 1e-4}


def job_of(turns, cpu, episodes=4, concurrency=2, engine=None):
    job = {"episodes": episodes, "concurrency": concurrency, "turns": turns}
    job |= {"engine": engine or {"curve": {"batch": [1], "step_s": [0.01]}}}
    job |= {"cpu": cpu} if cpu is not None else {}
    return make_job(validate_cohort({**BASE, "job": job}).job)


def rows(*episodes):
    """A table of one-turn episodes (start seconds, reply tokens), taken in order."""
    n = len(episodes)
    return {
        "table": {
            "turns": [1] * n,
            "prompt_tokens": [0.0] * n,
            "reply_tokens": [float(r) for _, r in episodes],
            "command_s": [0.0] * n,
            "start_s": [float(s) for s, _ in episodes],
            "order": "cycle",
        }
    }


def water_fill(wants: list[float], cores: float) -> list[float]:
    """Max-min fair shares, by raising a level until the cores are spent (bisection)."""
    if sum(wants) <= cores:
        return list(wants)
    lo, hi = 0.0, max(wants)
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(min(w, mid) for w in wants) < cores else (lo, mid)
    return [min(w, hi) for w in wants]


@pytest.mark.parametrize("cores", [0.5, 1.0, 2.0, 3.5])
def test_the_shares_are_max_min_fair(cores):
    # a timed thread wants a core; its rate is its share of it
    for n, batch, threads, demand in itertools.product(
        range(7), (0, 1, 5), (1, 2, 4), (0.3, 1.0, 1.7, 2.0, 5.0)
    ):
        engine = [demand / threads] * threads if batch else []
        got = water_fill([1.0] * n + engine, cores)
        timed = got[0] if n else 1.0
        expect_engine = sum(got[n:]) / demand if batch else 1.0
        r_timed, r_engine = shares(n, batch, cores, threads, demand)
        case = (n, batch, threads, demand, cores)
        assert r_timed == pytest.approx(timed, rel=1e-9, abs=1e-12), case
        assert r_engine == pytest.approx(expect_engine, rel=1e-9), case


def test_timed_parts_alone_share_the_cores_evenly():
    # three sessions with a 1 s part each on 2 cores: each at 2/3 of a core, 1.5 s
    job = job_of(rows((1, 0)), {"cores": 2}, episodes=3, concurrency=3)
    np.testing.assert_allclose(job.sample(np.random.default_rng(0), 2), 1.5, rtol=1e-12)


def test_an_engine_wanting_more_than_the_cores_slows_by_their_ratio():
    # 100 tokens at 10 ms alone; the engine wants 3 cores of 2: 1.5 s
    cpu = {"cores": 2, "engine_demand": 3}
    job = job_of(rows((0, 100)), cpu, episodes=1, concurrency=1)
    np.testing.assert_allclose(job.sample(np.random.default_rng(0), 2), 1.5, rtol=1e-12)


def test_a_decode_and_a_command_halve_one_core_until_the_decode_ends():
    # one core, the engine one thread wanting it all: each at half until the decode (1 s
    # of work) ends at 2 s, when the command has 1 s of its 2 left, alone after: 3 s
    cpu = {"cores": 1, "engine_demand": 1, "engine_threads": 1}
    job = job_of(rows((0, 100), (2, 0)), cpu, episodes=2, concurrency=2)
    np.testing.assert_allclose(job.sample(np.random.default_rng(0), 2), 3.0, rtol=1e-12)


def test_a_demand_by_batch_is_read_at_the_batch():
    # two sessions decode 100 tokens together at 10 ms a step, the engine wanting 4 cores
    # at batch 2 (1 at batch 1) of 2: half speed, 2 s
    cpu = {"cores": 2, "engine_cores": {"batch": [1, 2], "cores": [1, 4]}}
    job = job_of(rows((0, 100)), cpu, episodes=2, concurrency=2)
    np.testing.assert_allclose(job.sample(np.random.default_rng(0), 2), 2.0, rtol=1e-12)


@pytest.mark.parametrize("timeout", [None, 6.0])
def test_with_cores_to_spare_it_is_the_turn_model_without_a_cpu(timeout):
    turns = DRAWN | ({"timeout_s": timeout} if timeout else {})
    plain = job_of(turns, None, episodes=12, concurrency=5, engine=CURVE)
    spare = job_of(turns, {"cores": 64, "engine_demand": 1}, episodes=12, concurrency=5,
                   engine=CURVE)  # fmt: skip
    a, b = (j.sample(np.random.default_rng(3), 70) for j in (plain, spare))
    np.testing.assert_allclose(b, a, rtol=1e-9)


def test_a_tight_cpu_slows_every_job():
    plain = job_of(DRAWN, None, episodes=12, concurrency=5, engine=CURVE)
    tight = job_of(DRAWN, {"cores": 2}, episodes=12, concurrency=5,
                   engine=CURVE)  # fmt: skip
    a, b = (j.sample(np.random.default_rng(3), 70) for j in (plain, tight))
    assert np.all(b > a)


def test_compiled_and_plain_python_give_the_same_jobs_to_the_bit(monkeypatch):
    pytest.importorskip("numba")
    cpu = {"cores": 1.5, "engine_cores": {"batch": [1, 4], "cores": [1, 1.6]}}
    runs = []
    for plain in ("0", "1"):
        monkeypatch.setenv("STALENESS_SIM_NO_NUMBA", plain)
        job = job_of(DRAWN | {"timeout_s": 8}, cpu, episodes=10, concurrency=4, engine=CURVE)
        runs.append(job.sample(np.random.default_rng(5), 70))
    np.testing.assert_array_equal(runs[0], runs[1])


@pytest.mark.parametrize(
    "cpu, field",
    [
        ({"cores": 0}, "cores"),
        (
            {"cores": 2, "engine_cores": {"batch": [4, 1], "cores": [1, 2]}},
            "batch must increase",
        ),  # fmt: skip
        (
            {"cores": 2, "engine_cores": {"batch": [1], "cores": [1, 2]}},
            "batch has 1 values",
        ),  # fmt: skip
        (
            {
                "cores": 2,
                "engine_demand": 1,
                "engine_cores": {"batch": [1], "cores": [1]},
            },
            "not both",
        ),  # fmt: skip
        ({"cores": 2, "share": "job"}, "share"),  # one model of sharing: no choice
    ],
)
def test_bad_cpu_settings_are_named(cpu, field):
    with pytest.raises((ValidationError, ValueError), match=field):
        job_of(rows((1, 0)), cpu)


def test_a_chunk_split_across_threads_gives_the_same_jobs_to_the_bit(monkeypatch):
    pytest.importorskip("numba")
    cpu = {"cores": 1.5, "engine_cores": {"batch": [1, 4], "cores": [1, 1.6]}}
    runs = []
    for threads in ("1", "2", "5"):
        monkeypatch.setenv("STALENESS_SIM_THREADS", threads)
        job = job_of(DRAWN | {"timeout_s": 8}, cpu, episodes=10, concurrency=4, engine=CURVE)
        runs.append(job.sample(np.random.default_rng(5), 130))
    assert np.ptp(runs[0]) > 0  # jobs that differ
    for other in runs[1:]:
        np.testing.assert_array_equal(other, runs[0])
