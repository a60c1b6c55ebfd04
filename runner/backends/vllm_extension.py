"""ES inside a vLLM engine: a worker extension whose named methods run next to the weights.

vLLM mixes ``worker_extension_cls`` into its worker class, and
``AsyncLLM.collective_rpc("es_perturb", args=(seed, 1))`` calls the method of that name in
the worker process, between two scheduler steps.

**The weight path.** The ES core never writes into the engine's parameter tensors: after
loading, vLLM is free to turn them into something else (on CPU every linear layer's weight
is prepacked for oneDNN / its own GEMM kernels and the parameter replaced by an empty
tensor; quantized, fused or compiled kernels do the like on GPUs). Instead the extension
holds the policy in Hugging Face form, loaded from the checkpoint as the ``hf`` backend
loads it (same names, order, dtype, hence the same weights hash), and runs the ES core's
own :class:`~runner.es.ESOptimizer` on it: fp32 master, perturb
``cast(master + sign * sigma * eps)``, bit-exact restore by re-casting from the master,
fp32 updates, replay. After every change those HF-named tensors are handed to vLLM's own
in-place reload (``Worker.reload_weights(weights_iterator, is_checkpoint_format=True)``,
``vllm/model_executor/model_loader/reload/``): vLLM's weight loaders fuse, pad and tie them
exactly as at start-up and re-run each layer's post-load processing (the CPU prepacking
included), then copy the result into the kernel tensors' original storage (which keeps
CUDA graphs valid). One path on CPU and GPU, whatever the engine does after loading.

Cost: one pass over the weights per change (perturb, restore, update), on top of the ES
arithmetic (the ES core's own kernels: with ``es.noise: philox-v2`` on CUDA the fused Triton
kernel where Triton imports, ``es.noise_kernel``; docs/es.md, "Noise kernels"), plus one copy of the model in the engine's dtype (the HF form) next to the
fp32 master (docs/vllm.md, "The weight path").

Method and attribute names start with ``es_`` / ``_es_`` so they cannot collide with the
worker's own (vLLM refuses an extension that shadows a worker attribute).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass, field
from typing import Any

import torch

from runner.es import ESOptimizer, UpdateRecord


@dataclass
class ESState:
    """One engine's ES: the HF-form policy, its optimizer, and the push statistics."""

    module: torch.nn.Module  # the policy as the hf backend holds it (HF names, engine dtype)
    opt: ESOptimizer
    tied: list[torch.nn.Module]  # engine layers that share a weight with another layer
    active: AbstractContextManager | None = None
    info: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=lambda: {"pushes": 0, "push_s": 0.0})


def load_hf_policy(path: str, dtype: str, device: torch.device) -> torch.nn.Module:
    """The checkpoint at ``path`` as the ``hf`` backend loads it, on ``device``."""
    from runner.backends.hf import load_model

    model, _ = load_model(path, dtype, str(device))
    model.requires_grad_(False)
    return model


