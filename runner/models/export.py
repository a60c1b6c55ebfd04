"""A run's version as an ordinary Hugging Face model folder: the base weights plus the
update log, replayed and written with ``save_pretrained``.

The folder loads with ``from_pretrained`` (transformers), ``es-runner eval --model`` and
vLLM like any checkpoint; ``export.json`` beside the weights says where they came from (the
run, the version, the base weights' hash and the exported weights' hash, which equals the
hash a run's backend reports at that version). The folder appears whole or not at all: it
is written under a temporary name next to ``out`` and renamed.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.config import RunConfig, run_paths, validate_run
from runner.errors import UserError
from runner.es import UpdateRecord, read_checkpoint
from staleness_sim.core.settings import ConfigError, read_yaml

EXPORT_FILE = "export.json"
# Files of the base folder that describe the model rather than its weights: kept.
KEEP = ("pretrain.json",)


@dataclass
class RunLog:
    """What a run directory says about its weights: config, update log, base-weights hash."""

    config: RunConfig
    log: list[UpdateRecord]
    base_hash: str | None  # the checkpoint's record of the base weights (None: no checkpoint)
    device_type: str | None  # blockseed-v1 noise replays only on the device type recorded


def read_run_log(run_dir: Path) -> RunLog:
    """The run's config and committed log: the journal's commits when the run has a journal
    (its source of truth), else the checkpoint's log (a copied run, as in examples/)."""
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory")
    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"{run_dir}: not a run directory (no config.yaml)")
    try:
        config = validate_run(read_yaml(run_dir / "config.yaml"), str(run_dir / "config.yaml"))
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    config = run_paths(config, run_dir)
    doc = None
    if (run_dir / "checkpoint").is_dir():
        try:
            doc = read_checkpoint(run_dir / "checkpoint")
        except ValueError as exc:
            raise UserError(str(exc)) from None
    if (run_dir / "journal.jsonl").is_file():
        from runner.orchestrator import replay_log
        from runner.run_dir import RunDir

        log = replay_log(RunDir(run_dir))
    elif doc is not None:
        log = [UpdateRecord.from_dict(d) for d in doc["log"]]
    else:
        raise UserError(
            f"{run_dir}: neither a journal.jsonl nor a checkpoint/ to read the log from"
        )
    noise = (doc or {}).get("config", {}).get("noise") or {}
    return RunLog(
        config,
        log,
        None if doc is None else doc["base"]["sha256"],
        noise.get("device_type") if noise.get("scheme", "blockseed-v1") == "blockseed-v1" else None,
    )


def check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} exists and is not empty")


def export_version(
    run_dir: str | os.PathLike[str],
    out: str | os.PathLike[str],
    version: int | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """Write version ``version`` (default: the last) of the run at ``run_dir`` into ``out``
    (new or empty) as a ``from_pretrained`` folder; returns what ``export.json`` holds."""
    run_dir, out = Path(run_dir), Path(out)
    check_out(out)
    run = read_run_log(run_dir)
    version = len(run.log) if version is None else version
    if not 0 <= version <= len(run.log):
        raise UserError(f"--version {version}: the run has versions 0..{len(run.log)}")
    if run.device_type is not None and run.device_type != device.partition(":")[0]:
        raise UserError(
            f"the run's blockseed-v1 noise was drawn on {run.device_type}; its log replays only "
            f"there: pass --device {run.device_type}"
        )
    from runner.backends.hf import ModelLoadError, load_model
    from runner.es import ESOptimizer

    m = run.config.model
    if not (Path(m.path) / "config.json").is_file():
        raise UserError(
            f"the run's base model {m.path} is not there (no config.json): a version is its "
            f"base weights plus the log; put them back there (the examples' warm start: "
            f"'es-runner model pretrain')"
        )
    try:
        model, tokenizer = load_model(m.path, m.dtype, device)
    except ModelLoadError as exc:
        raise UserError(str(exc)) from None
    try:
        # any kernel replays the log: the one the run used may not run here (triton: CUDA)
        opt = ESOptimizer(model, **{**run.config.es.optimizer_kwargs(), "kernel": "auto"})
    except ValueError as exc:  # es.params that match nothing in this model
        raise UserError(str(exc)) from None
    try:
        if run.base_hash is not None and opt.base_hash != run.base_hash:
            raise UserError(
                f"the base weights at {m.path} hash to {opt.base_hash}, the run was made from "
                f"{run.base_hash}"
            )
        try:
            opt.replay(run.log, upto=version)
        except ValueError as exc:  # a record of another noise scheme
            raise UserError(f"cannot replay the run's log: {exc}") from None
        summary = {
            "run": str(run_dir.resolve()),
            "version": version,
            "versions": len(run.log),
            "base": m.path,
            "base_sha256": opt.base_hash,
            # the hash a run's backend reports at this version (runner.es weights_hash over
            # the parameters ES owns: all of them unless es.params)
            "weights_sha256": opt.weights_hash(),
            "es": run.config.es.model_dump(mode="json"),
            "dtype": m.dtype,
        }
        _write_folder(out, model, tokenizer, Path(m.path), summary)
    finally:
        opt.close()
    return summary


def _write_folder(out: Path, model, tokenizer, base: Path, summary: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for name in KEEP:
            if (base / name).is_file():
                shutil.copy2(base / name, tmp / name)
        (tmp / EXPORT_FILE).write_text(json.dumps(summary, indent=2) + "\n")
        if out.exists():
            out.rmdir()  # empty (checked): the rename needs the name free
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
