"""The ``hf`` backend: a transformers causal LM on CPU or GPU, batched over sessions.

Prompts are left-padded, prefilled in one forward pass, then decoded token by token with
a KV cache (runner/backends/decoding.py); a row that finishes (a stop string, end of
sequence, or the token limit) leaves the batch at once. ``batching="turn"`` decodes each
batch the session batcher hands in until its last row is done; ``batching="continuous"``
decodes on a thread of its own and takes each new turn in at the next step (``submit``),
so a session never waits for another's reply. Each row samples from its own seeded stream
(runner/backends/sampling.py): both modes give the same replies.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, InvalidStateError
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch

# Imported here, once, under the import lock: transformers' lazy attribute loading is not
# safe when two threads (a worker and the evaluator) reach it first at the same time.
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from runner.backends.base import Generation, GenerationBackend, GenerationRequest
from runner.backends.context import fit_prompt
from runner.backends.decoding import DecodeBatch, PrefixStore, Row
from runner.backends.sampling import sample_rows
from runner.backends.turns import TurnSettings
from runner.es import ESOptimizer, UpdateRecord

# from_pretrained patches global state while it builds a model (meta-device init), so two
# threads loading at once break each other: loads are serialised.
_LOAD_LOCK = threading.Lock()

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(ValueError):
    """The model folder is missing or unreadable; the message says what to run."""


def _quiet_transformers() -> None:
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def load_model(path: str | Path, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any]:
    """(model, tokenizer) through ``from_pretrained``: the path any real checkpoint takes."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ModelLoadError(
            f"model.path {path}: no model there (no config.json); build a tiny one with "
            f"'es-runner model make-tiny {path}', or point model.path at a saved checkpoint"
        )
    _quiet_transformers()
    try:
        with _LOAD_LOCK:
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype]).to(device)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"model.path {path}: cannot load it ({exc})") from None
    model.eval()
    if not getattr(tokenizer, "chat_template", None):
        raise ModelLoadError(f"model.path {path}: the tokenizer has no chat template")
    return model, tokenizer


BATCHING = ("turn", "continuous")


