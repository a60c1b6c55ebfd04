"""How much the turn model costs: the published 120-update run (G = 4, N = 30, 3,600 jobs of
256 episodes over 32 sessions) with job durations composed from episodes
(configs/sim/paper_async1.yaml) against the same run with the turn model
(configs/sim/paper_turns.yaml: a roofline engine), its turns drawn so that sessions
desynchronise as real ones do (about 8 turns of about 600 tokens, commands of about 1.6 s;
identical turns would end together and cost far fewer steps). The ratio is from one run of
each, on whatever machine runs it; the target is at most 10x.

    python benchmarks/bench_turns.py [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from staleness_sim import load_scenario, simulate, summarize  # noqa: E402
from staleness_sim.config import validate  # noqa: E402
from staleness_sim.core.settings import scenario_dict  # noqa: E402

CONFIGS = {
    "episodes": ROOT / "configs" / "sim" / "paper_async1.yaml",
    "turns": ROOT / "configs" / "sim" / "paper_turns.yaml",
}


TURNS = {
    "count": {"dist": "lognormal", "median": 8, "sigma": 0.5, "cap": 16},
    "prompt_tokens": {"dist": "lognormal", "median": 4096, "sigma": 0.5, "cap": 14336},
    "reply_tokens": {"dist": "lognormal", "median": 512, "sigma": 0.8, "cap": 2048},
    "command_s": {"dist": "lognormal", "median": 1, "sigma": 1, "cap": 10},
    "timeout_s": 300,
}


def timed(path: Path) -> tuple[float, dict]:
    scenario = load_scenario(path)
    if scenario.job.turns is not None:
        data = scenario_dict(scenario)
        data["job"]["turns"] = TURNS
        scenario = validate(data, str(path))
    t0 = time.perf_counter()
    trace = simulate(scenario)
    return time.perf_counter() - t0, summarize(trace)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = {}
    for name, path in CONFIGS.items():
        seconds, summary = timed(path)
        out[f"{name}_s"] = seconds
        out[f"{name}_jobs"] = summary["jobs_completed"]
    out["ratio"] = out["turns_s"] / out["episodes_s"]
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"job durations: {out['episodes_s']:.2f} s ({out['episodes_jobs']} jobs); "
            f"turn model: {out['turns_s']:.2f} s ({out['turns_jobs']} jobs); "
            f"ratio {out['ratio']:.1f}x (target <= 10x)"
        )


if __name__ == "__main__":
    main()
