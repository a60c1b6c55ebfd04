"""ES inside a vLLM engine: a worker extension whose named methods run next to the weights.

vLLM mixes ``worker_extension_cls`` into its GPU worker class, and
``AsyncLLM.collective_rpc("es_perturb", args=(seed, 1))`` calls the method of that name in
the worker process, between two scheduler steps. The methods here operate on the worker's
model (``self.model_runner.get_model()`` or ``.model``) in place:

* ``es_setup`` builds the name map (:mod:`runner.backends.vllm_names`) between the HF
  parameters and the engine's fused / padded tensors, a module of HF-named *views* of
  those rows, and the ES core's own :class:`~runner.es.ESOptimizer` on it: an fp32 master
  per HF parameter (rows of the fused tensors; padding rows have none and are never
  written), perturb ``cast(master + sign * sigma * eps)``, restore by re-casting from the
  master (bit-exact, never a subtraction), fp32 updates, replay of an update log, and a
  weights hash over the HF names in HF order (so it equals the ``hf`` backend's hash of
  the same weights in the same dtype, and checkpoints name the same base weights).
* ``es_checksum`` is a fast on-device checksum of every engine tensor (padding rows
  included); ``es_self_test`` checks that a perturbation changes it and a restore returns
  it exactly.

Nothing here imports vLLM, so the arithmetic is tested on CPU with a stand-in object whose
``model_runner.model`` is a hand-fused module (``tests/runner/test_vllm_extension.py``).
Method and attribute names start with ``es_`` / ``_es_`` so they cannot collide with the
worker's own (vLLM refuses an extension that shadows a worker attribute).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch

from runner.backends.vllm_names import (
    PACKED_DEFAULT,
    Piece,
    build_name_map,
    engine_tensors,
    padding_rows,
    view_module,
)
from runner.es import ESOptimizer, UpdateRecord

_CHUNK = 1 << 24  # elements per checksum step


def weights_checksum(tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """A fast checksum of tensors' bytes, computed on their device (exact integer sums).

    Per tensor and chunk of 2**24 words: the sum of the words and their position-weighted
    sum, in int64 (wrapping), fed with the name, dtype and shape into a sha256. Any change
    of a single element changes the plain sum; moved elements change the weighted one.
    Integer sums do not depend on the order of addition, so CPU and GPU agree.
    """
    h = hashlib.sha256()
    weights: dict[torch.device, torch.Tensor] = {}
    for name, t in tensors:
        flat = t.detach().reshape(-1)
        if type(flat) is not torch.Tensor:
            flat = flat.as_subclass(torch.Tensor)
        raw = flat.view(torch.uint8) if flat.numel() else flat.new_empty(0, dtype=torch.uint8)
        width = 4 if raw.numel() % 4 == 0 else 2 if raw.numel() % 2 == 0 else 1
        words = raw.view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[width])
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        w = weights.get(words.device)
        if w is None:
            w = weights[words.device] = torch.arange(
                1, _CHUNK + 1, dtype=torch.int64, device=words.device
            )
        sums = []
        for s in range(0, words.numel(), _CHUNK):
            c = words[s : s + _CHUNK].to(torch.int64)
            sums.append(torch.stack([c.sum(), (c * w[: c.numel()]).sum()]))
        if sums:
            h.update(torch.stack(sums).cpu().numpy().tobytes())
    return h.hexdigest()


@dataclass
class ESState:
    """What one engine's ES needs: the map, the HF-named views, the optimizer."""

    pieces: list[Piece]
    tensors: dict[str, torch.Tensor]  # the engine's tensors by vLLM name (dedup'd)
    aliases: list[str]
    module: torch.nn.Module
    opt: ESOptimizer
    active: AbstractContextManager | None = None
    info: dict[str, Any] = field(default_factory=dict)


def es_state(
    model: torch.nn.Module,
    hf_shapes: Sequence[tuple[str, Sequence[int]]],
    es: Mapping[str, Any] | None = None,
    packed: Mapping[str, Sequence[str]] | None = None,
) -> ESState:
    """Name map + views + ESOptimizer over ``model`` (an engine's model, fused tensors)."""
    if packed is None:
        packed = getattr(type(model), "packed_modules_mapping", None) or PACKED_DEFAULT
    tensors, aliases = engine_tensors(model)
    if any(t.is_inference() for t in tensors.values()):
        raise RuntimeError(
            "the engine's weights are inference tensors (created under torch.inference_mode); "
            "the ES core cannot write them in place from its worker threads"
        )
    shapes = {n: tuple(t.shape) for n, t in tensors.items()}
    pieces = build_name_map(hf_shapes, shapes, packed)
    module = view_module(tensors, pieces)
    opt = ESOptimizer(module, **dict(es or {}))
    info = {
        "base_hash": opt.base_hash,
        "es_config": opt.config(),
        "num_parameters": opt.num_parameters,
        "hf_parameters": len(pieces),
        "engine_tensors": len(tensors),
        "tied_aliases": list(aliases),
        "padding_rows": padding_rows(pieces, shapes),
        "fused_tensors": sorted({p.vllm_name for p in pieces if p.vllm_name != p.hf_name}),
    }
    return ESState(pieces, tensors, aliases, module, opt, info=info)


