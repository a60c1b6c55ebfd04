"""The generation interface the rest of the runner uses, whatever serves the model.

A backend owns one copy of the policy's weights and everything that touches them:
batched generation for many concurrent sessions, and, through the ES core, perturb /
restore / apply-update / replay. Nothing outside a backend changes weights.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runner.es import UpdateRecord
from runner.terminal.protocol import Message

if TYPE_CHECKING:  # the ES kernels are torch; this interface is imported without it
    from runner.es import ESOptimizer


@dataclass(frozen=True)
class GenerationRequest:
    """One turn of one session: the conversation so far and the seed of its sampling."""

    messages: Sequence[Message]
    seed: int


@dataclass(frozen=True)
class Generation:
    text: str
    tokens_in: int  # prompt tokens after the rolling-context truncation
    tokens_out: int
    truncated: bool  # the context was cut to fit the token budget
    finish: str  # "stop" (a stop string), "eos", or "length"


class GenerationBackend(ABC):
    """Batched generation plus ES weight ownership; subclasses provide ``generate``.

    ``es`` is the backend's :class:`ESOptimizer` over its own weights; the default weight
    methods go through it (a backend whose weights live elsewhere, such as inside an
    inference engine, overrides them).
    """

    name = "base"
    es: ESOptimizer
    # True for a backend that batches continuously itself (vllm): it provides
    # ``submit(request) -> Future`` and the SessionBatcher passes each turn straight to it.
    continuous_batching = False

    @abstractmethod
    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """One reply per request, computed together (batched), in request order."""

    # -- weights ------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self.es.version

    @property
    def base_hash(self) -> str | None:
        return self.es.base_hash

    def es_config(self) -> dict[str, Any]:
        """The optimizer's hyper-parameters and noise definition (as checkpoints record)."""
        return self.es.config()

    @contextmanager
    def perturbed(self, seed: int, sign: int = 1) -> Iterator[None]:
        """Weights are ``master + sign * sigma * eps(seed)`` inside; restored exactly after."""
        with self.es.perturbed(seed, sign):
            yield

    def sync(self, log: Sequence[UpdateRecord]) -> int:
        """Catch up to ``len(log)`` by replaying seeds; returns how many updates were applied."""
        before = self.es.version
        self.es.replay(log, upto=len(log))
        return self.es.version - before

    def weights_hash(self) -> str:
        return self.es.weights_hash()

    def close(self) -> None:
        self.es.close()
