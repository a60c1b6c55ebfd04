"""Turn batching against continuous batching in the hf backend, as ratios in one run.

C sessions run concurrently, each for several turns: generate a reply through the session
batcher (the path a job takes), then "run the command" for a random time, then the next
turn. Replies end at a stop string, so their lengths differ as agents' replies do. Under
``model.batching: turn`` a batch decodes until its longest reply is done and a session
that was running its command waits for the next batch; under ``continuous`` a turn joins
the running batch at the next token. The same seeds give the same replies in both modes
(checked), so the ratio is of speed alone. A third run adds ``model.prefix_reuse`` to
continuous batching (a turn reuses the states of its session's previous turn); reused
states equal recomputed ones to rounding only, so its replies are compared, not required
to match. ``continuous_cores`` is the process's CPU seconds over the wall seconds of the
continuous run: the cores the engine keeps busy (the session threads only wait). With
``--command-ms 0`` a run of B sessions keeps the batch at B, and ``--engine-cpu-out FILE``
writes those cores by batch, with torch's threads, as ``job.cpu`` fields of the turn
model (``engine_cores``, ``engine_threads``: docs/turns.md) for a what-if with ``--set``.

Usage: python benchmarks/bench_batching.py [--sessions 8 32] [--turns 4] [--tokens 64]
       [--command-ms 20] [--instruction-words 0] [--model DIR] [--device cpu] [--json]
       [--engine-cpu-out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from harness import SYSTEM
from harness import run_sessions as run_all

from runner.backends import GenerationRequest, make_backend
from runner.machine import machine
from runner.models import build_tiny_model

OBSERVATION = "Command executed successfully. Output: {t} lines"


def run_sessions(
    backend, sessions: int, turns: int, command_ms: float, instruction_words: int = 0
) -> dict:
    """Session i asks turn t with seed 1000 i + t and runs its commands on seed i, so both
    modes get the same replies and the same command times."""
    requests = []
    for i in range(sessions):
        details = " ".join(f"file{i}_{k}.txt" for k in range(instruction_words))
        task = f"Task {i}: count the lines of data{i}.txt. {details}"
        requests.append(GenerationRequest([SYSTEM, {"role": "user", "content": task}], 1000 * i))
    done = run_all(
        backend, requests, turns, seed_stride=1, command_ms=command_ms,
        command_seeds=range(sessions), observation=OBSERVATION,
    )  # fmt: skip
    return {
        "wall_s": done.wall_s,
        "tokens": done.tokens,
        "tokens_per_s": done.tokens / done.wall_s,
        "wait_per_turn_ms": 1000 * done.waited_s / (sessions * turns),
        "cores": done.cpu_s / done.wall_s,  # every thread of this process: the engine's
        "texts": done.texts,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64, help="max new tokens per turn")
    ap.add_argument("--command-ms", type=float, default=20.0, help="mean command time")
    ap.add_argument(
        "--instruction-words", type=int, default=0, help="lengthen each task's instruction"
    )
    ap.add_argument("--stop", default="a", help="stop string (ends replies at random lengths)")
    ap.add_argument("--model", help="a saved model folder (default: a tiny random one)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--engine-cpu-out",
        type=Path,
        metavar="FILE",
        help="write the continuous runs' cores by batch (YAML) as the engine's own CPU demand",
    )
    args = ap.parse_args(argv)
    if args.engine_cpu_out is not None:
        if any(b <= a for a, b in zip(args.sessions, args.sessions[1:], strict=False)):
            ap.error("--engine-cpu-out needs --sessions in increasing order")
        if args.command_ms != 0:
            ap.error("--engine-cpu-out needs --command-ms 0 (so that the batch stays at B)")

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(build_tiny_model(Path(tmp) / "tiny", seed=0))
        common = dict(
            path=model, device=args.device, max_new_tokens=args.tokens, context_tokens=2048,
            stop=(args.stop,),
        )  # fmt: skip
        rows = []
        for n in args.sessions:
            result = {}
            for mode in ("turn", "continuous", "reuse"):
                backend = make_backend(
                    "hf",
                    batching="turn" if mode == "turn" else "continuous",
                    prefix_reuse=mode == "reuse",
                    **common,
                )
                backend.generate([GenerationRequest([SYSTEM], seed=0)])  # warm-up
                result[mode] = run_sessions(
                    backend, n, args.turns, args.command_ms, args.instruction_words
                )
                backend.close()
            same = result["turn"]["texts"] == result["continuous"]["texts"]
            if not same:
                print("warning: the two modes gave different replies", file=sys.stderr)
            turn, cont, reuse = result["turn"], result["continuous"], result["reuse"]
            pairs = [
                (a, b)
                for x, y in zip(cont["texts"], reuse["texts"], strict=True)
                for a, b in zip(x, y, strict=True)
            ]
            rows.append(
                {
                    "sessions": n,
                    "turns": args.turns,
                    "tokens": turn["tokens"],
                    "same_replies": same,
                    "turn_tok_s": round(turn["tokens_per_s"], 1),
                    "continuous_tok_s": round(cont["tokens_per_s"], 1),
                    "speedup": round(cont["tokens_per_s"] / turn["tokens_per_s"], 3),
                    "turn_wait_ms": round(turn["wait_per_turn_ms"], 1),
                    "continuous_wait_ms": round(cont["wait_per_turn_ms"], 1),
                    "continuous_cores": round(cont["cores"], 2),
                    "reuse_tok_s": round(reuse["tokens_per_s"], 1),
                    "reuse_vs_continuous": round(reuse["tokens_per_s"] / cont["tokens_per_s"], 3),
                    "reuse_same_replies": round(sum(a == b for a, b in pairs) / len(pairs), 3),
                }
            )
    if args.engine_cpu_out is not None:
        write_engine_cpu(args.engine_cpu_out, rows)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        keys = list(rows[0])
        print("  ".join(keys))
        for r in rows:
            print("  ".join(str(r[k]) for k in keys))
    return 0


def provenance(rows: list[dict]) -> str:
    """YAML comments saying when, where and how fast the engine was measured: its demand
    differed by a tenth of a core between two processors, by 0.07 between two sessions on
    one, and by 0.02 within a sitting, so a file is used with runs of its own sitting."""
    m = machine()
    speed = ", ".join(f"{r['sessions']}: {r['continuous_tok_s']}" for r in rows)
    return (
        f"# measured {datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ} by benchmarks/bench_batching.py"
        f" on {m['cpu']} ({m['usable_cpus']} of {m['cpus']} CPUs, load {m['load_1m']})\n"
        f"# continuous tokens per second by batch: {speed}\n"
    )


def write_engine_cpu(path: Path, rows: list[dict]) -> None:
    """The engine's own CPU demand, as ``job.cpu``'s ``engine_cores`` and ``engine_threads``."""
    import torch
    import yaml

    spec = {
        "engine_threads": torch.get_num_threads(),
        "engine_cores": {
            "batch": [r["sessions"] for r in rows],
            "cores": [r["continuous_cores"] for r in rows],
        },
    }
    path.write_text(
        provenance(rows) + yaml.safe_dump(spec, sort_keys=False, default_flow_style=None)
    )
    print(f"engine cpu: {path}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
