"""The ``vllm`` backend: one vLLM engine (``AsyncLLM``) per worker, ES inside the engine.

Same interface as ``hf`` (:class:`~runner.backends.base.GenerationBackend`), different
machinery:

* **Weights** stay in the engine. perturb / restore / update / replay run in the engine's
  worker process through a worker extension (:mod:`runner.backends.vllm_extension`,
  ``worker_extension_cls``) called by name with ``collective_rpc``. The extension runs the
  ES core's own :class:`~runner.es.ESOptimizer` on HF-named views of the engine's fused
  tensors (the name map, :mod:`runner.backends.vllm_names`), so the noise, the fp32
  master, the bit-exact restore and the update log are those of the ``hf`` backend: a log
  written by vLLM workers replays on ``hf`` and back, and the weights hash (hence the base
  hash a checkpoint records) is the ``hf`` backend's for the same weights and dtype.
* **Generation** is asynchronous: :meth:`VLLMBackend.submit` hands one turn to the engine
  at once and returns a future; the engine batches every running sequence continuously,
  so no session waits for another's turn (no turn barrier). ``continuous_batching = True``
  tells the :class:`~runner.backends.batching.SessionBatcher` to pass turns straight
  through (its batching window and ``max_batch`` do not apply). Prompts are rendered as
  the ``hf`` backend renders them (chat template, rolling context:
  :func:`~runner.backends.context.fit_prompt`) and handed over as token ids; each request
  samples with its own seed (``SamplingParams(seed=...)``), so members that share a
  sampling seed draw the same stream; the same stop strings and end-of-sequence ids end a
  reply, and the same :class:`~runner.backends.base.Generation` record comes back.
* **Prefix caching** would reuse KV blocks computed under other weights, so it is off by
  default (``prefix_cache: off``); ``prefix_cache: reset`` turns it on and resets the
  cache after every weight change (perturb, restore, update), which keeps it within one
  job's weights, where a session's turns extend each other's prompts.
* **Start-up self-test**: a perturbation must change the engine's weights checksum and a
  restore must return it exactly (``es_self_test``); the backend refuses to start
  otherwise.

vLLM is imported only when a ``VLLMBackend`` is built (``make_backend("vllm", ...)``), so
nothing on a machine without a GPU imports it; without vLLM the error is one line saying
what to install.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from runner.backends.base import Generation, GenerationBackend, GenerationRequest
from runner.backends.context import fit_prompt
from runner.errors import UserError
from runner.es import UpdateRecord

log = logging.getLogger(__name__)

EXTENSION = "runner.backends.vllm_extension.ESWorkerExtension"
# The range the ``vllm`` extra pins (pyproject.toml); see docs/vllm.md for the APIs used.
VLLM_RANGE = (">=0.9.0", "<0.35")
PREFIX_CACHE_MODES = ("off", "reset")
_ENV_LOCK = threading.Lock()


class VLLMUnavailable(UserError):
    """vLLM cannot be imported here (printed by es-runner as one line)."""


def require_vllm() -> Any:
    """Import vLLM, or raise :class:`VLLMUnavailable` naming what to install."""
    try:
        import vllm
    except ImportError as exc:
        raise VLLMUnavailable(
            f"model.backend vllm needs vLLM, which does not import here ({exc}); "
            "on a machine with an NVIDIA GPU run: pip install -e .[vllm]"
        ) from None
    return vllm


@dataclass
class EngineOptions:
    """``model.vllm`` in a run config: how the engine is built (see docs/vllm.md)."""

    prefix_cache: str = "off"  # off | reset (on, reset at every weight change)
    gpu_memory_utilization: float = 0.5  # leave room for the fp32 master (4 B/parameter)
    max_num_seqs: int = 256
    enforce_eager: bool = False  # True: no CUDA graphs (faster start, slower decode)
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
        if not 0.0 < opts.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        return opts


def engine_args(
    path: str | Path,
    *,
    dtype: str,
    max_model_len: int,
    options: EngineOptions,
) -> dict[str, Any]:
    """The ``AsyncEngineArgs`` keywords of one worker's engine (no vLLM import)."""
    args: dict[str, Any] = {
        "model": str(path),
        "tokenizer": str(path),
        "dtype": dtype,
        "seed": 0,
        "max_model_len": max_model_len,
        "gpu_memory_utilization": options.gpu_memory_utilization,
        "max_num_seqs": options.max_num_seqs,
        "enforce_eager": options.enforce_eager,
        "enable_prefix_caching": options.prefix_cache == "reset",
        "tensor_parallel_size": 1,  # one engine per worker; the name map assumes TP = 1
        "worker_extension_cls": EXTENSION,
        "disable_log_stats": True,
    }
    clash = sorted(set(options.extra) & {"model", "worker_extension_cls", "tensor_parallel_size"})
    if clash:
        raise ValueError(f"engine option extra may not set {clash}")
    args.update(options.extra)
    return args


