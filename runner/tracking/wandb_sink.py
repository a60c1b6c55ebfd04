"""``wandb``: Weights & Biases in offline mode, under ``RUN_DIR/wandb/`` (upload later with
``wandb sync``). Updates and evaluations share the ``version`` axis; an evaluation may
arrive after a later update, so nothing is logged with W&B's own (monotonic) step."""

from __future__ import annotations

import wandb

from runner.tracking.state_file import tracker_id


class Sink:
    name = "wandb"

    def __init__(self, run_dir, config) -> None:
        self._run = wandb.init(
            project=config.logging.project or config.name,
            name=config.name,
            id=tracker_id(run_dir, "wandb"),  # a resumed run continues the same W&B run
            resume="allow",
            dir=str(run_dir),
            mode="offline",
            config=config.model_dump(mode="json"),
        )
        self._run.define_metric("version")
        self._run.define_metric("*", step_metric="version")

    def write(self, step: int, scalars: dict[str, float], wall: float) -> None:
        self._run.log({"version": step, **scalars})

    def close(self) -> None:
        self._run.finish()
