"""Checkpoints of an optimizer (torch): save one, and load one back onto a model.

The document, ``<dir>/es_checkpoint.json`` (a reference to the base weights plus the update
log, kilobytes), is written and read without torch by :mod:`runner.es.checkpoint_file`.
Optional full snapshots of the master (``master-v<version>.pt``) only make loading faster:
loading version v starts from the newest snapshot at or below v and replays the rest of
the log, which gives the same master bit for bit on the same device type.

The noise scheme is ``config.noise.scheme``; a checkpoint that records none was made with
``blockseed-v1`` (:data:`~runner.es.noise.LEGACY_SCHEME`) and is replayed with it.
blockseed-v1 logs load only on the device type that wrote them; philox-v2 and
lowrank-v1-r<R> logs load on any device (bit-exact on the same device type, elsewhere
within the ulps of log/cos/sin, see :mod:`runner.es.noise`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from runner.es.checkpoint_file import CHECKPOINT_FILE, read_checkpoint, write_checkpoint
from runner.es.noise import DEFAULT_BLOCK, LEGACY_SCHEME, NOISE_SCHEMES
from runner.es.optimizer import ESOptimizer
from runner.es.records import UpdateRecord
from runner.es.schemes import LOWRANK_SCHEME, check_scheme

__all__ = ["load_checkpoint", "read_checkpoint", "save_checkpoint", "write_checkpoint"]


def save_checkpoint(
    opt: ESOptimizer,
    directory: str | os.PathLike[str],
    *,
    snapshot: bool = False,
    base_path: str | None = None,
) -> Path:
    """Write the checkpoint JSON (and a master snapshot if asked); returns the JSON's path."""
    if opt.base_hash is None:
        raise ValueError(
            "the optimizer was built with hash_base=False; its base weights have no reference"
        )
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CHECKPOINT_FILE
    snapshots: list[dict[str, Any]] = []
    if path.exists():
        old = json.loads(path.read_text())
        if old.get("base", {}).get("sha256") == opt.base_hash:
            # Keep only snapshots on this log's history: same base and the same records up
            # to the snapshot's version (a run resumed from an earlier version diverges).
            mine = [r.to_dict() for r in opt.log]
            snapshots = [
                s
                for s in old.get("snapshots", [])
                if s["version"] <= opt.version
                and old["log"][: s["version"]] == mine[: s["version"]]
            ]
    if snapshot:
        name = f"master-v{opt.version:06d}.pt"
        torch.save(
            {n: t.detach().cpu().clone() for n, t in opt.master_parameters()}, directory / name
        )
        snapshots = [s for s in snapshots if s["version"] != opt.version]
        snapshots.append({"version": opt.version, "file": name})
    return write_checkpoint(
        directory,
        base_hash=opt.base_hash,
        config=opt.config(),
        log=opt.log,
        base_path=base_path,
        snapshots=snapshots,
    )


def load_checkpoint(
    model: torch.nn.Module,
    directory: str | os.PathLike[str],
    *,
    version: int | None = None,
    **kwargs: Any,
) -> ESOptimizer:
    """Rebuild the optimizer at ``version`` (default: the last) on ``model``'s base weights.

    ``model`` must hold the base weights; their sha256 must match the checkpoint's or a
    ValueError names both. ``kwargs`` go to ESOptimizer (chunk_size, threads, ...). The
    noise scheme is the checkpoint's (blockseed-v1 if it records none); a ``noise`` or
    ``noise_block`` argument that would change the noise is a ValueError naming both.
    """
    directory = Path(directory)
    doc = read_checkpoint(directory)
    cfg = doc["config"]
    noise = cfg.get("noise") or {}  # every writer so far recorded it; be lenient anyway
    scheme = noise.get("scheme", LEGACY_SCHEME)
    try:
        check_scheme(scheme)
    except ValueError:
        raise ValueError(
            f"checkpoint noise scheme {scheme!r} is unknown (known: {', '.join(NOISE_SCHEMES)}, "
            f"{LOWRANK_SCHEME})"
        ) from None
    asked = kwargs.pop("noise", scheme)
    if asked != scheme:
        raise ValueError(
            f"noise={asked!r} differs from the checkpoint's noise scheme {scheme!r}; the log "
            f"replays only with {scheme!r}"
        )
    recorded_block = noise.get("block", DEFAULT_BLOCK)
    block = kwargs.pop("noise_block", recorded_block)
    if block != recorded_block and scheme == LEGACY_SCHEME:
        raise ValueError(
            f"noise_block={block} differs from the checkpoint's {recorded_block}; the noise would differ"
        )
    opt = ESOptimizer(
        model,
        sigma=cfg["sigma"],
        alpha=cfg["alpha"],
        shaping=cfg["shaping"],
        antithetic=cfg["antithetic"],
        staleness=cfg["staleness"],
        noise_block=block,
        noise=scheme,
        **({"params": cfg["params"]} if cfg.get("params") is not None else {}),
        **kwargs,
    )
    if opt.base_hash != doc["base"]["sha256"]:
        raise ValueError(
            f"base-weights hash mismatch: the model's weights hash to {opt.base_hash}, "
            f"the checkpoint was made from {doc['base']['sha256']}"
            + (f" ({doc['base']['path']})" if doc["base"].get("path") else "")
        )
    if scheme == LEGACY_SCHEME and opt.device_type != noise.get("device_type", opt.device_type):
        raise ValueError(
            f"checkpoint noise was generated on device type {noise['device_type']!r}, the model is "
            f"on {opt.device_type!r}; the noise streams differ between device types"
        )
    log = [UpdateRecord.from_dict(d) for d in doc["log"]]
    target = doc["version"] if version is None else version
    if not 0 <= target <= len(log):
        raise ValueError(f"version {target} is not in the checkpoint (0..{len(log)})")
    usable = [s for s in doc.get("snapshots", []) if s["version"] <= target]
    if usable:
        snap = max(usable, key=lambda s: s["version"])
        tensors = torch.load(directory / snap["file"], map_location="cpu", weights_only=True)
        opt.load_master(tensors, log, snap["version"])  # copy_ moves them to the device
    opt.replay(log, upto=target)
    return opt
