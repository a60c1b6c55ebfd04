"""Held-out prediction across workers on one machine (docs/turns.md, "Across workers"):
measured CPU runs of one setup with G = 1 and G = 2 workers, each predicted from the
other. With ``--cores K`` (the machine's cores) a run of G workers is fitted with
``job.cpu.cores = K / G`` (each worker's containers and engine share its even part of the
cores) and predicted at G' with ``workers=G'`` and ``job.cpu.cores = K / G'``; the turn
model without the shared CPU and the run's empirical job durations are shown beside it
(neither can see the workers share the machine).

    python benchmarks/across_workers.py RUN_G1 RUN_G2 [--cores 2] [--seeds 10]
        [--engine-cpu ENGINE_CPU.yaml] [--pooled] [--json]

With ``--engine-cpu`` the engine's own CPU demand (measured apart) is what each engine
wanted in the fit run and still wants in the prediction, whatever its worker's cores
(moment by moment only); without it an engine wants all of its worker's ``K / G``.

With ``--pooled``, for several runs of each G (a sitting that alternates them), each way's
predictions from the runs of one G are averaged and set against the mean of the measured
runs of the other G: a run's speed drifts from one run to the next on a shared machine,
and the means drift less than one run does.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
from across_concurrency import WAYS, add_engine_cpu, compare, measured, read_engine_cpu, show


def pooled(rows: list[dict]) -> list[dict]:
    """Per direction (fit G -> G) and way: the mean of the predictions from each run of
    the fit G (one per run: a fit predicts every run of one G alike) against the mean of
    the measured runs of the other G."""
    cross = pd.DataFrame([r for r in rows if r["fit G"] != r["G"]])
    out = []
    for (fit_g, g), part in cross.groupby(["fit G", "G"]):
        measured_mean = part.drop_duplicates("run")["measured"].mean()
        per_fit = part.drop_duplicates("fit")
        row = {"fit G": fit_g, "G": g, "fits": len(per_fit), "runs": part["run"].nunique()}
        row["measured"] = measured_mean
        for way in WAYS:
            row[way] = per_fit[way].mean()
            row[f"{way} error"] = row[way] / measured_mean - 1
        out.append(row)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--cores", type=float, default=2.0, help="the machine's cores")
    p.add_argument("--seeds", type=int, default=10)
    add_engine_cpu(p)
    p.add_argument(
        "--pooled", action="store_true", help="the mean predictions against the mean runs"
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    engine_cpu = read_engine_cpu(args.engine_cpu)
    meas = {run: measured(run) for run in args.runs}
    rows = []
    for fit, f in meas.items():
        for run, m in meas.items():
            if run == fit or (args.pooled and m["workers"] == f["workers"]):  # replays unused
                continue
            row = {"fit": fit.name, "run": run.name}  # which row is which, among repeats
            row |= {"fit G": f["workers"], "G": m["workers"], "C": m["concurrency"]}
            row |= {"measured": m["results_per_hour"], "noise (1 SE)": m["rel_se"]}
            row |= {"idle measured": m["idle"], "busy cores measured": m["busy"]}
            row |= {"process cores": m["process busy"]}
            sets = [f"workers={m['workers']}", f"job.cpu.cores={args.cores / m['workers']}"]
            cores = args.cores / f["workers"]
            rows.append(compare(row, fit, sets, cores, args.seeds, m, engine_cpu=engine_cpu))
    show(pooled(rows) if args.pooled else rows, args.json)


if __name__ == "__main__":
    main()
