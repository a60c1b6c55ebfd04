"""Held-out prediction across workers on one machine (docs/turns.md, "Across workers"):
measured CPU runs of one setup with G = 1 and G = 2 workers, each predicted from the
other. With ``--cores K`` (the machine's cores) a run of G workers is fitted with
``job.cpu.cores = K / G`` (each worker's containers and engine share its even part of the
cores) and predicted at G' with ``workers=G'`` and ``job.cpu.cores = K / G'``; the turn
model without the shared CPU and the run's empirical job durations are shown beside it
(neither can see the workers share the machine).

    python benchmarks/across_workers.py RUN_G1 RUN_G2 [--cores 2] [--seeds 10]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from across_concurrency import compare, measured, show


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--cores", type=float, default=2.0, help="the machine's cores")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    meas = {run: measured(run) for run in args.runs}
    rows = []
    for fit, f in meas.items():
        for run, m in meas.items():
            if run == fit:
                continue
            row = {"fit G": f["workers"], "G": m["workers"], "C": m["concurrency"]}
            row |= {"measured": m["results_per_hour"], "noise (1 SE)": m["rel_se"]}
            row |= {"idle measured": m["idle"]}
            sets = [f"workers={m['workers']}", f"job.cpu.cores={args.cores / m['workers']}"]
            rows.append(compare(row, fit, sets, args.cores / f["workers"], args.seeds, m))
    show(rows, args.json)


if __name__ == "__main__":
    main()
