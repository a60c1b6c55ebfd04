"""The turn model's event loops (``staleness_sim/durations/turn_kernel.py``, and with a shared
CPU ``moment_kernel.py``) compiled by numba against the same source run as plain Python:
the same jobs, to the bit, from the same seed, on every form of the model (flat and
sloped curves with context and prefill costs, beyond the curve, a roofline, drawn parts,
tables resampled, cycled and by measured job, timeouts, more sessions than episodes, a
shared CPU). What the loops compute is checked against independent references in
``test_turns.py`` and ``test_moment_kernel.py``."""

from __future__ import annotations

import numpy as np
import pytest

from staleness_sim.cohort.config import validate_cohort
from staleness_sim.cohort.engine import DurationStream
from staleness_sim.durations import Engine, EngineSpec, make_job
from staleness_sim.durations.turn_kernel import plain
from staleness_sim.durations.turns import TurnJob

pytest.importorskip("numba")

CURVE = {"batch": [1, 2, 4, 8], "step_s": [0.01, 0.012, 0.02, 0.05]}
ROOFLINE = {
    "roofline": {
        "params": 7.6e9,
        "bytes_per_param": 2,
        "kv_bytes_per_token": 57344,
        "bandwidth": 4.8e12,
        "flops": 9.89e14,
    }
}
DRAWN = {
    "count": {"dist": "lognormal", "median": 5, "sigma": 0.6, "cap": 12},
    "prompt_tokens": {"dist": "lognormal", "median": 1000, "sigma": 0.5},
    "reply_tokens": {"dist": "lognormal", "median": 200, "sigma": 0.8, "cap": 1000},
    "command_s": {"dist": "lognormal", "median": 1, "sigma": 1, "cap": 10},
}


def _table(n: int = 40, **extra) -> dict:
    rs = np.random.default_rng(123)
    cols = {
        "turns": rs.integers(1, 9, n).tolist(),
        "prompt_tokens": rs.uniform(100, 3000, n).tolist(),
        "reply_tokens": rs.integers(10, 500, n).astype(float).tolist(),  # ties in targets
        "command_s": rs.exponential(1, n).tolist(),
        "start_s": rs.uniform(0, 3, n).tolist(),
        "end_s": rs.uniform(0, 2, n).tolist(),
    }
    return cols | extra


CASES = {
    "flat curve, drawn": (16, 4, DRAWN, {"curve": {"batch": [1], "step_s": [0.02]}}),
    "curve with context and prefill, start and end": (
        24,
        8,
        DRAWN
        | {
            "start_s": {"dist": "exponential", "mean": 2},
            "end_s": {"dist": "constant", "value": 1},
        },
        {"curve": CURVE, "context_s_per_token": 1e-6, "prefill_s_per_token": 2e-5},
    ),
    "beyond the curve, timeout": (
        20,
        12,
        DRAWN | {"timeout_s": 40},
        {"curve": {"batch": [1, 2], "step_s": [0.01, 0.013]}},
    ),
    "roofline, timeout": (32, 16, DRAWN | {"timeout_s": 120}, ROOFLINE),
    "table resampled": (12, 5, {"table": _table()}, {"curve": CURVE, "prefill_s_per_token": 1e-5}),
    "table cycled, timeout": (
        12,
        3,
        {"table": _table(order="cycle"), "timeout_s": 15},
        {"curve": CURVE},
    ),
    "table by measured job": (10, 4, {"table": _table(job=[k % 7 for k in range(40)])}, ROOFLINE),
    "identical turns (ties)": (
        8,
        4,
        {
            "table": {
                "turns": [3],
                "prompt_tokens": [10.0],
                "reply_tokens": [64.0],
                "command_s": [0.5],
            }
        },
        {"curve": CURVE},
    ),
    "more sessions than episodes": (3, 8, DRAWN, {"curve": CURVE}),
    "one session": (5, 1, DRAWN | {"timeout_s": 30}, {"curve": CURVE}),
    "a shared CPU, timeout": (
        24,
        8,
        {"table": _table(job=[k % 5 for k in range(40)]), "timeout_s": 60},
        {"curve": CURVE, "prefill_s_per_token": 1e-5},
        {"cores": 1.5, "engine_demand": 0.7},
    ),
}


def _model(spec):
    episodes, concurrency, turns, engine, *cpu = spec
    base = {"workers": 1, "cohort": 1, "updates": 1, "policy": {"kind": "sync"}}
    job = {"episodes": episodes, "concurrency": concurrency, "turns": turns, "engine": engine}
    job |= {"cpu": cpu[0]} if cpu else {}
    return make_job(validate_cohort({**base, "job": job}).job)


def _durations(spec, monkeypatch, python: bool) -> np.ndarray:
    monkeypatch.setenv("STALENESS_SIM_NO_NUMBA", "1" if python else "0")
    model = _model(spec)
    rng = np.random.default_rng(7)
    # several blocks: simulated ahead at 16 times what is asked, then one past that
    return np.concatenate([model.sample(rng, n) for n in (1, 3, 50, 300)])


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_and_plain_python_give_the_same_jobs_to_the_bit(case, monkeypatch):
    by_python = _durations(CASES[case], monkeypatch, python=True)
    compiled = _durations(CASES[case], monkeypatch, python=False)
    assert len(by_python) == 354 and np.all(by_python > 0)
    np.testing.assert_array_equal(compiled, by_python)


