"""gpu_check's generation sections (benchmarks/gpu_check.py): the hf backend's throughput
at 1 and 32 sessions, inside a perturbation, and turn against continuous batching with and
without prefix reuse (``hf``); the vLLM engine against the hf backend and its throughput
with the prefix cache off and reset at weight changes (``vllm``)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from harness import conversation, run_sessions

from runner.backends import GenerationRequest, make_backend
from runner.es import UpdateRule

if TYPE_CHECKING:
    from gpu_check import Table

MULTI_TURN_STOP = "a"


COMMAND_MS = 20.0  # mean time a session spends running its command between turns


def concurrent_sessions(
    backend, n: int, seed0: int, turns: int = 1, command_ms: float = 0.0
) -> tuple[int, float]:
    """n sessions on n threads through a SessionBatcher, ``turns`` turns each (turn t of
    session i with seed ``seed0 + i + 1000 t``); (tokens, seconds). ``command_ms``: between
    turns a session "runs its command" for an exponential time of that mean."""
    requests = [GenerationRequest(conversation(i), seed=seed0 + i) for i in range(n)]
    done = run_sessions(backend, requests, turns, command_ms=command_ms)
    return done.tokens, done.wall_s


def make_hf(ctx: SimpleNamespace, **kw) -> Any:
    base = {"path": str(ctx.model_dir), "dtype": ctx.dtype, "device": ctx.device,
            "es": ctx.es, "temperature": 1.0, "max_new_tokens": ctx.tokens,
            "context_tokens": ctx.context, "stop": ()}  # fmt: skip
    base.update(kw)
    return make_backend("hf", **base)


def section_hf(tab: Table, ctx: SimpleNamespace) -> None:
    ctx.hf = make_hf(ctx)
    concurrent_sessions(ctx.hf, 2, 0)  # warm-up
    rates = {}
    for n in (1, 32):
        tokens, seconds = concurrent_sessions(ctx.hf, n, 100)
        rates[n] = tokens / seconds
        tab.add(
            f"hf.tokens_per_s.{n}",
            rates[n],
            note=f"{n} session(s), {tokens} tokens in {seconds:.2f} s",
        )
    tab.add("hf.speedup_32_vs_1", rates[32] / rates[1], note="batched decode over 32 sessions")
    # ES's cost to generation: the same 32 sessions as one job inside a perturbation,
    # perturb and restore included (the aim: within 10 % of the plain rate)
    t0 = time.perf_counter()
    with ctx.hf.perturbed(7):
        tokens, _ = concurrent_sessions(ctx.hf, 32, 100)
    rate = tokens / (time.perf_counter() - t0)
    tab.add("hf.tokens_per_s.32.perturbed", rate,
            note=f"{rate / rates[32]:.3f} of the plain rate, perturb + restore included")  # fmt: skip
    # Turn against continuous batching on multi-turn sessions whose replies end at a stop
    # string (different lengths): a turn batch waits for its longest reply.
    multi = {}
    for mode in ("turn", "continuous", "continuous_reuse"):
        b = make_hf(ctx, batching=mode.split("_")[0], prefix_reuse=mode.endswith("reuse"),
                    stop=(MULTI_TURN_STOP,))  # fmt: skip
        concurrent_sessions(b, 2, 0)  # warm-up
        tokens, seconds = concurrent_sessions(b, 32, 300, turns=3, command_ms=COMMAND_MS)
        multi[mode] = tokens / seconds
        tab.add(f"hf.{mode}.tokens_per_s.32x3", multi[mode],
                note=f"32 sessions x 3 turns, replies end at {MULTI_TURN_STOP!r}, commands "
                f"{COMMAND_MS:g} ms on average; {tokens} tokens")  # fmt: skip
        b.close()
    tab.add("hf.continuous_vs_turn", multi["continuous"] / multi["turn"],
            note="model.batching: continuous against turn, the same seeds")  # fmt: skip
    tab.add("hf.reuse_vs_continuous", multi["continuous_reuse"] / multi["continuous"],
            note="model.prefix_reuse on against off (continuous batching)")  # fmt: skip


def vllm_reason(device: str) -> str | None:
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        return f"vLLM does not import ({exc})"
    if not device.startswith("cuda"):
        return "no GPU: on CPU the real-engine tests run instead (tests/runner/test_vllm_engine.py)"
    return None


def section_vllm(tab: Table, ctx: SimpleNamespace) -> None:
    reason = vllm_reason(ctx.device)
    if reason is not None:
        tab.add("vllm.status", "skipped", "skipped", reason)
        return
    import vllm

    tab.add("vllm.version", vllm.__version__)
    common = {"path": str(ctx.model_dir), "dtype": ctx.dtype, "device": ctx.device,
              "es": ctx.es, "temperature": 1.0, "max_new_tokens": ctx.tokens,
              "context_tokens": ctx.context, "stop": ()}  # fmt: skip
    ref = make_backend("hf", **common)
    rates: dict[str, float] = {}
    try:
        for mode in ("off", "reset"):
            if time.perf_counter() - ctx.t0 > ctx.args.budget_s:
                tab.add(f"vllm.{mode}", "skipped", "skipped", "time budget spent")
                continue
            engine = {"prefix_cache": mode, "gpu_memory_utilization": ctx.args.vllm_memory,
                      "enforce_eager": ctx.args.vllm_eager}  # fmt: skip
            t0 = time.perf_counter()
            b = make_backend("vllm", engine=engine, **common)
            try:
                tab.add(f"vllm.{mode}.start_s", time.perf_counter() - t0, note="engine + self-test")
                ok = bool(b.self_test_result and b.self_test_result["ok"])
                tab.add(f"vllm.{mode}.self_test", ok, "ok" if ok else "FAIL")
                if mode == "off":
                    same = b.base_hash == ref.base_hash
                    tab.add("vllm.base_hash_vs_hf", same, "ok" if same else "FAIL",
                            "the policy loaded in the engine's process")  # fmt: skip
                    with b.perturbed(61), ref.perturbed(61):
                        same = b.weights_hash() == ref.weights_hash()
                    tab.add(
                        "vllm.perturb_vs_hf", same, "ok" if same else "FAIL", "same device type"
                    )
                    rule = UpdateRule(
                        **{k: v for k, v in ctx.es.items() if k in ("sigma", "alpha")}
                    )
                    log = [rule.make([(71, 1.0, 0), (72, 0.0, 0)], 0)]
                    b.sync(log)
                    ref.sync(log)
                    same = b.weights_hash() == ref.weights_hash()
                    tab.add("vllm.update_vs_hf", same, "ok" if same else "FAIL")
                    for n in (1, 32):
                        tokens, seconds = concurrent_sessions(b, n, 100)
                        tab.add(f"vllm.tokens_per_s.{n}", tokens / seconds, note=f"{n} session(s)")
                # multi-turn sessions inside one perturbation (a job), where caching matters
                with b.perturbed(81):
                    tokens, seconds = concurrent_sessions(b, 32, 500, turns=3)
                rates[mode] = tokens / seconds
                tab.add(f"vllm.{mode}.multiturn_tokens_per_s", rates[mode],
                        note=f"32 sessions x 3 turns; prefix cache {mode}; "
                        f"{b.stats['prefix_resets']} resets")  # fmt: skip
            finally:
                b.close()
        if len(rates) == 2:
            tab.add("vllm.reset_vs_off", rates["reset"] / rates["off"],
                    note="multi-turn throughput, prefix cache reset at weight changes / off")  # fmt: skip
    finally:
        ref.close()
