"""Many sessions, one model: gather the sessions waiting for a turn into one batch.

Each episode runs on its own thread and calls :meth:`SessionBatcher.generate`, which
blocks until its reply is ready. One serving thread hands the backend every request
waiting at that moment: it fires as soon as every open session is waiting (nobody else
can arrive), or ``window_s`` after the first request of the batch arrived, whichever
comes first, with at most ``max_batch`` rows.

A backend that batches continuously itself (``backend.continuous_batching``, the ``vllm``
engine) gets every turn at once through ``backend.submit(request) -> Future``: no window,
no ``max_batch``, no turn barrier (a session's next turn never waits for another
session's reply). ``batch_sizes`` and ``wait_s`` then stay empty / zero.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

from runner.backends.base import Generation, GenerationBackend, GenerationRequest


class BatcherClosed(RuntimeError):
    """The batcher was closed while a request waited (the job was cancelled or ended)."""


class SessionBatcher:
    def __init__(
        self, backend: GenerationBackend, max_batch: int = 64, window_s: float = 0.05
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.backend = backend
        self.max_batch, self.window_s = max_batch, window_s
        self._cv = threading.Condition()
        self._pending: list[tuple[GenerationRequest, Future, float]] = []
        self._sessions = 0
        self._closed = False
        # Pass-through for backends that batch continuously (vllm): their own futures.
        self._direct = bool(getattr(backend, "continuous_batching", False))
        self._in_engine: set[Future] = set()
        self.batch_sizes: list[int] = []
        self.wait_s = 0.0  # summed over requests: arrival to the start of their batch
        self._thread = threading.Thread(target=self._serve, name="batcher", daemon=True)
        self._thread.start()

    # -- sessions -----------------------------------------------------------------------
    def open_session(self) -> None:
        with self._cv:
            self._sessions += 1

    def close_session(self) -> None:
        with self._cv:
            self._sessions -= 1
            self._cv.notify_all()  # the others may now be all the sessions there are

    def generate(self, request: GenerationRequest) -> Generation:
        return self.submit(request).result()

    def submit(self, request: GenerationRequest) -> Future:
        if self._direct:
            return self._submit_direct(request)
        fut: Future = Future()
        with self._cv:
            if self._closed:
                raise BatcherClosed("the batcher is closed")
            self._pending.append((request, fut, time.monotonic()))
            self._cv.notify_all()
        return fut

    def _submit_direct(self, request: GenerationRequest) -> Future:
        outer: Future = Future()
        with self._cv:
            if self._closed:
                raise BatcherClosed("the batcher is closed")
            inner = self.backend.submit(request)
            self._in_engine.add(inner)

        def done(f: Future) -> None:
            with self._cv:
                self._in_engine.discard(f)
            if outer.done():  # closed meanwhile
                return
            if f.cancelled():
                outer.set_exception(BatcherClosed("the turn was cancelled"))
            elif f.exception() is not None:
                outer.set_exception(f.exception())
            else:
                outer.set_result(f.result())

        inner.add_done_callback(done)
        return outer

    def close(self) -> None:
        with self._cv:
            self._closed = True
            pending, self._pending = self._pending, []
            in_engine, self._in_engine = list(self._in_engine), set()
            self._cv.notify_all()
        for _, fut, _ in pending:
            fut.set_exception(BatcherClosed("the batcher was closed before this turn ran"))
        for fut in in_engine:  # a cancelled turn is aborted inside the engine
            fut.cancel()
        self._thread.join(timeout=60)

    # -- serving ------------------------------------------------------------------------
    def _take_batch(self) -> list[tuple[GenerationRequest, Future, float]] | None:
        with self._cv:
            while not self._pending and not self._closed:
                self._cv.wait()
            if self._closed:
                return None
            deadline = self._pending[0][2] + self.window_s
            while not self._closed:
                target = min(self.max_batch, max(1, self._sessions))
                remaining = deadline - time.monotonic()
                if len(self._pending) >= target or remaining <= 0:
                    break
                self._cv.wait(remaining)
            batch, self._pending = (
                self._pending[: self.max_batch],
                self._pending[self.max_batch :],
            )
            return batch

    def _serve(self) -> None:
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            now = time.monotonic()
            self.wait_s += sum(now - t for _, _, t in batch)
            self.batch_sizes.append(len(batch))
            try:
                outs = self.backend.generate([r for r, _, _ in batch])
            except BaseException as exc:  # noqa: BLE001 - handed to every waiting session
                for _, fut, _ in batch:
                    fut.set_exception(exc)
                continue
            for (_, fut, _), out in zip(batch, outs, strict=True):
                fut.set_result(out)