def _sync(device_type: str) -> None:
    if device_type == "cuda":
        torch.cuda.synchronize()


class ESWorkerExtension:
    """Mixed into vLLM's worker (``worker_extension_cls``); every method is an RPC target."""

    # -- helpers (not RPC targets) ------------------------------------------------------
    def _es_model(self) -> torch.nn.Module:
        runner = self.model_runner  # set by vLLM's worker; by the stand-in in tests
        get = getattr(runner, "get_model", None)
        return get() if callable(get) else runner.model

    def _es(self) -> ESState:
        state = getattr(self, "_es_state", None)
        if state is None:
            raise RuntimeError("es_setup has not run in this worker")
        return state

    def _es_done(self) -> None:
        _sync(self._es().opt.device_type)

    # -- RPC targets --------------------------------------------------------------------
    def es_setup(
        self,
        hf_shapes: Sequence[Sequence[Any]],
        es: Mapping[str, Any] | None = None,
        packed: Mapping[str, Sequence[str]] | None = None,
    ) -> dict[str, Any]:
        """Build the name map and the ES optimizer over this worker's model; returns info.

        ``hf_shapes``: ``[[name, [dims...]], ...]`` of the HF model, in its
        ``named_parameters()`` order (lists, as an RPC carries them).
        """
        old = getattr(self, "_es_state", None)
        if old is not None:
            old.opt.close()
        shapes = [(str(n), tuple(int(x) for x in s)) for n, s in hf_shapes]
        state = es_state(self._es_model(), shapes, es, packed)
        self._es_state = state
        self._es_done()
        return dict(state.info)

    def es_perturb(self, seed: int, sign: int = 1) -> int:
        """Weights <- cast(master + sign * sigma * eps(seed)), HF noise on each fused row range."""
        state = self._es()
        if state.active is not None:
            raise RuntimeError("already perturbed; restore first (perturbations do not nest)")
        ctx = state.opt.perturbed(int(seed), int(sign))
        ctx.__enter__()
        state.active = ctx
        self._es_done()
        return state.opt.version

    def es_restore(self) -> int:
        """Weights <- cast(master): bit-exact (a no-op when not perturbed)."""
        state = self._es()
        ctx, state.active = state.active, None
        if ctx is not None:
            ctx.__exit__(None, None, None)
        self._es_done()
        return state.opt.version

    def es_apply(self, record: Mapping[str, Any]) -> int:
        """Apply the next update record (``UpdateRecord.to_dict()``); returns the version."""
        state = self._es()
        state.opt.apply(UpdateRecord.from_dict(dict(record)))
        self._es_done()
        return state.opt.version

    def es_replay(self, log: Sequence[Mapping[str, Any]], upto: int | None = None) -> int:
        """Catch up from an update log (records as dicts); returns the new version."""
        state = self._es()
        if state.active is not None:
            raise RuntimeError("cannot replay updates while perturbed")
        version = state.opt.replay([UpdateRecord.from_dict(dict(r)) for r in log], upto=upto)
        self._es_done()
        return version

    def es_version(self) -> int:
        return self._es().opt.version

    def es_weights_hash(self) -> str:
        """sha256 over the HF-named views, HF order (comparable with the ``hf`` backend)."""
        return self._es().opt.weights_hash()

    def es_checksum(self) -> str:
        """Fast on-device checksum of every engine tensor, padding rows included."""
        state = self._es()
        return weights_checksum(sorted(state.tensors.items()))

    def es_self_test(self, seed: int = 12345) -> dict[str, Any]:
        """A perturbation must change the engine's checksum and a restore return it exactly."""
        before = self.es_checksum()
        self.es_perturb(seed, 1)
        try:
            perturbed = self.es_checksum()
        finally:
            self.es_restore()
        after = self.es_checksum()
        return {
            "before": before,
            "perturbed": perturbed,
            "restored": after,
            "changes": perturbed != before,
            "restores": after == before,
            "ok": perturbed != before and after == before,
        }

    def es_info(self) -> dict[str, Any]:
        return dict(self._es().info)

    def es_close(self) -> bool:
        state = getattr(self, "_es_state", None)
        if state is not None:
            if state.active is not None:
                self.es_restore()
            state.opt.close()
            self._es_state = None
        return True
