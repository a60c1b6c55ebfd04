"""The hf backend's continuous batching: turns join a running batch and leave it alone.

Expected replies come from the same backend in turn mode, one request at a time (a batch
of one has no padding and no neighbours), which its own tests compare with
``transformers.generate``.
"""

from __future__ import annotations

import threading
import time

import pytest

from runner.backends import GenerationRequest, SessionBatcher, make_backend

SYSTEM = {"role": "system", "content": "You are an agent in a terminal."}


def request(k: int) -> GenerationRequest:
    # prompts of different lengths, so joining rows are padded against running ones
    task = {"role": "user", "content": "List the files. " * (1 + k % 4)}
    return GenerationRequest([SYSTEM, task], seed=500 + k)


# A batching window far longer than the test's work on any machine, however busy: a test
# that ends well within it did not wait for it (a claim of order, not of speed).
WINDOW_S = 600.0


def backend(tiny_model, batching: str, **kw):
    return make_backend(
        "hf", path=str(tiny_model), max_new_tokens=40, context_tokens=512, stop=(),
        batching=batching, **kw,
    )  # fmt: skip


@pytest.fixture(scope="module")
def alone(tiny_model):
    b = backend(tiny_model, "turn")
    yield lambda k: b.generate([request(k)])[0]
    b.close()


def wait_for(predicate, timeout=30.0):
    t0 = time.monotonic()
    while not predicate():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.001)


def test_turns_that_join_a_running_batch_get_the_replies_they_get_alone(tiny_model, alone):
    b = backend(tiny_model, "continuous")
    try:
        first = [b.submit(request(k)) for k in range(3)]
        wait_for(lambda: b.stats["steps"] >= 3)  # the first three are decoding
        second = [b.submit(request(k)) for k in range(3, 7)]
        assert not any(f.done() for f in first)  # so the second group joins mid-stream
        replies = [f.result(timeout=60) for f in first + second]
        assert b.stats["batches"] >= 2  # admissions into a running batch
    finally:
        b.close()
    expected = [alone(k) for k in range(7)]
    assert [r.text for r in replies] == [e.text for e in expected]
    assert [r.tokens_in for r in replies] == [e.tokens_in for e in expected]
    assert len({r.text for r in replies}) > 1  # the seeds matter


def test_max_batch_bounds_the_rows_and_queues_the_rest(tiny_model, alone):
    b = backend(tiny_model, "continuous", max_batch=2)
    try:
        futures = [b.submit(request(k)) for k in range(5)]
        replies = [f.result(timeout=60) for f in futures]
        assert b.stats["batches"] >= 3  # 5 rows through at most 2 at a time
    finally:
        b.close()
    assert [r.text for r in replies] == [alone(k).text for k in range(5)]


def test_a_weight_change_waits_for_the_turns_in_flight(tiny_model, alone):
    es = {"sigma": 0.2}  # large enough to change a random model's reply
    reference = backend(tiny_model, "turn", es=es)
    with reference.perturbed(seed=7):
        expected_perturbed = reference.generate([request(0)])[0].text
    reference.close()
    b = backend(tiny_model, "continuous", es=es)
    try:
        before = b.weights_hash()
        inflight = b.submit(request(0))
        wait_for(lambda: b.stats["steps"] >= 1)
        changed = threading.Event()

        def perturb():
            with b.perturbed(seed=7):
                changed.set()
                # a turn submitted under the perturbation sees the perturbed weights
                perturbed_reply.append(b.submit(request(0)).result(timeout=60))

        perturbed_reply: list = []
        t = threading.Thread(target=perturb)
        t.start()
        reply = inflight.result(timeout=60)
        t.join(timeout=60)
        assert changed.is_set()
        assert b.weights_hash() == before  # restored exactly
    finally:
        b.close()
    assert reply.text == alone(0).text  # computed wholly with the unperturbed weights
    assert perturbed_reply[0].text == expected_perturbed != reply.text


def test_a_cancelled_turn_leaves_the_batch_and_the_others_finish(tiny_model, alone):
    b = backend(tiny_model, "continuous")
    try:
        futures = [b.submit(request(k)) for k in range(3)]
        assert futures[1].cancel()
        replies = [futures[0].result(timeout=60), futures[2].result(timeout=60)]
        with b.perturbed(seed=3):  # would wait forever if the cancelled turn stayed counted
            pass
    finally:
        b.close()
    assert [r.text for r in replies] == [alone(0).text, alone(2).text]


def test_the_batcher_hands_turns_straight_to_a_continuous_backend(tiny_model, alone):
    b = backend(tiny_model, "continuous")
    batcher = SessionBatcher(b, max_batch=8, window_s=WINDOW_S)
    replies = [None] * 4

    def session(i):
        batcher.open_session()
        replies[i] = batcher.generate(request(i))
        batcher.close_session()

    threads = [threading.Thread(target=session, args=(i,)) for i in range(4)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batcher.close()
    b.close()
    assert time.perf_counter() - t0 < WINDOW_S / 2  # the window was never waited for
    assert batcher.batch_sizes == []  # nothing went through the window
    assert [r.text for r in replies] == [alone(i).text for i in range(4)]


def test_close_fails_the_turns_still_waiting(tiny_model):
    b = backend(tiny_model, "continuous")
    futures = [b.submit(request(k)) for k in range(3)]
    b.close()
    for f in futures:
        assert f.done()
        if f.exception() is not None:
            assert "closed" in str(f.exception())
    with pytest.raises(RuntimeError, match="closed"):
        b.submit(request(0))


def test_an_unknown_batching_mode_is_refused(tiny_model):
    with pytest.raises(ValueError, match="batching must be one of turn, continuous"):
        backend(tiny_model, "eager")


def test_a_failing_forward_pass_fails_its_turns_and_the_backend_goes_on(tiny_model, alone):
    b = backend(tiny_model, "continuous")
    forward, calls = b.model.forward, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # a decode step, after some rows may have finished
            raise RuntimeError("CUDA out of memory")
        return forward(*args, **kwargs)

    b.model.forward = flaky
    try:
        futures = [b.submit(request(k)) for k in range(3)]
        errors = [f.exception(timeout=60) for f in futures]
        assert any("out of memory" in str(e) for e in errors if e is not None)
        with b.perturbed(seed=1):  # nothing is left counted in flight
            pass
        assert b.submit(request(0)).result(timeout=60).text == alone(0).text
    finally:
        b.close()
