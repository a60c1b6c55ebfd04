"""A copied run, as in examples/ (config.yaml and a checkpoint holding the update log, no
journal), and the greedy replies of the run's own ``hf`` backend at a version: what the
export tests compare an exported folder against."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml

from runner.backends import GenerationRequest
from runner.config import RunConfig, load_run_config, resolve_paths
from runner.es import UpdateRecord, write_checkpoint
from runner.run_dir import RunDir
from runner.workers import build_backend

REPO = Path(__file__).resolve().parents[2]
PROMPTS = [
    [{"role": "system", "content": "You are a shell agent."}, {"role": "user", "content": p}]
    for p in ("List the files in /home/user.", "Count the lines of notes.txt.")
]
# Two updates with large coefficients, so the version's replies differ from the base's.
LOG = [
    UpdateRecord(1, ((11, 0.05), (12, -0.05)), 0.01, 0.005, noise="blockseed-v1"),
    UpdateRecord(2, ((13, 0.04),), 0.01, 0.005, noise="blockseed-v1"),
]


def copied_run(root: Path, model: Path, log: Sequence[UpdateRecord]) -> tuple[Path, RunConfig]:
    """``root/run``: the cpu_tiny config on ``model``, greedy, whose checkpoint holds ``log``."""
    data = yaml.safe_load((REPO / "configs/runner/cpu_tiny.yaml").read_text())
    data["model"]["path"] = str(model)
    data["sampling"].update(temperature=0.0, max_new_tokens=24)
    (root / "run.yaml").write_text(yaml.safe_dump(data))
    config = resolve_paths(load_run_config(root / "run.yaml"))
    run = RunDir.create(root / "run", config)
    run.unlock()
    (root / "run" / "journal.jsonl").unlink()  # as in examples/: the checkpoint holds the log
    backend = build_backend(config)
    try:
        write_checkpoint(
            root / "run" / "checkpoint", base_hash=backend.base_hash,
            config=backend.es_config(), log=list(log), base_path=config.model.path,
        )  # fmt: skip
    finally:
        backend.close()
    return root / "run", config


def with_model(config: RunConfig, **model) -> RunConfig:
    """``config`` with ``model.*`` fields replaced (e.g. the path of an exported folder)."""
    return config.model_copy(update={"model": config.model.model_copy(update=model)})


def greedy_replies(config: RunConfig, log: Sequence[UpdateRecord] = ()) -> tuple[str, list[str]]:
    """(weights hash, replies to PROMPTS) of the config's backend after replaying ``log``."""
    backend = build_backend(config)
    try:
        backend.sync(list(log))
        out = backend.generate([GenerationRequest(m, seed=0) for m in PROMPTS])
        return backend.weights_hash(), [g.text for g in out]
    finally:
        backend.close()