def generation_record(
    text: str,
    token_ids: Sequence[int],
    finish_reason: str | None,
    stop_reason: int | str | None,
    tokens_in: int,
    truncated: bool,
    eos: set[int],
) -> Generation:
    """A vLLM completion as the ``hf`` backend's :class:`Generation`.

    ``finish``: ``length`` at the token limit, ``stop`` for a stop string (vLLM's
    ``stop_reason`` is then that string), else ``eos``. The end-of-sequence token is not
    counted in ``tokens_out`` (the ``hf`` backend never appends it).
    """
    if finish_reason == "length":
        finish = "length"
    elif isinstance(stop_reason, str):
        finish = "stop"
    else:
        finish = "eos"
    n_out = len(token_ids)
    if finish == "eos" and n_out and int(token_ids[-1]) in eos:
        n_out -= 1
    return Generation(text, tokens_in, n_out, truncated, finish)


@contextmanager
def _visible_device(device: str) -> Iterator[None]:
    """Engine processes started inside see only GPU ``N`` of ``cuda:N``."""
    kind, _, index = device.partition(":")
    if kind != "cuda":
        raise ValueError(f"model.backend vllm needs model.device cuda or cuda:N, got {device!r}")
    if not index:
        yield
        return
    with _ENV_LOCK:
        old = os.environ.get("CUDA_VISIBLE_DEVICES")
        visible = [v for v in (old or "").split(",") if v.strip()]
        os.environ["CUDA_VISIBLE_DEVICES"] = visible[int(index)] if visible else index
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = old