def tied_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Layers with a ``quant_method`` whose weight another such layer shares (a tied head).

    vLLM's in-place reload re-processes only the layer the checkpoint names (the
    embedding), not the head that shares its weight (its documented limitation 2); on CPU
    the head keeps a prepacked copy of the old weight. These layers are re-processed after
    every push.
    """
    groups: dict[int, list[torch.nn.Module]] = {}
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if getattr(module, "quant_method", None) is not None and isinstance(weight, torch.Tensor):
            groups.setdefault(id(weight), []).append(module)
    return [m for group in groups.values() if len(group) > 1 for m in group]


DRIVER_ENV = "ES_VLLM_DRIVER"  # "pid:start time" of the process that builds engines


def watch_driver(driver_pid: int, driver_started: float, period_s: float = 1.0) -> bool:
    """End this engine when the process that built it is gone (it was killed, say).

    A driver killed with SIGKILL cannot shut its engine down, and vLLM's processes outlive
    it (reparented to init). A daemon thread here checks the driver every ``period_s``;
    once it is gone it kills this process's ancestors up to the driver (the engine core)
    and then this process. Returns False (no watch) when the driver is not an ancestor.
    """
    import psutil

    chain = []
    for proc in psutil.Process().parents():
        if proc.pid == driver_pid:
            break
        chain.append(proc.pid)
    else:
        return False

    def alive() -> bool:
        try:
            return abs(psutil.Process(driver_pid).create_time() - driver_started) < 1.0
        except psutil.NoSuchProcess:
            return False

    def watch() -> None:
        while alive():
            time.sleep(period_s)
        for pid in chain:
            with suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watch, name="es-driver-watch", daemon=True).start()
    return True


def _watch_from_env() -> bool:
    """In an engine's worker process (it imports this module when vLLM injects the
    extension, before the model loads): watch the driver named by :data:`DRIVER_ENV`."""
    value = os.environ.get(DRIVER_ENV, "")
    pid, _, started = value.partition(":")
    if not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        return watch_driver(int(pid), float(started))
    except Exception:  # noqa: BLE001 - no watch rather than no engine
        return False


WATCHING = _watch_from_env()


def _sync(device_type: str) -> None:
    if device_type == "cuda":
        torch.cuda.synchronize()


class ESWorkerExtension:
    """Mixed into vLLM's worker (``worker_extension_cls``); every method is an RPC target."""

    # -- helpers (not RPC targets) ------------------------------------------------------
    def _es_model(self) -> torch.nn.Module:
        runner = self.model_runner  # set by vLLM's worker
        get = getattr(runner, "get_model", None)
        return get() if callable(get) else runner.model

    def _es(self) -> ESState:
        state = getattr(self, "_es_state", None)
        if state is None:
            raise RuntimeError("es_setup has not run in this worker")
        return state

    def _es_push(self) -> None:
        """Hand the HF-form weights to vLLM's in-place reload (fuse, pad, post-process)."""
        state = self._es()
        t0 = time.perf_counter()
        with torch.no_grad():
            self.reload_weights(
                weights_iterator=state.module.named_parameters(), is_checkpoint_format=True
            )
            for layer in state.tied:
                layer.quant_method.process_weights_after_loading(layer)
        _sync(state.opt.device_type)
        state.stats["pushes"] += 1
        state.stats["push_s"] += time.perf_counter() - t0

    # -- RPC targets --------------------------------------------------------------------
    def es_setup(self, path: str, dtype: str, es: Mapping[str, Any] | None = None) -> dict:
        """Load the HF-form policy, build the ES optimizer on it; returns info."""
        self.es_close()
        model = self._es_model()
        device = next(model.parameters()).device
        module = load_hf_policy(path, dtype, device)
        opt = ESOptimizer(module, **dict(es or {}))
        tied = tied_layers(model)
        info = {
            "base_hash": opt.base_hash,
            "es_config": opt.config(),
            "noise_kernel": opt.kernel,  # what draws the noise here (auto resolves per device)
            "num_parameters": opt.num_parameters,
            "hf_parameters": sum(1 for _ in module.named_parameters()),
            "tied_layers": len(tied),
            "driver_watched": WATCHING,
            "device": str(device),
        }
        self._es_state = ESState(module, opt, tied, info=info)
        return dict(info)

    def es_perturb(self, seed: int, sign: int = 1) -> int:
        """Engine weights <- cast(master + sign * sigma * eps(seed)), HF noise per HF name."""
        state = self._es()
        if state.active is not None:
            raise RuntimeError("already perturbed; restore first (perturbations do not nest)")
        ctx = state.opt.perturbed(int(seed), int(sign))
        ctx.__enter__()
        state.active = ctx
        self._es_push()
        return state.opt.version

    def es_restore(self) -> int:
        """Engine weights <- cast(master): bit-exact (a no-op when not perturbed)."""
        state = self._es()
        ctx, state.active = state.active, None
        if ctx is not None:
            ctx.__exit__(None, None, None)
            self._es_push()
        return state.opt.version

    def es_replay(self, log: Sequence[Mapping[str, Any]], upto: int | None = None) -> int:
        """Catch up from an update log (records as dicts); returns the new version."""
        state = self._es()
        if state.active is not None:
            raise RuntimeError("cannot replay updates while perturbed")
        before = state.opt.version
        version = state.opt.replay([UpdateRecord.from_dict(dict(r)) for r in log], upto=upto)
        if version != before:
            self._es_push()
        return version

    def es_weights_hash(self) -> str:
        """sha256 over the HF-named weights last handed to the engine (the hf backend's hash)."""
        return self._es().opt.weights_hash()

    def es_stats(self) -> dict[str, float]:
        return dict(self._es().stats)

    def es_close(self) -> bool:
        state = getattr(self, "_es_state", None)
        if state is not None:
            if state.active is not None:
                self.es_restore()
            state.opt.close()
            self._es_state = None
        return True
