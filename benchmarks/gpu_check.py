"""One-command check of the GPU path: generation speed, ES exactness and speed, async updates.

Run through ``scripts/gpu_check.sh`` on one GPU (no network; sized for well under 8
minutes on one H200, an estimate: it has not run there yet, and ``--budget-s`` skips the
sections that would not fit); ``--small`` runs the same checks on a tiny model with few
tokens, on CPU too (about 10 s on 2 cores),
which is how the test suite runs it. It prints one table; ``--json PATH`` (the wrapper
passes ``$OUT/gpu_check.json`` when ``OUT`` is set) writes it as JSON too.

Sections:

1. **model**: a random Qwen2-architecture model built locally (``runner.models``; full:
   hidden 1024, 24 layers, 16 heads / 4 KV heads, MLP 4096, ~365M parameters; small: the
   tiny test model), with the locally trained 512-token tokenizer.
2. **hf**: generation throughput of the ``hf`` backend at 1 and 32 concurrent sessions
   (threads through the SessionBatcher, as a job runs them), at 32 inside a perturbation
   (perturb and restore included), and turn against continuous batching on 32 sessions x
   3 turns whose replies end at a stop string, with 20 ms commands between turns, and
   continuous batching with prefix reuse against without.
3. **es**: perturb / restore bit-exactness on the device, and the perturbed weights and an
   update (fp32 master and working weights) against a CPU reference on the same seeds.
   Only a device-independent noise scheme can make a GPU equal the CPU reference; with the
   default ``blockseed-v1`` (the device's own generator) a difference is expected and
   reported as such. On CPU the comparison degenerates to CPU against CPU, and says so.
   Then perturb, restore and an update of 8 seeds timed against the device's copy
   bandwidth (how many copies of the fp32 master each pass costs).
4. **ext**: the vllm worker extension on the device without vLLM: the weights it pushes
   into a stand-in engine (``reload_weights`` copying each HF tensor) when it perturbs,
   restores and updates must equal the hf backend's on the same seeds, bit for bit.
5. **async**: a few asynchronous updates with a bounded-staleness policy (``bounded``,
   max_lag 1, drop: Natural Async-1) on a task that needs no container: the reward of a
   reply is its ``difflib`` similarity to ``<command>ls -la /home/user</command>``. The
   policy is the simulator's own object, driven through the simulator's driver as the
   orchestrator's RunState drives it (dispatch -> ``idle``, result -> ``land``, ``ready``
   -> ``commit`` -> ``UpdateRule.make``; seeds derived from the run seed by name, common
   random numbers);
   the orchestrator itself needs Docker tasks and pydantic, absent on the GPU machine.
6. **vllm**: only if vLLM imports (and a GPU is there): the engine's start-up self-test,
   its base hash and a perturbation against the hf backend, throughput at 1 and 32
   sessions, and multi-turn throughput with prefix caching off and reset at each weight
   change.

Exit status 1 if a check that must hold fails (a FAIL row), else 0.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import importlib.util
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout, uninstalled

from runner.backends import GenerationRequest, SessionBatcher, make_backend  # noqa: E402
from runner.backends.vllm_extension import ESWorkerExtension  # noqa: E402
from runner.es import ESOptimizer, Result, UpdateRule  # noqa: E402
from runner.models import build_tiny_model, load_tiny_model  # noqa: E402
from runner.seeds import derive_seed  # noqa: E402

FULL = {"hidden_size": 1024, "num_layers": 24, "num_heads": 16, "num_kv_heads": 4,
        "intermediate_size": 4096, "max_position_embeddings": 4096}  # fmt: skip
SMALL = {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
         "intermediate_size": 128, "max_position_embeddings": 512}  # fmt: skip
TARGET = "<command>ls -la /home/user</command>"
SYSTEM = {"role": "system", "content": "You are an agent in a Linux terminal."}
DEVICE_DEPENDENT_SCHEMES = ("blockseed-v1",)


# -- the table ------------------------------------------------------------------------
class Table:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.results: dict[str, Any] = {}

    def add(self, key: str, value: Any, status: str = "info", note: str = "") -> None:
        self.rows.append({"check": key, "value": value, "status": status, "note": note})
        self.results[key] = value

    @property
    def failed(self) -> list[str]:
        return [r["check"] for r in self.rows if r["status"] in ("FAIL", "error")]

    def render(self) -> str:
        def fmt(v: Any) -> str:
            if isinstance(v, float):
                return f"{v:.4g}"
            if isinstance(v, list | tuple):
                return "[" + ", ".join(fmt(x) for x in v) + "]"
            return str(v)

        cells = [(r["check"], fmt(r["value"]), r["status"], r["note"]) for r in self.rows]
        head = ("check", "value", "status", "note")
        widths = [max(len(c[i]) for c in [head, *cells]) for i in range(3)]
        lines = []
        for c in [head, *cells]:
            lines.append("  ".join(c[i].ljust(widths[i]) for i in range(3)) + "  " + c[3])
            if c is head:
                lines.append("  ".join("-" * w for w in widths) + "  ----")
        return "\n".join(lines)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def best_time(fn: Callable[[], object], device: str, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return min(times)


def compare(
    dev: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], bound: float = 0.0
) -> dict[str, Any]:
    """Elementwise comparison of same-named tensors (device copy against the reference).

    ``max_ulps`` counts ulps of the tensors' dtype at each element's magnitude (the larger of
    the two), so a cast that rounds two nearly equal values to neighbouring numbers is 1.
    ``beyond``: elements that differ by more than one such ulp and by more than ``bound``.
    """
    out = {"identical": True, "elements": 0, "elements_differing": 0, "beyond": 0,
           "max_ulps": 0.0, "max_abs": 0.0}  # fmt: skip
    for name, a in dev.items():
        a, b = a.detach().cpu(), ref[name].detach().cpu()
        differ = bits(a) != bits(b)
        n = int(differ.sum())
        out["elements"] += a.numel()
        out["elements_differing"] += n
        if n:
            out["identical"] = False
            x, y = a[differ].double(), b[differ].double()
            gap = (x - y).abs()
            ulps = gap / ulp(torch.maximum(x.abs(), y.abs()), a.dtype)
            out["beyond"] += int(((ulps > 1) & (gap > bound)).sum())
            out["max_ulps"] = max(out["max_ulps"], float(ulps.max()))
            out["max_abs"] = max(out["max_abs"], float(gap.max()))
    return out


def ulp(magnitude: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype``'s numbers at each magnitude (float64 in and out)."""
    info = torch.finfo(dtype)
    _, exponent = torch.frexp(magnitude.clamp_min(info.tiny))  # magnitude = m * 2**e, m in [0.5, 1)
    return torch.ldexp(torch.full_like(magnitude, info.eps / 2), exponent)


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    return t.view(
        {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    )


# A frequent character of the random model's output: replies end at different lengths.
MULTI_TURN_STOP = "a"
COMMAND_MS = 20.0  # mean time a session spends running its command between turns


def conversation(i: int, turns: int = 1) -> list[dict]:
    msgs = [SYSTEM, {"role": "user", "content": f"Task {i}: list the files in /home/user."}]
    for t in range(turns - 1):
        msgs += [
            {"role": "assistant", "content": f"<command>ls /home/user/d{i}_{t}</command>"},
            {"role": "user", "content": f"Command executed successfully. Output: f{t}.txt"},
        ]
    return msgs


def concurrent_sessions(
    backend, n: int, seed0: int, turns: int = 1, command_ms: float = 0.0
) -> tuple[int, float]:
    """n sessions on n threads through a SessionBatcher, ``turns`` turns each; (tokens, s).

    ``command_ms``: between turns a session "runs its command" for an exponential time of
    that mean (seeded per session), as a terminal session does."""
    batcher = SessionBatcher(backend, max_batch=64, window_s=0.05)
    tokens = [0] * n
    opened = threading.Barrier(n)

    def session(i: int) -> None:
        rng = random.Random(seed0 + i)
        batcher.open_session()
        opened.wait()
        msgs = conversation(i)
        for t in range(turns):
            g = batcher.generate(GenerationRequest(list(msgs), seed=seed0 + 1000 * t + i))
            tokens[i] += g.tokens_out
            msgs += [{"role": "assistant", "content": g.text},
                     {"role": "user", "content": f"Output: line {t}"}]  # fmt: skip
            if command_ms > 0:
                time.sleep(rng.expovariate(1000.0 / command_ms))
        batcher.close_session()

    threads = [threading.Thread(target=session, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    batcher.close()
    return sum(tokens), seconds


# -- noise scheme ---------------------------------------------------------------------
def choose_noise(requested: str) -> tuple[dict[str, Any], str]:
    """ES keyword for the noise scheme (``noise=``) if the ES core takes one; and why."""
    import inspect

    params = inspect.signature(ESOptimizer.__init__).parameters
    if "noise" not in params:
        if requested not in ("auto", "default"):
            raise SystemExit(f"--noise {requested}: this ES core has one noise scheme only")
        return {}, "the ES core has one scheme (no noise= parameter)"
    if requested == "default":
        return {}, "the ES core's default (asked for)"
    if requested != "auto":
        return {"noise": requested}, "asked for"
    noise_mod = importlib.import_module("runner.es.noise")
    names: list[str] = []
    for attr in ("NOISE_SCHEMES", "SCHEMES"):
        reg = getattr(noise_mod, attr, None)
        if reg:
            names = list(reg)
            break
    independent = [n for n in names if n not in DEVICE_DEPENDENT_SCHEMES]
    if independent:
        return {"noise": independent[0]}, "auto: the first device-independent scheme listed"
    return {}, "auto: no device-independent scheme listed; the ES core's default"


# -- sections -------------------------------------------------------------------------
def section_model(tab: Table, ctx: SimpleNamespace) -> None:
    t0 = time.perf_counter()
    if ctx.args.model_dir and (Path(ctx.args.model_dir) / "config.json").is_file():
        ctx.model_dir = Path(ctx.args.model_dir)
        how = "reused"
    else:
        out = Path(ctx.args.model_dir) if ctx.args.model_dir else ctx.tmp / "model"
        sizes = SMALL if ctx.args.small else FULL
        ctx.model_dir = build_tiny_model(out, seed=0, arch="qwen2", vocab_size=512, **sizes)
        how = "built (random weights, seed 0)"
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(ctx.model_dir)
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        n = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())
    tab.add(
        "model.parameters",
        n,
        note=f"Qwen2, {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, {how}",
    )
    tab.add("model.build_s", time.perf_counter() - t0)
    ctx.n_params = n


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


def section_es(tab: Table, ctx: SimpleNamespace) -> None:
    b = ctx.hf
    opt = b.es
    scheme = opt.config()["noise"]["scheme"]
    independent = scheme not in DEVICE_DEPENDENT_SCHEMES
    h0 = b.weights_hash()
    with b.perturbed(11):
        hp = b.weights_hash()
    hr = b.weights_hash()
    tab.add("es.perturb_changes_weights", hp != h0, "ok" if hp != h0 else "FAIL")
    tab.add("es.perturb_restore_bitexact", hr == h0, "ok" if hr == h0 else "FAIL",
            "sha256 of the working weights after restore = before")  # fmt: skip

    on_cpu = ctx.device == "cpu"
    ref_model, _ = load_tiny_model(ctx.model_dir, dtype=ctx.torch_dtype)
    ref = ESOptimizer(ref_model, **ctx.es, threads=max(1, min(8, os.cpu_count() or 1)))
    reference = "cpu vs cpu (degenerate: this run is on CPU)" if on_cpu else f"{ctx.device} vs cpu"
    tab.add("es.reference", reference, note=f"noise scheme {scheme}")

    def judge(key: str, diff: dict[str, Any], bound: float) -> None:
        """Identical; or, across device types with a device-independent scheme, within the
        scheme's documented tolerance: every element within 1 ulp of the weights' dtype at
        its magnitude (the cast of float32 values that log/cos/sin left a few float32 ulps
        apart), or within ``bound`` (compare was given the same bound)."""
        note = (f"{diff['elements_differing']} of {diff['elements']} elements differ, "
                f"{diff['beyond']} by more than 1 ulp and the bound; max {diff['max_ulps']:.3g} "
                f"ulp, max abs {diff['max_abs']:.3g}")  # fmt: skip
        if diff["identical"]:
            tab.add(key, "identical", "ok", "bit for bit")
        elif on_cpu:
            tab.add(key, "differs", "FAIL", note + "; CPU against CPU must be identical")
        elif not independent:
            tab.add(
                key, "differs", "info", note + f"; expected: {scheme} uses the device's generator"
            )
        elif diff["beyond"] == 0:
            tab.add(key, "within tolerance", "ok", note + f" (bound {bound:.3g})")
        else:
            tab.add(key, "differs", "FAIL", note + f" (bound {bound:.3g})")

    sigma = float(ctx.es["sigma"])
    with b.perturbed(21), ref.perturbed(21):
        diff = compare(dict(b.model.named_parameters()), dict(ref_model.named_parameters()),
                       sigma * 1e-5)  # fmt: skip
    judge("es.perturbed_vs_cpu", diff, sigma * 1e-5)
    rule = UpdateRule(**{k: v for k, v in ctx.es.items() if k in ("sigma", "alpha")})
    record = rule.make([(1, 1.0, 0), (2, 0.0, 0), (3, 0.5, 0), (4, 0.25, 0)], b.version)
    b.sync([*opt.log, record])
    ref.replay([*opt.log])
    scale = sum(abs(c) for _, c in record.entries)
    judge("es.update_master_vs_cpu", compare(dict(opt.master_parameters()),
          dict(ref.master_parameters()), scale * 1e-5), scale * 1e-5)  # fmt: skip
    judge("es.update_weights_vs_cpu", compare(dict(b.model.named_parameters()),
          dict(ref_model.named_parameters()), scale * 1e-5), scale * 1e-5)  # fmt: skip
    ref.close()
    del ref, ref_model

    # speed against the device's copy bandwidth
    dev = ctx.device
    numel = min(1 << 28, max(1 << 20, 2 * ctx.n_params))
    src = torch.empty(numel, dtype=torch.float32, device=dev).normal_()
    dst = torch.empty_like(src)
    copy_bps = 4 * numel / best_time(lambda: dst.copy_(src), dev, 5)
    src = dst = None  # free them before the timed passes
    master_s = 4 * opt.num_parameters / copy_bps  # one copy of the fp32 master
    holder: list = []

    def enter() -> None:
        cm = opt.perturbed(31)
        cm.__enter__()
        holder.append(cm)

    def leave() -> None:
        holder.pop().__exit__(None, None, None)

    t_perturb, t_restore = [], []
    for _ in range(3):
        t_perturb.append(best_time(enter, dev, 1))
        t_restore.append(best_time(leave, dev, 1))
    seeds = 30  # the published cohort; aims (issue 42): perturb <= 5, update <= 60 copies
    tab.add("es.noise_kernel", getattr(opt, "kernel", "torch"), note="docs/es.md, Noise kernels")
    results = [Result(100 + k, float(k), opt.version) for k in range(seeds)]
    upd = rule.make(results, opt.version)
    t_update = best_time(lambda: opt.apply(upd), dev, 1)
    tab.add("es.copy_GBps", copy_bps / 1e9, note="fp32 copy, tensor bytes per second")
    tab.add("es.perturb_s", min(t_perturb), note=f"{min(t_perturb) / master_s:.1f} master copies")
    tab.add("es.restore_s", min(t_restore), note=f"{min(t_restore) / master_s:.1f} master copies")
    tab.add("es.update_s", t_update, note=f"{seeds} seeds; {t_update / master_s:.1f} master copies; "
            f"x{7.6e9 / opt.num_parameters:.0f} for 7.6 B parameters")  # fmt: skip
    tab.add("es.perturb_in_master_copies", min(t_perturb) / master_s)
    tab.add("es.restore_in_master_copies", min(t_restore) / master_s)
    tab.add("es.update_in_master_copies", t_update / master_s)


class StandInWorker(ESWorkerExtension):
    """vLLM's worker as the extension sees it, without vLLM: a model runner whose model is
    the engine's copy of the weights, and ``reload_weights``, here copying each pushed HF
    tensor into it (what vLLM's weight loaders do before their post-load processing)."""

    def __init__(self, engine_model: torch.nn.Module) -> None:
        self.model_runner = SimpleNamespace(model=engine_model)

    def reload_weights(self, weights_iterator, is_checkpoint_format: bool = True) -> None:
        params = dict(self.model_runner.model.named_parameters())
        for name, tensor in weights_iterator:
            params[name].data.copy_(tensor)


def section_ext(tab: Table, ctx: SimpleNamespace) -> None:
    b = ctx.hf
    engine, _ = load_tiny_model(ctx.model_dir, dtype=ctx.torch_dtype, device=ctx.device)
    w = StandInWorker(engine)
    info = w.es_setup(str(ctx.model_dir), ctx.dtype, ctx.es)
    same = info["base_hash"] == b.base_hash
    tab.add("ext.base_hash_vs_hf", same, "ok" if same else "FAIL",
            "the policy as loaded in the engine's process, HF names in HF order")  # fmt: skip
    w.es_replay([r.to_dict() for r in b.es.log], b.version)  # to the hf backend's version
    same = w.es_weights_hash() == b.weights_hash()
    tab.add("ext.weights_vs_hf", same, "ok" if same else "FAIL")
    original = [bits(p).clone() for p in engine.parameters()]

    def engine_equal(model: torch.nn.Module) -> bool:
        pairs = zip(engine.parameters(), model.parameters(), strict=True)
        return all(torch.equal(bits(p), bits(q)) for p, q in pairs)

    w.es_perturb(41)
    with b.perturbed(41):
        same = engine_equal(b.model)
    tab.add("ext.perturb_vs_hf", same, "ok" if same else "FAIL", "bitwise, pushed into the engine")
    w.es_restore()
    same = all(torch.equal(bits(p), o) for p, o in zip(engine.parameters(), original, strict=True))
    tab.add("ext.restore_bitexact", same, "ok" if same else "FAIL")
    rule = UpdateRule(**{k: v for k, v in ctx.es.items() if k in ("sigma", "alpha")})
    rec = rule.make([(51, 1.0, b.version), (52, -0.5, b.version)], b.version)
    w.es_replay([r.to_dict() for r in [*b.es.log, rec]], rec.version)
    b.sync([*b.es.log, rec])
    same = engine_equal(b.model)
    tab.add("ext.update_vs_hf", same, "ok" if same else "FAIL")
    stats = w.es_stats()
    tab.add("ext.push_s", stats["push_s"] / max(stats["pushes"], 1),
            note=f"one push of the weights into the engine; {stats['pushes']} pushes")  # fmt: skip
    w.es_close()


def load_driver() -> tuple[Any, Any, str]:
    """The simulator's policy and driver modules; as single files where the package's deps
    are missing."""
    try:
        from staleness_sim.core import driver, policies

        return policies, driver, "staleness_sim.core.policies, .driver"
    except ImportError as exc:  # the package __init__ needs pydantic / simpy; these do not
        mods = []
        for name in ("policies", "driver"):
            # under the package's names, so the driver's import of the policies finds the file
            path = REPO / "staleness_sim" / "core" / f"{name}.py"
            spec = importlib.util.spec_from_file_location(f"staleness_sim.core.{name}", path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mod
            spec.loader.exec_module(mod)
            mods.append(mod)
        return *mods, f"staleness_sim/core/policies.py and driver.py loaded as files ({exc})"


def section_async(tab: Table, ctx: SimpleNamespace) -> None:
    policies, drivers, source = load_driver()
    small = ctx.args.small
    workers, cohort_size, updates = 2, 2 if small else 3, 2 if small else 3
    episodes, concurrency = (2, 2) if small else (8, 8)
    es = {**ctx.es, "sigma": 0.05, "alpha": 0.01}
    rule = UpdateRule(sigma=es["sigma"], alpha=es["alpha"])
    run_seed = 0
    # driven as RunState drives it, through the simulator's driver (no trace kept here)
    driver = drivers.PolicyDriver(
        policies.make_policy({"kind": "bounded", "max_lag": 1, "on_stale": "drop"}, cohort_size)
    )
    backends = [make_hf(ctx, es=es, max_new_tokens=min(ctx.tokens, 32)) for _ in range(workers)]
    log: list = []
    cohorts: list = []
    jobs: dict[int, dict[str, Any]] = {}

    def run_job(w: int, job: dict[str, Any]) -> float:
        b = backends[w]
        b.sync(log[: job["version"]])  # catch up to the dispatch version from seeds
        batcher = SessionBatcher(b, max_batch=64, window_s=0.02)
        with b.perturbed(job["seed"], job["sign"]), ThreadPoolExecutor(concurrency) as pool:

            def episode(i: int) -> float:
                batcher.open_session()
                try:
                    g = batcher.generate(GenerationRequest(
                        conversation(i), seed=derive_seed(job["sampling_seed"], i)))  # fmt: skip
                finally:
                    batcher.close_session()
                return difflib.SequenceMatcher(None, g.text, TARGET).ratio()

            rewards = list(pool.map(episode, range(episodes)))
        batcher.close()
        return sum(rewards) / len(rewards)

    t0 = time.perf_counter()
    idle = list(range(workers))
    running: dict[Any, tuple[int, int]] = {}
    with ThreadPoolExecutor(workers) as pool:
        while driver.version < updates:
            while idle:  # as RunState.dispatch
                now = time.perf_counter() - t0
                decision = driver.idle(idle[0], now)
                if not isinstance(decision, policies.Start):
                    break
                w = idle.pop(0)
                job = {"id": decision.job_id, "version": decision.version,
                       "seed": derive_seed(run_seed, "perturbation", decision.job_id), "sign": 1,
                       "sampling_seed": derive_seed(run_seed, "sampling", "version", decision.version)}  # fmt: skip
                jobs[job["id"]] = job
                running[pool.submit(run_job, w, job)] = (w, job["id"])
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in done:
                w, j = running.pop(fut)
                jobs[j]["reward"] = fut.result()
                driver.land(j)  # as RunState.land
                idle.append(w)
                while driver.ready() and driver.version < updates:  # as RunState.commit
                    cohort = driver.commit()
                    results = [Result(jobs[k]["seed"], jobs[k]["reward"], jobs[k]["version"])
                               for k in cohort.job_ids]  # fmt: skip
                    log.append(rule.make(results, cohort.version - 1))
                    now = time.perf_counter() - t0
                    driver.record_commit(cohort, time=now, commit_time=now)
                    cohorts.append(cohort)
        for fut in list(running):  # the run ends: jobs in flight are cancelled, as RunState.end
            fut.result()
            driver.cancel(running.pop(fut)[1], "run ended")
    wall = time.perf_counter() - t0
    accepted = [lag for cohort in cohorts for lag in cohort.lags]
    discarded = driver.counts["discarded"]
    for b in backends:
        b.sync(log)
    agree = len({b.weights_hash() for b in backends}) == 1
    for b in backends:
        b.close()
    tab.add("async.task", "string match (no container)", note=f"reward = difflib ratio to {TARGET}")
    tab.add(
        "async.policy",
        "bounded max_lag=1 drop",
        note=f"{workers} workers, cohort {cohort_size}; {source}",
    )
    tab.add("async.updates", len(log), "ok" if len(log) == updates else "FAIL")
    tab.add("async.accepted", len(accepted), note=f"lags {accepted}")
    tab.add("async.discarded", discarded)
    tab.add(
        "async.max_lag", max(accepted, default=0), "ok" if max(accepted, default=0) <= 1 else "FAIL"
    )
    rewards = [j["reward"] for j in jobs.values() if "reward" in j]
    tab.add("async.mean_reward", sum(rewards) / len(rewards), note=f"over {len(rewards)} jobs")
    tab.add("async.nonzero_updates", sum(any(c != 0.0 for _, c in r.entries) for r in log))
    tab.add("async.wall_s", wall, note=f"{episodes} episodes per job, {concurrency} sessions")
    tab.add("async.workers_agree", agree, "ok" if agree else "FAIL",
            "every worker replays the log to the same weights")  # fmt: skip


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


SECTIONS = [("model", section_model), ("hf", section_hf), ("es", section_es),
            ("ext", section_ext), ("async", section_async), ("vllm", section_vllm)]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--small", action="store_true", help="tiny model, few tokens (CPU tests)")
    ap.add_argument("--device", default=None, help="cuda (default when there is one) or cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--tokens", type=int, default=None, help="tokens per reply (128; small 6)")
    ap.add_argument("--noise", default="auto", help="noise scheme: auto | default | NAME")
    ap.add_argument("--model-dir", default=None, help="reuse (or keep) the model here")
    ap.add_argument("--json", default=None, help="also write the table as JSON here")
    ap.add_argument("--budget-s", type=float, default=420.0, help="skip sections after this")
    ap.add_argument("--vllm-memory", type=float, default=0.3, help="gpu_memory_utilization")
    ap.add_argument("--vllm-eager", action="store_true", help="vLLM without CUDA graphs")
    ap.add_argument("--skip", nargs="*", default=[], choices=[n for n, _ in SECTIONS])
    args = ap.parse_args(argv)

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    noise, why = choose_noise(args.noise)
    tmp = Path(tempfile.mkdtemp(prefix="gpu_check-"))
    ctx = SimpleNamespace(
        args=args, device=device, dtype=args.dtype, torch_dtype=getattr(torch, args.dtype),
        tokens=args.tokens or (6 if args.small else 128), context=512 if args.small else 2048,
        es={"sigma": 0.01, "alpha": 0.5, **noise}, tmp=tmp, t0=time.perf_counter(), hf=None,
    )  # fmt: skip
    tab = Table()
    name = (
        torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu"
    )
    tab.add("env.device", device, note=name)
    tab.add("env.torch", torch.__version__)
    import transformers

    tab.add("env.transformers", transformers.__version__)
    tab.add("env.noise", noise.get("noise", "default"), note=why)
    tab.add("env.small", bool(args.small))
    try:
        for key, fn in SECTIONS:
            if key in args.skip:
                tab.add(f"{key}.status", "skipped", "skipped", "--skip")
                continue
            if key != "model" and time.perf_counter() - ctx.t0 > args.budget_s:
                tab.add(f"{key}.status", "skipped", "skipped", "time budget spent")
                continue
            if key in ("es", "ext") and ctx.hf is None:
                ctx.hf = make_hf(ctx)
            t0 = time.perf_counter()
            try:
                fn(tab, ctx)
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # noqa: BLE001 - reported in the table, the rest still runs
                traceback.print_exc()
                tab.add(f"{key}.status", f"{type(exc).__name__}: {exc}"[:200], "error")
                if key == "model":
                    break
            else:
                tab.add(f"{key}.seconds", time.perf_counter() - t0)
            if key == "es" and "es.noise_scheme" not in tab.results and ctx.hf is not None:
                tab.add("es.noise_scheme", ctx.hf.es.config()["noise"]["scheme"])
    except KeyboardInterrupt:
        tab.add("interrupted", True, "error", "stopped by a signal (time limit?)")
    finally:
        if ctx.hf is not None:
            with contextlib.suppress(Exception):
                ctx.hf.close()
        shutil.rmtree(tmp, ignore_errors=True)
    tab.add("elapsed_s", time.perf_counter() - ctx.t0)
    print(tab.render(), flush=True)
    doc = {"schema": "gpu_check/v1", "failed": tab.failed, "results": tab.results, "rows": tab.rows}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str))
    return 1 if tab.failed else 0


if __name__ == "__main__":
    sys.exit(main())
