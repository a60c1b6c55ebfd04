"""The tracker: the sinks a run's ``logging.to`` names, fed one dict of scalars at a time."""

from __future__ import annotations

import importlib
import logging
import math
import threading
import time
from pathlib import Path

from runner.errors import UserError
from runner.tracking.scalars import UpdateScalars, eval_scalars

log = logging.getLogger(__name__)

# sink -> (its module, the package it needs beyond the runner's own, or None)
SINKS = {
    "console": ("runner.tracking.console_sink", None),
    "jsonl": ("runner.tracking.jsonl_sink", None),
    "tensorboard": ("runner.tracking.tensorboard_sink", "tensorboard"),
    "wandb": ("runner.tracking.wandb_sink", "wandb"),
    "mlflow": ("runner.tracking.mlflow_sink", "mlflow"),
}


def check_sinks(names) -> None:
    """Refuse, in one line, a sink whose package is not installed: before the run starts,
    never in the middle of it."""
    for name in names:
        package = SINKS[name][1]
        if package is None:
            continue
        try:
            importlib.import_module(package)
        except ImportError:
            raise UserError(
                f"logging.to: {name} needs the '{package}' package, which is not installed "
                f"(pip install 'async-es-toolkit[{name}]', or leave {name} out of logging.to)"
            ) from None


class Tracker:
    """Sends scalars to every sink; safe to call from the evaluator's thread too.

    A sink that fails is reported in the log and the run goes on: watching a run never
    stops it. ``seconds`` is the time spent here (the cost of logging)."""

    def __init__(self, sinks: list, main_split: str = "test") -> None:
        self.sinks = sinks
        self.main_split = main_split
        self.seconds = 0.0
        self._scalars = UpdateScalars()
        self._lock = threading.Lock()

    @classmethod
    def open(cls, run_dir: Path, config) -> Tracker | None:
        """The run's tracker, or None when ``logging.to`` is empty."""
        names = config.logging.to
        if not names:
            return None
        check_sinks(names)
        sinks = []
        for name in names:
            module = importlib.import_module(SINKS[name][0])
            sinks.append(module.Sink(Path(run_dir), config))
        return cls(sinks, config.eval.split)

    def committed(self, state, version: int, members: list[int]) -> dict[str, float]:
        """Log update ``version`` (its cohort: ``members``); versions come in order."""
        t0 = time.perf_counter()
        scalars = self._scalars(state, version, members)
        self.log(version, scalars)
        self.seconds += time.perf_counter() - t0
        return scalars

    def evaluated(self, rows) -> None:
        """Log one evaluation (the rows of one version and split)."""
        if len(rows):
            self.log(int(rows["version"].iloc[0]), eval_scalars(rows, self.main_split))

    def log(self, step: int, scalars: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in scalars.items() if v is not None and math.isfinite(v)}
        wall = time.time()
        with self._lock:
            for sink in self.sinks:
                try:
                    sink.write(step, clean, wall)
                except Exception as exc:  # noqa: BLE001 - a tracker never stops the run
                    log.error("logging to %s failed at step %d: %s", sink.name, step, exc)

    def close(self) -> None:
        with self._lock:
            for sink in self.sinks:
                try:
                    sink.close()
                except Exception as exc:  # noqa: BLE001
                    log.error("closing %s failed: %s", sink.name, exc)
