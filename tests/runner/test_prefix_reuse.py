"""Prefix reuse in the hf backend: a turn starts from the states of an earlier turn.

Expected values come from the same model without reuse: the full prefill of the same
prompt (logits agree to float32 rounding), and greedy multi-turn sessions (same replies).
"""

from __future__ import annotations

import pytest
import torch

from runner.backends import GenerationRequest, make_backend
from runner.backends.decoding import DecodeBatch, PrefixStore, Row

SYSTEM = {
    "role": "system",
    "content": "You are an agent in a Linux terminal. Reply with one command.",
}


def backend(tiny_model, **kw):
    base = dict(path=str(tiny_model), max_new_tokens=24, context_tokens=1024, stop=("a",))
    base.update(kw)
    return make_backend("hf", **base)


def prefill(b, rows):
    batch = DecodeBatch(b._forward, b._pad, b.device)
    with torch.inference_mode():
        batch.admit(rows)
    return batch


def row(prompt, **kw):
    return Row(list(prompt), False, torch.Generator(), **kw)


def test_a_reused_prefix_gives_the_logits_of_a_full_prefill(tiny_model):
    b = backend(tiny_model)
    g = torch.Generator().manual_seed(0)
    first = torch.randint(5, 500, (40,), generator=g).tolist()
    longer = first + torch.randint(5, 500, (13,), generator=g).tolist()
    other = torch.randint(5, 500, (25,), generator=g).tolist()
    full = prefill(b, [row(longer)]).logits[0]
    # the states of `first`, computed in a batch with another row (padded)
    earlier = prefill(b, [row(other), row(first)])
    states = earlier.states(earlier.rows[1])
    assert states[0][0].shape[2] == 40
    for reused in (40, 17):
        # next to a row without reuse, whose own logits must not change either
        batch = prefill(b, [row(other), row(longer, prefix_kv=states, reused=reused)])
        torch.testing.assert_close(batch.logits[1], full, rtol=0, atol=1e-5)
        torch.testing.assert_close(batch.logits[0], earlier.logits[0], rtol=0, atol=1e-5)
    # a second reuse: the states of the row that reused (its suffix was padded against
    # the longer `other`, so its cache row has a gap) hold exactly its tokens
    batch = prefill(b, [row(other), row(longer, prefix_kv=states, reused=40)])
    again = batch.states(batch.rows[1])
    assert again[0][0].shape[2] == len(longer)
    longest = longer + torch.randint(5, 500, (9,), generator=g).tolist()
    twice = prefill(b, [row(other), row(longest, prefix_kv=again, reused=len(longer))])
    torch.testing.assert_close(twice.logits[1], prefill(b, [row(longest)]).logits[0],
                               rtol=0, atol=1e-5)  # fmt: skip
    b.close()


def sessions(b, turns=5, n=6):
    convs = [[SYSTEM, {"role": "user", "content": f"Task {i}: count the lines of d{i}.txt."}]
             for i in range(n)]  # fmt: skip
    replies = []
    for t in range(turns):
        out = b.generate(
            [GenerationRequest(list(c), seed=100 * i + t) for i, c in enumerate(convs)]
        )
        for c, g in zip(convs, out, strict=True):
            c += [{"role": "assistant", "content": g.text},
                  {"role": "user", "content": f"Command executed successfully. Output: {t}"}]  # fmt: skip
        replies.append([g.text for g in out])
    return replies


@pytest.mark.parametrize("batching", ["turn", "continuous"])
def test_greedy_sessions_give_the_same_replies_with_and_without_reuse(tiny_model, batching):
    plain = backend(tiny_model, temperature=0.0, batching=batching)
    reusing = backend(tiny_model, temperature=0.0, batching=batching, prefix_reuse=True)
    try:
        assert sessions(reusing) == sessions(plain)
        stats = reusing.prefixes.stats
        # every turn after the first continues its session's previous turn
        assert stats["hits"] >= 4 * 6 and stats["tokens_reused"] > 0
    finally:
        plain.close()
        reusing.close()


def test_a_warm_started_agent_gives_the_same_greedy_episodes_with_reuse(warm):
    """The random model barely reads its context; the warm start copies names from the
    instruction, so wrong reused states would change what it writes."""
    from runner.task_pool import split_ids
    from runner.terminal.episode import initial_messages
    from runner.terminal.loaders import load_task

    model, _ = warm
    tasks = [load_task(model / "tasks" / t) for t in split_ids(model / "tasks", "test")[:6]]
    common = dict(path=str(model), temperature=0.0, max_new_tokens=64, context_tokens=640,
                  stop=("</command>", "</action>"))  # fmt: skip

    def episodes(b):
        convs = [initial_messages(t) for t in tasks]
        replies = []
        for _ in range(4):
            out = b.generate([GenerationRequest(list(c), seed=i) for i, c in enumerate(convs)])
            for c, g in zip(convs, out, strict=True):
                c += [{"role": "assistant", "content": g.text},
                      {"role": "user", "content": "Command executed successfully. Output: (none)"}]  # fmt: skip
            replies.append([g.text for g in out])
        return replies

    plain = make_backend("hf", **common)
    reusing = make_backend("hf", prefix_reuse=True, batching="continuous", **common)
    try:
        expected = episodes(plain)
        assert episodes(reusing) == expected
        assert reusing.prefixes.stats["hits"] >= 3 * len(tasks)
        assert any("<command>" in r for r in expected[0])  # it acts on the task
    finally:
        plain.close()
        reusing.close()


def test_states_never_cross_a_weight_change(tiny_model):
    b = backend(tiny_model, prefix_reuse=True)
    try:
        sessions(b, turns=1)
        assert len(b.prefixes._entries) == 6
        with b.perturbed(seed=5):
            assert len(b.prefixes._entries) == 0  # cleared by the perturbation
            sessions(b, turns=1)
            assert len(b.prefixes._entries) == 6
        assert len(b.prefixes._entries) == 0  # and by the restore
    finally:
        b.close()


def test_the_store_finds_the_longest_common_prefix_under_the_same_weights():
    store = PrefixStore(capacity=2, min_tokens=3)
    kv = [(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1))]
    store.put([1, 2, 3, 4, 5], kv, tag="v0")
    store.put([1, 2, 9], kv, tag="v0")
    assert store.take([1, 2, 3, 4, 7, 8], "v0")[0] == 4
    assert store.take([1, 2, 3, 4, 5], "v0")[0] == 4  # the last token is always prefilled
    assert store.take([1, 2, 3, 4, 5, 6], "v1") == (0, None)  # other weights
    assert store.take([1, 2, 7], "v0") == (0, None)  # shorter than min_tokens
    store.put([6, 6, 6, 6], kv, tag="v0")  # capacity 2: the least recently used goes
    assert store.take([1, 2, 9, 9], "v0") == (0, None)
    assert store.take([1, 2, 3, 4, 5, 6], "v0")[0] == 5
