"""A worker in this process (``placement: local``), and how any worker builds its backend.

Local workers run their jobs on the orchestrator's threads, one job at a time each. The
interface the orchestrator uses is :class:`runner.workers.protocol.Worker`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from runner.backends import GenerationBackend, SessionBatcher, make_backend
from runner.config import RunConfig
from runner.errors import UserError
from runner.es import UpdateRecord
from runner.rollouts import JobOutcome, JobSpec, run_job
from runner.terminal.episode import EpisodeConfig
from runner.terminal.images import ImageBuilder
from runner.terminal.memo import EpisodeMemo
from runner.terminal.reset import SandboxPool


def worker_device(config: RunConfig, index: int) -> str:
    """With several GPUs and ``device: cuda``, worker i takes GPU i mod n."""
    device = config.model.device
    if device == "cuda":
        import torch

        count = torch.cuda.device_count()
        return f"cuda:{index % count}" if count > 1 else "cuda"
    return device


def build_backend(config: RunConfig, device: str | None = None) -> GenerationBackend:
    try:
        return _make_backend(config, device)
    except ValueError as exc:  # a model that does not load, es.params that match nothing
        raise UserError(str(exc)) from None


def _make_backend(config: RunConfig, device: str | None) -> GenerationBackend:
    m, s = config.model, config.sampling
    return make_backend(
        m.backend,
        path=m.path,
        dtype=m.dtype,
        device=device or m.device,
        es=config.es.optimizer_kwargs(),
        temperature=s.temperature,
        top_p=s.top_p,
        max_new_tokens=s.max_new_tokens,
        context_tokens=config.context_tokens,
        stop=tuple(s.stop),
        **(
            {"engine": m.vllm.model_dump()}
            if m.backend == "vllm"
            else {
                "batching": m.batching,
                "max_batch": m.max_batch,
                "admit_window_s": m.batch_window_s,
                "prefix_reuse": m.prefix_reuse,
            }
        ),
    )


def episode_config(config: RunConfig) -> EpisodeConfig:
    return EpisodeConfig(
        max_turns=config.max_turns,
        command_timeout_s=config.command_timeout_s,
        episode_timeout_s=config.episode_timeout_s,
        verifier=config.tasks.verifier,
    )


class LocalWorker:
    """A worker in this process: its backend (its own copy of the weights), the batcher
    that shares the backend's forward passes among the job's sessions, and the episode
    settings. It runs a job on one of the orchestrator's threads; a Ray actor wraps one
    (:class:`runner.workers.ray_actor.WorkerActor`), and evaluation uses one unperturbed.
    """

    def __init__(
        self,
        index: int,
        config: RunConfig,
        client,
        builder: ImageBuilder,
        clock: Callable[[], float],
        *,
        device: str | None = None,
    ) -> None:
        self.index = index
        self.config = config
        self.client, self.builder, self.clock = client, builder, clock
        self.backend = build_backend(config, device or worker_device(config, index))
        m = config.model
        self.batcher = SessionBatcher(
            self.backend, max_batch=m.max_batch, window_s=m.batch_window_s
        )
        self.episodes = episode_config(config)
        # training episodes' containers, reused after a verified reset (never in evaluation)
        self.sandboxes = (
            SandboxPool(max_idle=config.episodes_per_job) if config.tasks.reuse_containers else None
        )
        # training episodes that repeat an earlier one's commands, answered without one
        memo = config.tasks.memo
        self.memo = (
            EpisodeMemo(audit=memo.audit, max_entries=memo.max_entries, seed=config.seed + index)
            if memo is not None
            else None
        )

    @property
    def base_hash(self) -> str | None:
        return self.backend.base_hash

    def es_config(self) -> dict:
        return self.backend.es_config()

    def sync(self, log: Sequence[UpdateRecord]) -> int:
        return self.backend.sync(log)

    def run_job(
        self,
        job: JobSpec,
        abort: threading.Event,
        *,
        clock: Callable[[], float] | None = None,
        perturb: bool = True,
    ) -> JobOutcome:
        """Run ``job``; ``clock`` overrides the worker's (an actor's is per job),
        ``perturb=False`` evaluates the weights themselves."""
        return run_job(
            job,
            self.backend,
            self.batcher,
            concurrency=self.config.concurrency,
            episode_config=self.episodes,
            client=self.client,
            builder=self.builder,
            abort=abort,
            clock=clock or self.clock,
            perturb=perturb,
            sandboxes=self.sandboxes if perturb else None,
            memo=self.memo if perturb else None,
        )

    def close(self) -> None:
        if self.memo is not None:
            self.memo.close()
        if self.sandboxes is not None:
            self.sandboxes.close()
        self.batcher.close()
        self.backend.close()
