"""Speed of the success model: the published 120-update run with and without ``learning:``.

    PYTHONPATH=. python benchmarks/bench_learning.py [--repeats 7] [--config configs/sim/paper_sync.yaml]

Times ``run_summary`` (what ``staleness-sim run --json`` does) of the config as it is and
with its ``learning:`` block removed, interleaved in one process so that both see the same
machine load; prints each pair, the ratio's median and range, and the absolute time with
learning. The issue's bounds: at most 2 s, at most 5x the run without learning.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from staleness_sim.config import load_scenario
from staleness_sim.summary import run_summary

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=ROOT / "configs/sim/paper_sync.yaml")
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    with_learning = load_scenario(args.config)
    if with_learning.learning is None:
        raise SystemExit(f"{args.config}: no learning: block")
    without = with_learning.model_copy(update={"learning": None})
    run_summary(with_learning)  # warm-up: imports, caches
    pairs = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        run_summary(without)
        t1 = time.perf_counter()
        run_summary(with_learning)
        t2 = time.perf_counter()
        pairs.append((t1 - t0, t2 - t1))
        print(f"without {t1 - t0:.3f} s, with {t2 - t1:.3f} s, ratio {(t2 - t1) / (t1 - t0):.2f}")
    ratios = [b / a for a, b in pairs]
    withs = [b for _, b in pairs]
    print(
        f"\n{args.config.name}: with learning median {statistics.median(withs):.3f} s "
        f"(range {min(withs):.3f}-{max(withs):.3f}); ratio median {statistics.median(ratios):.2f}x "
        f"(range {min(ratios):.2f}-{max(ratios):.2f}) over {args.repeats} interleaved pairs"
    )


if __name__ == "__main__":
    main()