class VLLMBackend(GenerationBackend):
    name = "vllm"
    continuous_batching = True

    def __init__(
        self,
        path: str | Path,
        *,
        dtype: str = "bfloat16",
        device: str = "cuda",
        es: dict[str, Any] | None = None,
        temperature: float = 0.6,
        top_p: float = 1.0,
        max_new_tokens: int = 2048,
        context_tokens: int = 16384,
        stop: Sequence[str] = ("</command>", "</action>"),
        engine: Mapping[str, Any] | None = None,
    ) -> None:
        require_vllm()
        from transformers import AutoTokenizer, GenerationConfig

        from runner.backends.vllm_names import hf_parameter_shapes

        self.options = EngineOptions.from_mapping(engine)
        path = Path(path)
        if not (path / "config.json").is_file():
            raise UserError(f"model.path {path}: no model there (no config.json)")
        if context_tokens <= max_new_tokens:
            raise ValueError(
                f"context_tokens ({context_tokens}) must exceed the tokens generated per turn "
                f"({max_new_tokens})"
            )
        self.path, self.device = path, device
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if not getattr(self.tokenizer, "chat_template", None):
            raise UserError(f"model.path {path}: the tokenizer has no chat template")
        self.temperature, self.top_p = temperature, top_p
        self.max_new_tokens, self.context_tokens = max_new_tokens, context_tokens
        self._budget = context_tokens - max_new_tokens
        self.stop = tuple(s for s in stop if s)
        try:
            eos = GenerationConfig.from_pretrained(path).eos_token_id
        except OSError:
            eos = None
        eos = eos if isinstance(eos, list) else [eos]
        self._eos = {int(e) for e in (*eos, self.tokenizer.eos_token_id) if e is not None}
        self._ids = itertools.count()
        self._prefix = uuid.uuid4().hex[:8]
        self._lock = threading.Lock()
        self._inflight = 0
        self._changing = False
        self._closed = False
        self.stats = {"requests": 0, "tokens_out": 0, "prefix_resets": 0, "weight_rpc_s": 0.0}

        from vllm import SamplingParams
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.async_llm import AsyncLLM

        self._SamplingParams, self._TokensPrompt = SamplingParams, TokensPrompt
        self._final_only = RequestOutputKind.FINAL_ONLY

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="vllm-loop", daemon=True
        )
        self._thread.start()
        self.engine: Any = None
        try:
            args = AsyncEngineArgs(
                **engine_args(path, dtype=dtype, max_model_len=context_tokens, options=self.options)
            )

            async def make() -> Any:
                return AsyncLLM.from_engine_args(args)

            with _visible_device(device):
                self.engine = self._call(make())
            shapes = [[n, list(s)] for n, s in hf_parameter_shapes(path)]
            info = self._rpc("es_setup", shapes, es or {})
            self.es_info = info
            self._base_hash: str | None = info["base_hash"]
            self._es_config: dict[str, Any] = info["es_config"]
            self._version = 0
            self.self_test_result: dict[str, Any] | None = None
            if self.options.self_test:
                self.self_test_result = self.self_test(self.options.self_test_seed)
        except BaseException:
            self.close()
            raise

    # -- plumbing ------------------------------------------------------------------------
    def _call(self, coro, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _rpc(self, method: str, *args: Any) -> Any:
        results = self._call(self.engine.collective_rpc(method, args=tuple(args)))
        if len(results) != 1:
            raise RuntimeError(f"{method}: expected one engine worker, got {len(results)}")
        return results[0]

    @contextmanager
    def _weights_change(self, what: str) -> Iterator[None]:
        with self._lock:
            if self._inflight:
                raise RuntimeError(f"{what} while {self._inflight} generation(s) are in flight")
            if self._changing:
                raise RuntimeError(f"{what} while the weights are already changing")
            self._changing = True  # no submit() until the change is done
        t0 = time.perf_counter()
        try:
            yield
            if self.options.prefix_cache == "reset":
                ok = self._call(self.engine.reset_prefix_cache())
                if ok is False:
                    raise RuntimeError("the engine refused to reset its prefix cache")
                self.stats["prefix_resets"] += 1
        finally:
            self.stats["weight_rpc_s"] += time.perf_counter() - t0
            with self._lock:
                self._changing = False

    # -- weights -------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._version

    @property
    def base_hash(self) -> str | None:
        return self._base_hash

    def es_config(self) -> dict[str, Any]:
        return dict(self._es_config)

    @contextmanager
    def perturbed(self, seed: int, sign: int = 1) -> Iterator[None]:
        with self._weights_change("perturb"):
            self._rpc("es_perturb", int(seed), int(sign))
        try:
            yield
        finally:
            with self._weights_change("restore"):
                self._rpc("es_restore")

    def sync(self, log: Sequence[UpdateRecord]) -> int:
        if len(log) <= self._version:
            return 0
        before = self._version
        with self._weights_change("sync"):
            self._version = int(self._rpc("es_replay", [r.to_dict() for r in log], len(log)))
        return self._version - before

    def weights_hash(self) -> str:
        return self._rpc("es_weights_hash")

    def checksum(self) -> str:
        return self._rpc("es_checksum")

    def self_test(self, seed: int = 12345) -> dict[str, Any]:
        """Perturb changes the engine's checksum, restore returns it; raise otherwise."""
        with self._weights_change("self-test"):
            result = self._rpc("es_self_test", int(seed))
        if not result["ok"]:
            raise RuntimeError(
                "vLLM ES self-test failed: "
                + ("a perturbation left the weights unchanged" if not result["changes"] else "")
                + ("a restore did not return the weights exactly" if not result["restores"] else "")
            )
        return result

    # -- generation ----------------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> Future:
        """Hand one turn to the engine now; the future's result is its :class:`Generation`."""
        ids, truncated = fit_prompt(self.tokenizer, request.messages, self._budget)
        with self._lock:
            if self._closed:
                raise RuntimeError("the vLLM backend is closed")
            if self._changing:
                raise RuntimeError("a generation was submitted while the weights change")
            self._inflight += 1
        fut = asyncio.run_coroutine_threadsafe(
            self._generate_one(ids, truncated, int(request.seed)), self._loop
        )
        fut.add_done_callback(self._finished)
        return fut

    def _finished(self, _fut: Future) -> None:
        with self._lock:
            self._inflight -= 1

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Every request is submitted at once; the engine batches them continuously."""
        futures = [self.submit(r) for r in requests]
        return [f.result() for f in futures]

    async def _generate_one(self, ids: list[int], truncated: bool, seed: int) -> Generation:
        params = self._SamplingParams(
            n=1,
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=self.max_new_tokens,
            seed=seed % 2**63,
            stop=list(self.stop) or None,
            stop_token_ids=sorted(self._eos),
            include_stop_str_in_output=True,
            skip_special_tokens=True,
            output_kind=self._final_only,
        )
        request_id = f"es-{self._prefix}-{next(self._ids)}"
        final = None
        async for out in self.engine.generate(
            self._TokensPrompt(prompt_token_ids=ids), params, request_id
        ):
            final = out
        if final is None or not final.outputs:
            raise RuntimeError(f"vLLM returned no output for request {request_id}")
        comp = final.outputs[0]
        gen = generation_record(
            comp.text,
            comp.token_ids,
            comp.finish_reason,
            comp.stop_reason,
            len(ids),
            truncated,
            self._eos,
        )
        self.stats["requests"] += 1
        self.stats["tokens_out"] += gen.tokens_out
        return gen

    async def _shutdown(self) -> None:  # in the loop, which owns the engine's tasks
        self.engine.shutdown()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.engine is not None:
            try:
                self._rpc("es_close")  # frees the fp32 master
            except Exception as exc:  # noqa: BLE001 - shutting down anyway
                log.warning("vLLM es_close failed: %s", exc)
            try:
                self._call(self._shutdown(), timeout=120)
            except Exception as exc:  # noqa: BLE001
                log.warning("vLLM engine shutdown failed: %s", exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
