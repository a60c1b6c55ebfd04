"""The hf backend, the batcher, sampling, the rolling context and the journal (no Docker)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from runner.backends import GenerationRequest, SessionBatcher, make_backend
from runner.backends.context import chat_ids, fit_prompt
from runner.backends.sampling import filter_top_p, sample_rows
from runner.es import ESOptimizer
from runner.journal import Journal, read_events
from runner.seeds import derive_seed

SYSTEM = {"role": "system", "content": "You are an agent in a terminal."}
TASK = {"role": "user", "content": "Count the lines of /home/user/data.txt."}


@pytest.fixture(scope="module")
def backend(tiny_model):
    b = make_backend("hf", path=str(tiny_model), max_new_tokens=24, context_tokens=256, stop=())
    yield b
    b.close()


def conversation(turns: int) -> list[dict]:
    msgs = [SYSTEM, TASK]
    for i in range(turns):
        msgs += [
            {"role": "assistant", "content": f"<command>wc -l data{i}.txt</command>"},
            {"role": "user", "content": f"Command executed successfully. Output: {i} lines"},
        ]
    return msgs


def test_a_sessions_reply_does_not_depend_on_its_batch(backend):
    # Different prompt lengths (left padding) and seeds; each row alone, then all together.
    reqs = [GenerationRequest(conversation(k % 3), seed=100 + k) for k in range(6)]
    alone = [backend.generate([r])[0] for r in reqs]
    together = backend.generate(reqs)
    reversed_ = backend.generate(reqs[::-1])[::-1]
    assert [g.text for g in together] == [g.text for g in alone] == [g.text for g in reversed_]
    assert len({g.text for g in together}) > 1  # the seeds matter
    assert all(
        g.tokens_in == len(chat_ids(backend.tokenizer, r.messages))
        for g, r in zip(together, reqs, strict=True)
    )


def test_greedy_decoding_equals_transformers_generate(tiny_model):
    b = make_backend(
        "hf", path=str(tiny_model), temperature=0.0, max_new_tokens=10, context_tokens=256, stop=()
    )
    req = GenerationRequest(conversation(1), seed=0)
    ids = torch.tensor([chat_ids(b.tokenizer, req.messages)])
    ref = b.model.generate(ids, max_new_tokens=10, do_sample=False, eos_token_id=None)
    expected = b.tokenizer.decode(ref[0, ids.shape[1] :], skip_special_tokens=True)
    assert b.generate([req])[0].text == expected
    b.close()


def test_stop_strings_end_a_reply(tiny_model):
    # A stop string the random model emits early: the first characters of its free reply.
    b = make_backend("hf", path=str(tiny_model), max_new_tokens=24, context_tokens=256, stop=())
    req = GenerationRequest(conversation(0), seed=3)
    free = b.generate([req])[0].text
    stop = free[2:5]
    assert len(stop) == 3
    s = make_backend(
        "hf", path=str(tiny_model), max_new_tokens=24, context_tokens=256, stop=(stop,)
    )
    out = s.generate([req])[0]
    assert out.finish == "stop" and out.text.endswith(stop) and free.startswith(out.text)
    assert out.tokens_out < 24
    b.close(), s.close()


def test_the_backend_owns_the_weights_through_the_es_core(backend, tiny_model):
    base = backend.weights_hash()
    req = GenerationRequest(conversation(0), seed=7)
    before = backend.generate([req])[0].text
    with backend.perturbed(seed=11):
        assert backend.weights_hash() != base
    assert backend.weights_hash() == base  # restored bit for bit
    assert backend.generate([req])[0].text == before
    # sync replays a log to exactly the weights an ESOptimizer stepping on its own reaches
    from transformers import AutoModelForCausalLM

    other = AutoModelForCausalLM.from_pretrained(tiny_model)
    opt = ESOptimizer(other, sigma=0.0015, alpha=0.5)
    opt.step([(1, 1.0, 0), (2, 0.0, 0), (3, 0.5, 0)])
    opt.step([(4, 0.2, 1), (5, 0.9, 1)])
    assert backend.sync(opt.log) == 2 and backend.version == 2
    assert backend.weights_hash() == opt.weights_hash()
    assert backend.sync(opt.log) == 0


def test_rolling_context_keeps_the_task_and_drops_the_oldest_turns(backend):
    tok = backend.tokenizer
    msgs = conversation(12)
    full = chat_ids(tok, msgs)
    keep_last_two = chat_ids(tok, msgs[:2] + msgs[-4:])
    ids, cut = fit_prompt(tok, msgs, len(keep_last_two))
    assert cut and ids == keep_last_two and len(full) > len(ids)
    ids, cut = fit_prompt(tok, msgs, len(full))
    assert not cut and ids == full
    tiny, cut = fit_prompt(tok, msgs, 5)  # not even the task fits: cut from the left
    assert cut and tiny == chat_ids(tok, msgs[:2])[-5:]


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.05, 0.3, 0.15]])
    kept = torch.isfinite(filter_top_p(probs.log(), 0.75))
    assert kept.tolist() == [[True, False, True, False]]  # 0.5 + 0.3 >= 0.75
    kept = torch.isfinite(filter_top_p(probs.log(), 0.81))
    assert kept.tolist() == [[True, False, True, True]]
    assert torch.isfinite(filter_top_p(probs.log(), 1.0)).all()


def test_gumbel_sampling_draws_from_the_softmax():
    # Chi-square goodness of fit against softmax(logits / T), 20,000 draws.
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5])
    temperature, n = 0.7, 20000
    gens = [torch.Generator().manual_seed(s) for s in range(n)]
    draws = sample_rows(logits.expand(n, -1), gens, temperature, 1.0).numpy()
    p = torch.softmax(logits / temperature, 0).numpy()
    counts = np.bincount(draws, minlength=5)
    chi2 = ((counts - n * p) ** 2 / (n * p)).sum()
    assert chi2 < 18.47  # the 0.999 quantile of chi-square with 4 degrees of freedom


def test_batcher_serves_concurrent_sessions_in_batches(backend):
    window_s = 600.0  # far longer than the work, on any machine however busy
    batcher = SessionBatcher(backend, max_batch=8, window_s=window_s)
    n = 4
    replies = [None] * n
    opened = threading.Barrier(n)

    def session(i):
        batcher.open_session()
        opened.wait()  # a session that is not open yet is not waited for
        replies[i] = batcher.generate(GenerationRequest(conversation(0), seed=i))
        batcher.close_session()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=session, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # all four sessions waited, so the batch fired at once, not after the window
    assert time.perf_counter() - t0 < window_s / 2
    assert batcher.batch_sizes == [4]
    assert [r.text for r in replies] == [
        backend.generate([GenerationRequest(conversation(0), seed=i)])[0].text for i in range(n)
    ]
    batcher.close()


def test_batcher_hands_errors_to_the_waiting_sessions():
    class Broken:
        def generate(self, requests):
            raise RuntimeError("out of memory")

    batcher = SessionBatcher(Broken(), window_s=0.0)
    with pytest.raises(RuntimeError, match="out of memory"):
        batcher.generate(GenerationRequest(conversation(0), seed=0))
    batcher.close()


def test_journal_ignores_and_cuts_a_torn_last_line(tmp_path):
    path = tmp_path / "journal.jsonl"
    j = Journal(path)
    j.append({"e": "a", "n": 1})
    j.append({"e": "b", "x": 0.1 + 0.2}, durable=True)
    j.close()
    with open(path, "ab") as f:
        f.write(b'{"e": "c", "n"')  # killed mid-write
    events, good = read_events(path)
    assert events == [{"e": "a", "n": 1}, {"e": "b", "x": 0.1 + 0.2}]  # floats round-trip
    j = Journal(path)  # reopening cuts the torn tail before appending
    j.append({"e": "d"})
    j.close()
    assert [e["e"] for e in read_events(path)[0]] == ["a", "b", "d"]
    path.write_text('{"e": "a"}\nnot json\n{"e": "b"}\n')
    from runner.journal import JournalError

    with pytest.raises(JournalError, match="line 2"):
        read_events(path)


def test_derived_seeds_are_stable_and_distinct():
    # Pinned once from the derivation in runner/seeds.py's docstring, outside the code under
    # test: parts joined as "type:value" with NUL (b"int:1\0str:x"), hashlib.blake2b(text,
    # digest_size=8, person=b"es-runner"), the 8 bytes read little endian, mod 2**63. The
    # digests: 33637a1a11f94c20, 5c52a17675fb16c7 (top bit set: the mod clears it),
    # e007f113267e590f, c51643c80b04a574. A change of any step changes a value.
    assert derive_seed(0, "perturbation", 1) == 2327508959297692467
    assert derive_seed(1, "x") == 5122558108100547164 == 0xC716FB7576A1525C - 2**63
    assert derive_seed("1", "x") == 1106053885504587744
    assert derive_seed(7, "sampling", 3, 0) == 8405128728207890117
    seeds = {derive_seed(s, "perturbation", j) for s in range(3) for j in range(1000)}
    assert len(seeds) == 3000 and all(0 <= s < 2**63 for s in seeds)
    assert derive_seed(1, "x") != derive_seed("1", "x")  # types are part of the name
