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

This file holds the table, the model section and the command line; the sections live beside
it, one file per job: ``gpu_generation.py`` (hf, vllm), ``gpu_exactness.py`` (es, ext) and
``gpu_async.py`` (async). A new section is a function ``(tab, ctx)`` added to ``SECTIONS``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from gpu_async import section_async
from gpu_exactness import choose_noise, section_es, section_ext
from gpu_generation import make_hf, section_hf, section_vllm

from runner.models import build_tiny_model

FULL = {"hidden_size": 1024, "num_layers": 24, "num_heads": 16, "num_kv_heads": 4,
        "intermediate_size": 4096, "max_position_embeddings": 4096}  # fmt: skip
SMALL = {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
         "intermediate_size": 128, "max_position_embeddings": 512}  # fmt: skip


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