def test_the_environment_variable_forces_plain_python(monkeypatch):
    assert not plain()
    monkeypatch.setenv("STALENESS_SIM_NO_NUMBA", "1")
    assert plain()


@pytest.mark.parametrize(
    "spec",
    [
        {"curve": CURVE, "context_s_per_token": 3e-7},
        {"curve": {"batch": [1, 3], "step_s": [0.02, 0.05]}},  # beyond it: the last slope
        ROOFLINE,  # bound by memory at every batch here
        {"roofline": ROOFLINE["roofline"] | {"flops": 1e13, "bandwidth": 1e13}},  # by compute
    ],
)
def test_the_step_terms_give_step_s_exactly(spec):
    engine = Engine(EngineSpec.model_validate(spec))
    base, per_context, per_batch = engine.step_terms(16)
    batch = np.arange(1, 17)
    for context in (0.0, 1234.5, 3.3e5):
        terms = np.maximum(base[batch] + per_context * context, per_batch * batch)
        np.testing.assert_array_equal(terms, engine.step_s(batch, np.full(16, context)))


@pytest.mark.parametrize("python", [False, True], ids=["compiled", "python"])
def test_job_k_of_a_stream_is_the_same_whatever_the_sizes_asked_for(python, monkeypatch):
    # chunks of 64 jobs are drawn and simulated whatever is asked: one call of 150, calls of
    # 1, 63 and 86, and 150 calls of one give the same 150 jobs
    sizes = ([150], [1, 63, 86], [1] * 150)
    monkeypatch.setenv("STALENESS_SIM_NO_NUMBA", "1" if python else "0")
    model = _model(CASES["curve with context and prefill, start and end"])
    runs = []
    for asked in sizes:
        rng = np.random.default_rng(11)
        runs.append(np.concatenate([model.sample(rng, n) for n in asked]))
    assert len(runs[0]) == 150 and len(np.unique(runs[0])) == 150
    for other in runs[1:]:
        np.testing.assert_array_equal(other, runs[0])


def test_a_stream_of_turn_jobs_simulates_whole_chunks_only(monkeypatch):
    # a scenario that uses 100 jobs simulates 128 (two chunks of 64), not the 256 of a
    # stream of cheap jobs' first block
    simulated = []
    original = TurnJob._simulate

    def counting(self, rng, chunks):
        out = original(self, rng, chunks)
        simulated.append(len(out))
        return out

    monkeypatch.setattr(TurnJob, "_simulate", counting)
    stream = DurationStream(_model(CASES["flat curve, drawn"]), np.random.default_rng(0))
    values = [stream[k] for k in range(100)]
    assert simulated == [64, 64] and all(v > 0 for v in values)


@pytest.mark.parametrize("case", ["roofline, timeout", "table resampled", "a shared CPU, timeout"])
def test_a_chunk_split_across_threads_gives_the_same_jobs_to_the_bit(case, monkeypatch):
    # jobs are independent: 1, 2, 3 or 7 threads, each on its part of every chunk
    runs = []
    for threads in ("1", "2", "3", "7"):
        monkeypatch.setenv("STALENESS_SIM_THREADS", threads)
        runs.append(_durations(CASES[case], monkeypatch, python=False))
    assert len(runs[0]) == 354 and np.ptp(runs[0]) > 0  # jobs that differ
    for other in runs[1:]:
        np.testing.assert_array_equal(other, runs[0])


def test_the_parts_of_a_chunk_run_on_their_own_threads():
    import threading

    from staleness_sim.durations.kernel_threads import in_parts
    from staleness_sim.durations.turn_episodes import Episodes

    eps = Episodes.of(np.ones(10), np.arange(10.0), np.zeros(10), *np.ones((3, 10)))
    seen, together = {}, threading.Barrier(3, timeout=30)

    def kernel(turns, start, end, first, prompt, reply, command, out):
        seen[threading.get_ident()] = start.copy()
        together.wait()  # all three parts are running at once (a thread id is not reused)
        out[0] = start[::2] + start[1::2]  # each job's two episodes' starts

    out = in_parts(kernel, eps, 5, 2, 1, (), parts=3)
    np.testing.assert_array_equal(out[0], [1, 5, 9, 13, 17])
    assert len(seen) == 3  # jobs 0, 1-2, 3-4
    assert sorted(len(v) for v in seen.values()) == [2, 4, 4]


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_bad_thread_count_is_named(value, monkeypatch):
    from staleness_sim.durations.kernel_threads import threads

    monkeypatch.setenv("STALENESS_SIM_THREADS", value)
    with pytest.raises(ValueError, match=f"STALENESS_SIM_THREADS={value!r}"):
        threads()
