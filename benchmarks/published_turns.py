"""The published setting with the turn model, as a check that is not tuned: minutes per
evaluation (one job: 256 episodes over 32 sessions) and per update predicted by a roofline
of Qwen2.5-7B in bf16 on an H200 (configs/sim/paper_turns.yaml), set beside the published
5.1 to 11.9 minutes per evaluation.

The published budgets are caps (16 turns, 2,048 tokens a turn, a 16,384-token context,
300 s per episode), not what episodes use; the first row uses every budget in full (an
upper bound on work), the others smaller turn counts and replies, so the table shows
which token counts the published times correspond to on an ideal engine.

    python benchmarks/published_turns.py [--updates 20] [--json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from staleness_sim import load_scenario, simulate, summarize
from staleness_sim.cohort.config import validate_cohort
from staleness_sim.core.settings import scenario_dict
from staleness_sim.durations import make_job

ROOT = Path(__file__).resolve().parents[1]

CONFIG = ROOT / "configs" / "sim" / "paper_turns.yaml"
PUBLISHED = (5.1, 11.9)  # minutes per evaluation
ROWS = [(16, 2048), (16, 1024), (16, 512), (8, 1024), (8, 512), (8, 256), (4, 512), (4, 256)]


def scenario(turns: int, reply: int, updates: int):
    data = scenario_dict(load_scenario(CONFIG))
    data["updates"] = updates
    data["job"]["turns"]["count"]["value"] = turns
    data["job"]["turns"]["reply_tokens"]["value"] = reply
    return validate_cohort(data)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for turns, reply in ROWS:
        sc = scenario(turns, reply, args.updates)
        evals = make_job(sc.job).sample(np.random.default_rng(0), 8) / 60
        summary = summarize(simulate(sc))
        rows.append(
            {
                "turns": turns,
                "reply_tokens": reply,
                "decode_tokens_per_episode": turns * reply,
                "minutes_per_evaluation": float(evals.mean()),
                "minutes_per_update": 60 / summary["updates_per_hour"],
                "in_published_range": PUBLISHED[0] <= evals.mean() <= PUBLISHED[1],
            }
        )
    if args.json:
        print(json.dumps(rows))
        return
    print("| turns | reply tokens | minutes per evaluation | minutes per update | in 5.1-11.9 |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['turns']} | {r['reply_tokens']} | {r['minutes_per_evaluation']:.1f} | "
            f"{r['minutes_per_update']:.1f} | {'yes' if r['in_published_range'] else 'no'} |"
        )


if __name__ == "__main__":
    main()
