"""The vllm backend on a real vLLM engine: seeded sampling and prefix caching off on a
plain random model (flat logits: samples differ between seeds), close(), a killed
driver, and what the engine would refuse, said in one line before it starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from vllm_helpers import vllm_device

from runner.backends import GenerationRequest, make_backend
from runner.errors import UserError
from runner.models import build_tiny_model

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
LONG = " ".join(f"<command>ls -la /srv/data_{i}</command>" for i in range(40))


def engine_children() -> list[psutil.Process]:
    """Our child processes that are vLLM's (the engine core and its workers)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "VLLM" in p.name() or "VLLM" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def gone(pids, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids):
            return True
        time.sleep(0.5)
    return False


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    vllm_device()
    path = build_tiny_model(tmp_path_factory.mktemp("vllm") / "model", seed=0, hidden_size=128,
                            num_heads=2, num_kv_heads=1, intermediate_size=256,
                            max_position_embeddings=2048)  # fmt: skip
    return str(path)


def test_seeded_sampling_prefix_cache_off_and_close_leaves_no_engine_process(model):
    device = vllm_device()
    backend = make_backend("vllm", path=model, device=device, dtype="float32", temperature=1.0,
                           max_new_tokens=16, context_tokens=1024, stop=())  # fmt: skip
    pids = list(backend.engine_pids)
    assert pids and all(psutil.pid_exists(p) for p in pids)
    assert {p.pid for p in engine_children()} <= set(pids)
    # one sampling seed, one reply: in one batch, and alone; other seeds, other replies
    msg = [{"role": "user", "content": "List the files in /home/user."}]
    reqs = [GenerationRequest(msg, seed=s) for s in (5, 5, 6, 7, 8)]
    first = [g.text for g in backend.generate(reqs)]
    assert first[0] == first[1] == backend.generate(reqs[:1])[0].text
    assert len(set(first[1:])) == 4
    # prefix caching off: the same long prompt is never served from the cache
    req = [GenerationRequest([{"role": "user", "content": LONG}], seed=1)]
    assert backend.generate(req)[0].text == backend.generate(req)[0].text
    assert backend.stats["cached_tokens"] == 0
    backend.close()
    assert gone(pids, timeout=5)  # close() waited for them
    assert engine_children() == []
    assert not [t for t in threading.enumerate() if t.name == "vllm-loop"]
    backend.close()  # idempotent


KILLED = """
import sys
from runner.backends import make_backend

if __name__ == "__main__":
    b = make_backend("vllm", path=sys.argv[1], device=sys.argv[2], dtype="float32",
                     max_new_tokens=8, context_tokens=256, stop=())
    print("ENGINE", *b.engine_pids, flush=True)
    sys.stdin.read()  # until killed
"""


def test_an_engine_ends_with_a_driver_killed_by_sigkill(model, tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(KILLED)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, str(script), model, vllm_device()], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        line = ""
        while not line.startswith("ENGINE"):  # vLLM logs to stdout too
            line = proc.stdout.readline()
            assert line, "the driver ended before its engine started"
        pids = [int(x) for x in line.split()[1:]]
        assert pids and all(psutil.pid_exists(p) for p in pids)
        proc.send_signal(signal.SIGKILL)  # no close(), no atexit: vLLM's processes orphaned
        proc.wait(timeout=30)
        assert gone(pids, timeout=30), "the engine outlived its killed driver"
    finally:
        proc.kill()


def test_a_head_size_the_cpu_engine_refuses_is_one_line_naming_it(tmp_path):
    if vllm_device() != "cpu":
        pytest.skip("the CPU attention's head sizes")
    path = build_tiny_model(tmp_path / "m16")  # make-tiny's default head size, 16
    with pytest.raises(UserError) as err:
        make_backend("vllm", path=str(path), device="cpu", max_new_tokens=8, context_tokens=64)
    msg = str(err.value)
    assert "\n" not in msg and "head size 16" in msg and "64" in msg and "--head-dim 64" in msg
    assert engine_children() == []  # refused before any engine started


def test_an_engine_that_dies_mid_run_fails_its_turns_and_close_still_reaps(model):
    backend = make_backend("vllm", path=model, device=vllm_device(), dtype="float32",
                           temperature=1.0, max_new_tokens=512, context_tokens=1024,
                           stop=(), engine={"self_test": False})  # fmt: skip
    pids = list(backend.engine_pids)
    try:
        msg = [{"role": "user", "content": "List the files in /home/user."}]
        turns = [backend.submit(GenerationRequest(msg, seed=s)) for s in range(4)]
        time.sleep(0.5)
        running = [t for t in turns if not t.done()]
        os.kill(pids[0], signal.SIGKILL)  # the engine core, mid-generation
        assert running, "every turn ended before the kill"
        for turn in running:  # each fails (the worker's job then fails: a crashed worker)
            with pytest.raises(Exception):  # noqa: B017 - vLLM's EngineDeadError or the like
                turn.result(timeout=60)
    finally:
        t0 = time.monotonic()
        backend.close()
    assert time.monotonic() - t0 < 60
    assert gone(pids, timeout=5) and engine_children() == []
