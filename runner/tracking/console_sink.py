"""``console``: one short line per update and per evaluation on stderr."""

from __future__ import annotations

import sys

from tqdm import tqdm

SHOWN = (
    "train/reward_mean",
    "staleness/mean_lag",
    "staleness/stale_share",
    "workers/idle_fraction",
    "throughput/episodes_per_min",
)


class Sink:
    name = "console"

    def __init__(self, run_dir, config) -> None:
        pass

    def write(self, step: int, scalars: dict[str, float], wall: float) -> None:
        shown = [k for k in SHOWN if k in scalars]
        shown += [k for k in scalars if k.startswith("eval") and k.endswith("/success")]
        text = ", ".join(f"{k} {scalars[k]:.4g}" for k in shown)
        tqdm.write(f"version {step}: {text}", file=sys.stderr)  # (above a progress bar)

    def close(self) -> None:
        pass
