"""The engine alone, as a run configures it: a decode curve for the turn model (``job.engine``)
measured by a short benchmark rather than fitted from a run.

    python benchmarks/engine_curve.py CONFIG [--batches 1 2 4 8 16] [--turns 3] [--rounds 2]
        [--words 38] [--output-words 10] [--set KEY=VALUE ...] [--out ENGINE.yaml]
        [--rows TURNS.json] [--json]
    python benchmarks/engine_curve.py --from TURNS.json [--out ENGINE.yaml] [--json]

CONFIG is a runner config (or a run's ``config.yaml``): its model, sampling and batching
settings build the backend a worker would. For each batch size B, B sessions start
together and run ``--turns`` turns each with commands of 0 s (so the batch stays B), a
prompt of about ``--words`` file names, and ``--output-words`` words of command output
after every reply (the defaults give about 350, 520 and 690 prompt tokens with the
tiny tokenizer: the generated tasks' turns). Each turn's generation seconds, the batch
it saw and the context its batch held are fitted, as a run's per-turn records are
(``staleness_sim.validation.turn_fit``), by least squares with ``a + s (b - 1) + k *
held`` seconds a step (all >= 0), and written as an engine spec (``--out``): ``curve``
from batch 1 to the largest B, ``context_s_per_token`` k.

Measured alone, the engine is not the engine of a run: on the 2-core machine a batch of
one decoded 12.2 ms a token alone and 7.9 ms within a run at C = 1 made minutes later
(docs/turns.md, "A third sitting"); cores left idle are slower to use.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from harness import SYSTEM
from scipy import optimize

from runner.backends import GenerationRequest, SessionBatcher
from runner.config import load_run_config
from runner.errors import UserError
from runner.workers.local import build_backend
from staleness_sim.core.settings import ConfigError
from staleness_sim.durations.engine_model import EngineSpec
from staleness_sim.validation.turn_fit import _mean_load


def sessions_at(backend, batch: int, turns: int, words: int, output_words: int, rnd: int):
    """``batch`` sessions started together; one row per turn."""
    batcher = SessionBatcher(backend, max_batch=max(64, batch), window_s=0.0)
    opened, rows, t_0 = threading.Barrier(batch), [], time.perf_counter()

    def session(i: int) -> None:
        names = " ".join(f"file{i}_{k}.csv" for k in range(words))
        msgs = [SYSTEM, {"role": "user", "content": f"Task {i}: aggregate the columns of {names}"}]
        batcher.open_session()
        opened.wait()
        for t in range(turns):
            t0 = time.perf_counter()
            reply = batcher.generate(GenerationRequest(list(msgs), seed=1000 * i + t + 7919 * rnd))
            rows.append(
                {"batch": batch, "round": rnd, "start": t0 - t_0,
                 "gen_s": time.perf_counter() - t0, "tokens_in": reply.tokens_in,
                 "tokens_out": reply.tokens_out}
            )  # fmt: skip
            output = " ".join(f"row{k},{i}" for k in range(output_words))
            msgs += [
                {"role": "assistant", "content": reply.text},
                {"role": "user", "content": f"Output: {output}"},
            ]
        batcher.close_session()

    threads = [threading.Thread(target=session, args=(i,)) for i in range(batch)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    batcher.close()
    return rows


def turn_table(rows: list[dict]) -> pd.DataFrame:
    """Each turn's reply tokens, seconds, the mean batch it saw and the context held."""
    out = []
    for _, g in pd.DataFrame(rows).groupby(["round", "batch"], sort=True):
        start, gen = g["start"].to_numpy(float), g["gen_s"].to_numpy(float)
        tok_out = g["tokens_out"].to_numpy(float)
        held = g["tokens_in"].to_numpy(float) + tok_out / 2
        out.append(
            pd.DataFrame(
                {
                    "sessions": g["batch"].to_numpy(),
                    "out": tok_out,
                    "gen_s": gen,
                    "batch": _mean_load(start, start + gen, np.ones(len(gen))),
                    "held": _mean_load(start, start + gen, held),
                }
            )  # fmt: skip
        )
    table = pd.concat(out, ignore_index=True)
    return table[table["out"] > 0]


def fit(table: pd.DataFrame, top: int) -> dict:
    """The engine spec: ``a + s (b - 1) + k * held`` by non-negative least squares."""
    out = table["out"].to_numpy(float)
    x = np.column_stack([out, out * (table["batch"] - 1.0), out * table["held"]])
    (a, s, k), _ = optimize.nnls(x, table["gen_s"].to_numpy(float))
    if not a + k > 0:
        raise SystemExit("engine_curve: the turns give no decode rate")
    spec = {
        "curve": {"batch": [1, int(top)], "step_s": [float(a), float(a + s * (top - 1))]},
        "context_s_per_token": float(k),
    }
    EngineSpec.model_validate(spec)  # what the simulator will accept
    return spec


def measure(args: argparse.Namespace) -> list[dict]:
    """Every batch size, ``args.rounds`` times, on the backend the config builds."""
    backend = build_backend(load_run_config(args.config, args.set))
    try:
        backend.generate([GenerationRequest([SYSTEM], seed=0)])  # warm-up
        rows = []
        for rnd in range(args.rounds):
            for b in args.batches:
                rows += sessions_at(backend, b, args.turns, args.words, args.output_words, rnd)
                print(f"batch {b}, round {rnd + 1}: {len(rows)} turns", file=sys.stderr)
    finally:
        backend.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", type=Path, nargs="?", help="not needed with --from")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="every batch size this many times")
    ap.add_argument("--words", type=int, default=38, help="file names in the first prompt")
    ap.add_argument("--output-words", type=int, default=10, help="command output a turn")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", type=Path, help="write the engine spec (YAML) here")
    ap.add_argument("--rows", type=Path, help="write every timed turn (JSON) here")
    ap.add_argument("--from", dest="source", type=Path, help="fit turns saved with --rows")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    bad = [b for b in args.batches if b < 1] + ([args.turns] if args.turns < 1 else [])
    if bad or args.rounds < 1:
        ap.error("--batches, --turns and --rounds must be >= 1")
    if (args.config is None) == (args.source is None):
        ap.error("give a CONFIG to measure, or --from turns saved earlier")
    try:
        rows = json.loads(args.source.read_text()) if args.source else measure(args)
    except (ConfigError, UserError, OSError, ValueError) as exc:
        print(f"engine_curve: {exc}", file=sys.stderr)
        return 2
    if args.rows is not None:
        args.rows.write_text(json.dumps(rows))
    table = turn_table(rows)
    spec = fit(table, int(table["sessions"].max()))
    by_batch = [
        {"sessions": int(n), "mean_batch": round(float(g["batch"].mean()), 2),
         "held_tokens": round(float(g["held"].mean())),
         "ms_per_token": round(1e3 * float(g["gen_s"].sum() / g["out"].sum()), 2)}
        for n, g in table.groupby("sessions")
    ]  # fmt: skip
    if args.out is not None:
        args.out.write_text(yaml.safe_dump(spec, sort_keys=False))
    if args.json:
        print(json.dumps({"by_batch": by_batch, "engine": spec}, indent=1))
    else:
        print(pd.DataFrame(by_batch).to_string(index=False))
        c = spec["curve"]["step_s"]
        print(
            f"engine: {c[0] * 1e3:.3g} ms at batch 1, {c[1] * 1e3:.3g} ms at "
            f"{spec['curve']['batch'][1]}, + {spec['context_s_per_token'] * 1e6:.3g} us per "
            "token held"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
