"""What-ifs of held-out success on the published setting, from the success model.

    PYTHONPATH=. python benchmarks/success_whatifs.py [--seeds R] [--out DIR] [--set KEY=VALUE ...]

(``--set`` applies to every scenario, e.g. ``--set learning.coupling=0.0 --set
learning.effect=71.8``: another calibration, fitted on sync alone with
``staleness-sim fit --learning configs/sim/paper_sync.yaml --set learning.coupling=0.0``.)

Writes ``OUT/results.csv`` (one row per scenario and seed, the ``run --json`` summary's
numbers), ``OUT/tables.md`` (the three tables below) and ``OUT/sensitivity.png``:

1. the four published schedules (configs/sim/paper_*.yaml, their ``learning:`` block fitted
   on sync alone) at G = 4, 8, 16, 32: final success and hours to the target (25 %);
2. controlled delay at fractions 0.1, 0.3, 0.5 and delays 1 to 32 (G = 4);
3. unbounded asynchrony at growing G.

With ``--published`` it runs only the four schedules at G = 4 and prints them beside the
published held-out success (with its binomial error over 300 tasks x 3 evaluation seeds).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

from staleness_sim.config import load_scenario
from staleness_sim.summary import policy_label, run_summary

ROOT = Path(__file__).resolve().parents[1]
PAPER = [ROOT / f"configs/sim/paper_{s}.yaml" for s in ("sync", "async1", "async4", "async8")]
WORKERS = (4, 8, 16, 32)
FRACTIONS = (0.1, 0.3, 0.5)
DELAYS = (1, 2, 4, 8, 16, 32)
UNBOUNDED_WORKERS = (4, 8, 16, 32, 64)


PUBLISHED = {"paper_sync": 25.4, "paper_async1": 25.9, "paper_async4": 23.8, "paper_async8": 22.3}
EVALUATED = 900  # 300 tasks x 3 evaluation seeds


def scenarios(published: bool = False) -> list[tuple[str, Path, list[str]]]:
    if published:
        return [("schedules", c, ["workers=4"]) for c in PAPER]
    out = [("schedules", c, [f"workers={g}"]) for g in WORKERS for c in PAPER]
    out += [
        ("delay", PAPER[2], [f"policy.fraction={f}", f"policy.delay={d}"])
        for f in FRACTIONS
        for d in DELAYS
    ]
    out += [("unbounded", PAPER[0], ["policy={kind: unbounded}", f"workers={g}"])
            for g in UNBOUNDED_WORKERS]  # fmt: skip
    return out


def run_all(seeds: int, extra: list[str], published: bool = False) -> pd.DataFrame:
    rows = []
    todo = scenarios(published)
    start = time.time()
    for i, (table, config, sets) in enumerate(todo):
        for seed in range(seeds):
            sc = load_scenario(config, [*extra, *sets, f"seed={seed}"])
            s = run_summary(sc)
            rows.append(
                {
                    "table": table,
                    "config": config.stem,
                    "G": sc.workers,
                    "policy": policy_label(sc),
                    "fraction": getattr(sc.policy, "fraction", np.nan),
                    "delay": getattr(sc.policy, "delay", np.nan),
                    "seed": seed,
                    "hours": s["wall_clock_s"] / 3600,
                    "stale_fraction": s["stale_fraction"],
                    "mean_lag": s["mean_lag"],
                    "success_final": s["success_final"],
                    "hours_to_success": s["hours_to_success"],
                }
            )
        print(f"{i + 1}/{len(todo)} scenarios, {time.time() - start:.0f} s", flush=True)
    return pd.DataFrame(rows)


def summarise(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    def reached(h: pd.Series) -> str:
        n = h.notna().sum()
        mean = f"{h.mean():.0f}" if n else "never"
        return mean + ("" if n == len(h) else f" ({n}/{len(h)} seeds)")

    g = frame.groupby(keys, sort=False)
    return pd.DataFrame(
        {
            "success %": g["success_final"].mean() * 100,
            "sd": g["success_final"].std() * 100,
            "h to 25 %": g["hours_to_success"].apply(reached),
            "hours": g["hours"].mean(),
            "stale %": g["stale_fraction"].mean() * 100,
            "mean lag": g["mean_lag"].mean(),
        }
    ).reset_index()


def published_table(frame: pd.DataFrame) -> pd.DataFrame:
    g = frame.groupby("config", sort=False)["success_final"]
    p = pd.Series(PUBLISHED)
    return (
        pd.DataFrame(
            {
                "predicted %": g.mean() * 100,
                "sd": g.std() * 100,
                "published %": p,
                "+- binomial": 100 * np.sqrt(p / 100 * (1 - p / 100) / EVALUATED),
            }
        )
        .rename_axis("config")
        .reset_index()
    )


def markdown(table: pd.DataFrame) -> str:
    fmt = {"success %": "{:.1f}", "sd": "{:.1f}", "predicted %": "{:.1f}", "published %": "{:.1f}",
           "+- binomial": "{:.1f}", "hours": "{:.0f}", "stale %": "{:.1f}",
           "mean lag": "{:.2f}", "fraction": "{:g}", "delay": "{:g}"}  # fmt: skip
    cols = list(table.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in table.iterrows():
        cells = [fmt[c].format(row[c]) if c in fmt else str(row[c]) for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figure(frame: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    sync = frame[(frame["table"] == "schedules") & (frame["config"] == "paper_sync")]
    sync4 = sync[sync["G"] == 4]["success_final"] * 100
    for ax in (left, right):
        ax.axhspan(sync4.mean() - sync4.std(), sync4.mean() + sync4.std(), color="0.85",
                   label="sync, G = 4 (mean +- sd)")  # fmt: skip
        ax.set_ylabel("held-out success after 120 updates (%)")
    delay = frame[frame["table"] == "delay"]
    for f, part in delay.groupby("fraction"):
        g = part.groupby("delay")["success_final"]
        left.errorbar(g.mean().index, g.mean() * 100, g.std() * 100, marker="o", capsize=3,
                      label=f"controlled delay, fraction {f:g}")  # fmt: skip
    left.set_xscale("log", base=2)
    left.set_xlabel("delay (updates)")
    left.set_title("G = 4: a fraction of each cohort held back")
    left.legend(fontsize=8)
    for name, part in frame[frame["table"] != "schedules"].groupby("table"):
        g = part.groupby(["fraction", "delay", "G"], dropna=False)
        right.scatter(g["stale_fraction"].mean() * 100, g["success_final"].mean() * 100,
                      label=name if name != "delay" else "controlled delay (G = 4)")  # fmt: skip
    unb = frame[frame["table"] == "unbounded"].groupby("G")
    for gw, x, y in zip(unb.groups, unb["stale_fraction"].mean() * 100,
                        unb["success_final"].mean() * 100, strict=True):  # fmt: skip
        right.annotate(f"G={gw}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    right.set_xlabel("stale fraction of used results (%)")
    right.set_title("success against the stale fraction")
    right.legend(fontsize=8)
    fig.suptitle("Success model, published setting (N = 30, D = 256, sigma 0.0015, alpha 0.00075)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--out", type=Path, default=ROOT / "examples" / "success_whatifs")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--published", action="store_true", help="only the four schedules at G = 4")
    args = p.parse_args()
    if args.published:
        frame = run_all(args.seeds, args.sets, published=True)
        print(markdown(published_table(frame)))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    frame = run_all(args.seeds, args.sets)
    frame.to_csv(args.out / "results.csv", index=False)
    parts = [
        ("Published schedules by G", frame[frame["table"] == "schedules"], ["G", "policy"]),
        ("Controlled delay, G = 4", frame[frame["table"] == "delay"], ["fraction", "delay"]),
        ("Unbounded asynchrony", frame[frame["table"] == "unbounded"], ["G", "policy"]),
    ]
    text = [f"# Success what-ifs ({args.seeds} seeds each; mean, sd over seeds)", ""]
    if args.sets:
        text += ["Every scenario with " + ", ".join(f"`{s}`" for s in args.sets) + ".", ""]
    for title, part, keys in parts:
        text += [f"## {title}", "", markdown(summarise(part, keys)), ""]
    (args.out / "tables.md").write_text("\n".join(text))
    figure(frame, args.out / "sensitivity.png")
    print("\n".join(text))


if __name__ == "__main__":
    main()
