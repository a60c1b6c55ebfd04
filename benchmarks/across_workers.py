"""Held-out prediction across workers on one machine (docs/turns.md, "Across workers"):
measured CPU runs of one setup with G = 1 and G = 2 workers, each predicted from the
other. With ``--cores K`` (the machine's cores) a run of G workers is fitted with
``job.cpu.cores = K / G`` (each worker's containers and engine share its even part of the
cores) and predicted at G' with ``workers=G'`` and ``job.cpu.cores = K / G'``; the turn
model without the shared CPU and the run's empirical job durations are shown beside it
(neither can see the workers share the machine).

    python benchmarks/across_workers.py RUN_G1 RUN_G2 [--cores 2] [--seeds 10]
        [--engine-cpu ENGINE_CPU.yaml]

With ``--engine-cpu`` the engine's own CPU demand (measured apart) is what each engine
wanted in the fit run and still wants in the prediction, whatever its worker's cores
(moment by moment only); without it an engine wants all of its worker's ``K / G``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from across_concurrency import add_engine_cpu, compare, measured, read_engine_cpu, show


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--cores", type=float, default=2.0, help="the machine's cores")
    p.add_argument("--seeds", type=int, default=10)
    add_engine_cpu(p)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    engine_cpu = read_engine_cpu(args.engine_cpu)
    meas = {run: measured(run) for run in args.runs}
    rows = []
    for fit, f in meas.items():
        for run, m in meas.items():
            if run == fit:
                continue
            row = {"fit": fit.name, "run": run.name}  # which row is which, among repeats
            row |= {"fit G": f["workers"], "G": m["workers"], "C": m["concurrency"]}
            row |= {"measured": m["results_per_hour"], "noise (1 SE)": m["rel_se"]}
            row |= {"idle measured": m["idle"], "busy cores measured": m["busy"]}
            row |= {"process cores": m["process busy"]}
            sets = [f"workers={m['workers']}", f"job.cpu.cores={args.cores / m['workers']}"]
            cores = args.cores / f["workers"]
            rows.append(compare(row, fit, sets, cores, args.seeds, m, engine_cpu=engine_cpu))
    show(rows, args.json)


if __name__ == "__main__":
    main()