class HFBackend(GenerationBackend):
    name = "hf"

    def __init__(
        self,
        path: str | Path,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        es: dict[str, Any] | None = None,
        batching: str = "turn",
        max_batch: int = 64,
        admit_window_s: float = 0.05,
        prefix_reuse: bool = False,
        **sampling: Any,
    ) -> None:
        """``sampling``: the keywords of :meth:`TurnSettings.build` (temperature, top_p,
        max_new_tokens, context_tokens, stop), the same for every backend."""
        if batching not in BATCHING:
            raise ValueError(f"batching must be one of {', '.join(BATCHING)}, got {batching!r}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.model, self.tokenizer = load_model(path, dtype, device)
        self.device = torch.device(device)
        self.es = ESOptimizer(self.model, **(es or {}))
        self.turn = TurnSettings.build(
            self.tokenizer, self.model.generation_config.eos_token_id, **sampling
        )
        # Enough trailing tokens to hold any stop string even at one character per token.
        self._stop_window = max((len(s) for s in self.turn.stop), default=0) + 1
        self._pad = self.tokenizer.pad_token_id
        if self._pad is None:
            self._pad = next(iter(self.turn.eos))
        # transformers 5 renamed the cache argument of forward (past_key_values -> cache).
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.stats = {"batches": 0, "rows": 0, "steps": 0, "tokens_out": 0, "seconds": 0.0}
        self.max_batch, self.admit_window_s = max_batch, admit_window_s
        # a finished turn's states, for the session's next turn (within one set of weights)
        self.prefixes = PrefixStore(capacity=2 * max_batch) if prefix_reuse else None
        self.continuous_batching = batching == "continuous"
        self._cv = threading.Condition()
        self._pending: list[Row] = []
        self._inflight = 0  # continuous: turns submitted and not yet out of the batch
        self._changing = self._closed = False
        self._thread = None
        if self.continuous_batching:
            self._thread = threading.Thread(target=self._serve, name="hf-decode", daemon=True)
            self._thread.start()

    # -- generation ---------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Replies to ``requests``, decoded as one batch (continuous: submitted together)."""
        if self.continuous_batching:
            return [f.result() for f in [self.submit(r) for r in requests]]
        if not requests:
            return []
        t0 = time.perf_counter()
        rows = [self._reuse(self._row(r)) for r in requests]
        batch = self._new_batch()
        with torch.inference_mode():
            batch.admit(rows)
            while batch:
                self._step(batch)
        self.stats["batches"] += 1
        self.stats["seconds"] += time.perf_counter() - t0
        return [self._reply(r) for r in rows]

    def submit(self, request: GenerationRequest) -> Future:
        """Continuous batching: the turn joins the decoding batch at its next step."""
        if not self.continuous_batching:
            raise RuntimeError("submit() needs batching='continuous'")
        row = self._row(request)
        row.future = Future()
        row.submitted = time.monotonic()
        with self._cv:
            if self._closed:
                raise RuntimeError("the hf backend is closed")
            if self._changing:
                raise RuntimeError("a generation was submitted while the weights change")
            self._inflight += 1  # from here no weight change starts until the turn is out
            self._pending.append(self._reuse(row))
            self._cv.notify_all()
        return row.future

    def _row(self, request: GenerationRequest) -> Row:
        prompt, truncated = fit_prompt(self.tokenizer, request.messages, self.turn.prompt_budget)
        generator = torch.Generator(device=self.device).manual_seed(request.seed % 2**63)
        return Row(list(prompt), truncated, generator)

    def _reuse(self, row: Row) -> Row:
        """Give ``row`` the states of the longest stored prefix of its prompt, if any."""
        if self.prefixes is not None:
            row.reused, row.prefix_kv = self.prefixes.take(row.prompt, self._weights_tag())
        return row

    def _weights_tag(self) -> tuple:
        return (self.es.version, self.es.active)

    def _new_batch(self) -> DecodeBatch:
        return DecodeBatch(self._forward, self._pad, self.device)

    def _step(self, batch: DecodeBatch) -> list[Row]:
        """Sample one token per row; rows that are done leave; the others decode on."""
        tokens = sample_rows(
            batch.logits, [r.generator for r in batch.rows], self.turn.temperature, self.turn.top_p
        ).tolist()
        done = []
        for row, tok in zip(batch.rows, tokens, strict=True):
            if tok in self.turn.eos:
                row.finish = "eos"
            else:
                row.tokens.append(tok)
                if self._hit_stop(row.tokens):
                    row.finish = "stop"
                elif len(row.tokens) < self.turn.max_new_tokens:
                    continue
            done.append(row)
        if self.prefixes is not None:
            tag = self._weights_tag()
            for row in done:
                self.prefixes.put(row.fed(), batch.states(row), tag)
        batch.drop(done)
        if batch:
            batch.decode([r.tokens[-1] for r in batch.rows])
        self.stats["steps"] += 1
        self.stats["rows"] += len(done)
        self.stats["tokens_out"] += sum(len(r.tokens) for r in done)
        return done

    def _reply(self, row: Row) -> Generation:
        text = self.tokenizer.decode(row.tokens, skip_special_tokens=True)
        if row.finish == "stop":
            text = self._cut_after_stop(text)
        return Generation(text, len(row.prompt), len(row.tokens), row.truncated, row.finish)

    # -- continuous batching: the decoding thread ----------------------------------------
    def _serve(self) -> None:
        batch = self._new_batch()
        while True:
            with self._cv:
                while not self._pending and not batch and not self._closed:
                    self._cv.wait()
                if self._closed:
                    leaving, self._pending = [*batch.rows, *self._pending], []
                    self._settle(leaving, RuntimeError("the hf backend was closed"))
                    return
                joining = []
                if self._admit_now(len(batch)):
                    room = self.max_batch - len(batch)
                    joining, self._pending = self._pending[:room], self._pending[room:]
            # a turn whose session was cancelled meanwhile is aborted here
            cancelled = [r for r in (*batch.rows, *joining) if r.future.cancelled()]
            batch.drop(cancelled)
            joining = [r for r in joining if not r.future.cancelled()]
            self._settle(cancelled)
            live = [*batch.rows, *joining]  # none of them has its reply yet
            t0 = time.perf_counter()
            try:
                with torch.inference_mode():
                    batch.admit(joining)
                    done = self._step(batch) if batch else []
            except BaseException as exc:  # noqa: BLE001 - handed to every turn in the batch
                self._settle(live, exc)
                batch = self._new_batch()
                continue
            finally:
                self.stats["seconds"] += time.perf_counter() - t0
            self.stats["batches"] += bool(joining)
            self._settle(done)

    def _admit_now(self, live: int) -> bool:
        """Whether the waiting turns join now: each admission costs a forward pass of its
        own, so while rows are decoding, turns gather until as many wait as decode, or
        the first of them has waited ``admit_window_s``."""
        if not self._pending:
            return False
        if not live or len(self._pending) >= live:
            return True
        return time.monotonic() - self._pending[0].submitted >= self.admit_window_s

    def _settle(self, rows: Sequence[Row], error: BaseException | None = None) -> None:
        """Hand out the replies (or ``error``) of rows that left the batch."""
        for row in rows:
            try:
                if error is None:
                    row.future.set_result(self._reply(row))
                else:
                    row.future.set_exception(error)
            except InvalidStateError:  # cancelled by its session meanwhile
                pass
        with self._cv:
            self._inflight -= len(rows)
            self._cv.notify_all()

    # -- weights: never changed under a turn in flight (continuous batching) --------------
    @contextmanager
    def _weights_change(self) -> Iterator[None]:
        """Wait until no turn is in the batch; refuse new turns until the change is done."""
        with self._cv:
            while self._inflight:
                self._cv.wait()
            self._changing = True
        try:
            yield
        finally:
            if self.prefixes is not None:
                self.prefixes.clear()  # states never cross a weight change
            with self._cv:
                self._changing = False

    @contextmanager
    def perturbed(self, seed: int, sign: int = 1) -> Iterator[None]:
        weights = ExitStack()
        with self._weights_change():
            weights.enter_context(self.es.perturbed(seed, sign))
        try:
            yield
        finally:
            with self._weights_change():
                weights.close()  # the exact restore

    def sync(self, log: Sequence[UpdateRecord]) -> int:
        with self._weights_change():
            return super().sync(log)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=60)
        super().close()

    def _forward(self, ids, mask, positions, cache) -> torch.Tensor:
        kwargs = {self._cache_kw: cache}
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **kwargs,
        )
        return out.logits[:, -1, :]

    def _hit_stop(self, tokens: list[int]) -> bool:
        if not self.turn.stop:
            return False
        tail = self.tokenizer.decode(tokens[-self._stop_window :], skip_special_tokens=True)
        return any(s in tail for s in self.turn.stop)

    def _cut_after_stop(self, text: str) -> str:
        ends = [text.find(s) + len(s) for s in self.turn.stop if s in text]
        return text[: min(ends)] if ends else text
