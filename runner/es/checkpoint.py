"""Checkpoints: a reference to the base weights plus the update log, as JSON (kilobytes).

``<dir>/es_checkpoint.json`` holds the format tag, the base-weights sha256 (and an
optional path where they live), the optimizer's hyper-parameters and noise definition, and
every update record. Optional full snapshots of the master (``master-v<version>.pt``) only
make loading faster: loading version v starts from the newest snapshot at or below v and
replays the rest of the log, which gives the same master bit for bit on the same device
type.

The noise scheme is ``config.noise.scheme``; a checkpoint that records none was made with
``blockseed-v1`` (:data:`~runner.es.noise.LEGACY_SCHEME`) and is replayed with it.
blockseed-v1 logs load only on the device type that wrote them; philox-v2 logs load on any
device (bit-exact on the same device type, elsewhere within the ulps of log/cos/sin, see
:mod:`runner.es.noise`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from runner.es.noise import DEFAULT_BLOCK, LEGACY_SCHEME, NOISE_SCHEMES, PHILOX_SCHEME
from runner.es.optimizer import ESOptimizer
from runner.es.records import UpdateRecord

FORMAT = "runner.es/checkpoint-v1"
CHECKPOINT_FILE = "es_checkpoint.json"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # a reader never sees a half-written checkpoint


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


def write_checkpoint(
    directory: str | os.PathLike[str],
    *,
    base_hash: str,
    config: dict[str, Any],
    log: list[UpdateRecord],
    base_path: str | None = None,
    snapshots: list[dict[str, Any]] = (),
) -> Path:
    """Write the checkpoint JSON from its parts, atomically; returns its path.

    For a coordinator that holds the update log but no model (``config`` as
    :meth:`ESOptimizer.config` gives it, noise definition included).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CHECKPOINT_FILE
    doc = {
        "format": FORMAT,
        "base": {"sha256": base_hash, "path": base_path},
        "config": config,
        "version": len(log),
        "log": [r.to_dict() for r in log],
        "snapshots": sorted(snapshots, key=lambda s: s["version"]),
    }
    _atomic_write(path, json.dumps(doc, indent=1))
    return path


def read_checkpoint(directory: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(directory)
    if path.is_dir():
        path = path / CHECKPOINT_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"no ES checkpoint at {path}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"ES checkpoint {path} is not valid JSON: {exc}") from None
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path} has format {doc.get('format')!r}, expected {FORMAT!r}")
    return doc


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
    if scheme not in NOISE_SCHEMES:
        raise ValueError(
            f"checkpoint noise scheme {scheme!r} is unknown (known: {', '.join(NOISE_SCHEMES)})"
        )
    asked = kwargs.pop("noise", scheme)
    if asked != scheme:
        raise ValueError(
            f"noise={asked!r} differs from the checkpoint's noise scheme {scheme!r}; the log "
            f"replays only with {scheme!r}"
        )
    recorded_block = noise.get("block", DEFAULT_BLOCK)
    block = kwargs.pop("noise_block", recorded_block)
    if block != recorded_block and scheme != PHILOX_SCHEME:
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
    if scheme != PHILOX_SCHEME and opt.device_type != noise.get("device_type", opt.device_type):
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
