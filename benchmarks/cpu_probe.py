"""How much CPU the machine gives two busy processes, beside one alone: a probe taken
between measured runs, to tell a change of the machine from an error of the model.

    python benchmarks/cpu_probe.py [--seconds 5] [--label NAME] [--out PROBES.jsonl]

For each workload (``torch``: single-threaded float32 matrix products of the m6 model's
MLP shape; ``python``: a pure-Python loop) it counts iterations in ``--seconds`` with one
process alone, then with two processes at once (started together on a barrier), and
prints the pair's speed per process relative to one alone. On 2 cores that share
nothing the ratio is near 1; on two hyperthreads of one physical core it falls to about
0.5-0.7, and a host that lends the cores elsewhere shows it as steal or as a lower ratio.
It also reads the CPU time the host stole (``/proc/stat``) while it ran. ``--out``
appends one JSON line (time, label, rates, ratios, steal) so that probes taken around a
sitting's runs can be set beside them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from pathlib import Path

WORKLOADS = ("torch", "python", "weights")


def _torch_step(state):
    state["y"] = state["x"] @ state["w"]


def _weights_step(state):
    """One decode step of batch 4 through matrices of the m6 model's shapes (6 layers,
    hidden 384, 12 of 24 heads for keys and values, MLP 768: 32 MB of float32, as large
    as the L3 cache the 2 cores share), so that two at once contend for cache and memory."""
    x = state["x"][:4]
    for inputs, up, down in state["layers"]:
        for w in inputs:
            x @ w
        x = (x @ up) @ down


def _python_step(state):
    total = 0
    for k in range(20_000):
        total += k * k
    state["total"] = total


def _count(workload: str, seconds: float, start, results) -> None:
    """Iterations of ``workload`` in ``seconds`` after every process reached ``start``."""
    if workload == "torch":
        import torch

        torch.set_num_threads(1)
        state, step = {"x": torch.randn(16, 384), "w": torch.randn(384, 1536)}, _torch_step
    elif workload == "weights":
        import torch

        torch.set_num_threads(1)
        d, kv, mlp = 384, 192, 768
        layers = [
            (
                [torch.randn(d, n) for n in (d, kv, kv, d, mlp)],
                torch.randn(d, mlp),
                torch.randn(mlp, d),
            )
            for _ in range(6)
        ]
        state, step = {"x": torch.randn(4, d), "layers": layers}, _weights_step
    else:
        state, step = {}, _python_step
    for _ in range(20):  # warm caches and allocators before the clock starts
        step(state)
    start.wait()
    n, t_0 = 0, time.perf_counter()
    while time.perf_counter() - t_0 < seconds:
        step(state)
        n += 1
    results.put(n / (time.perf_counter() - t_0))


def rates(workload: str, processes: int, seconds: float) -> list[float]:
    """Iterations a second of each of ``processes`` running ``workload`` at once."""
    ctx = mp.get_context("spawn")
    start, results = ctx.Barrier(processes), ctx.Queue()
    procs = [
        ctx.Process(target=_count, args=(workload, seconds, start, results))
        for _ in range(processes)
    ]
    for p in procs:
        p.start()
    out = [results.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    return out


def cpu_times() -> tuple[float, float]:
    """(all, steal) jiffies from /proc/stat's first line."""
    fields = [float(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return sum(fields), fields[7] if len(fields) > 7 else 0.0


def probe(seconds: float) -> dict:
    total_0, steal_0 = cpu_times()
    row: dict = {}
    for workload in WORKLOADS:
        alone = rates(workload, 1, seconds)[0]
        pair = rates(workload, 2, seconds)
        row[workload] = {"alone": alone, "pair": pair, "ratio": sum(pair) / 2 / alone}
    total_1, steal_1 = cpu_times()
    row["steal_share"] = (steal_1 - steal_0) / max(total_1 - total_0, 1.0)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="each measurement (default 5)")
    ap.add_argument("--label", default="", help="a name for this probe in --out")
    ap.add_argument("--out", type=Path, help="append the probe as one JSON line")
    args = ap.parse_args(argv)
    if args.seconds <= 0:
        ap.error(f"--seconds must be > 0, got {args.seconds}")
    row = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "label": args.label}
    row.update(probe(args.seconds))
    for workload in WORKLOADS:
        r = row[workload]
        print(
            f"{workload:>6}: alone {r['alone']:.1f}/s, two at once "
            f"{r['pair'][0]:.1f} and {r['pair'][1]:.1f}/s: {r['ratio']:.3f} of alone"
        )
    print(f" steal: {100 * row['steal_share']:.2f} % of the CPU time")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
