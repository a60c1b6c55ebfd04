"""Rollouts: a job is one seeded perturbation evaluated on D tasks, C sessions at a time.

Every episode runs in its own container through :mod:`runner.terminal` (the published
protocol, per-command and per-episode timeouts, the pytest verifier); a finished
session's slot takes the next task at once (continuous refill). All sessions of a job
share the backend's perturbed weights and are batched by its :class:`SessionBatcher`.
A job's reward is the mean episode reward; its graded reward the mean fraction of the
verifiers' checks that passed (the ES fitness under ``es.reward: graded``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from runner.backends import GenerationBackend, GenerationRequest, SessionBatcher
from runner.errors import UserError
from runner.seeds import derive_seed
from runner.terminal.episode import EpisodeConfig, EpisodeRecord, make_client, run_episode
from runner.terminal.images import ImageBuilder
from runner.terminal.memo import EpisodeMemo
from runner.terminal.protocol import Message
from runner.terminal.reset import SandboxPool
from runner.terminal.task import Task

# One row of episodes.parquet; the first columns are the contract, the rest detail.
EPISODE_COLUMNS = (
    "job_id",
    "version",
    "task_id",
    "category",
    "reward",
    "turns",
    "tokens_in",
    "tokens_out",
    "generation_s",
    "container_s",
    "duration_s",
    "timed_out",
    "error",
    "index",
    "passed",
    "graded",
    "done",
    "truncated_turns",
    "sandbox_start_s",
    "verify_s",
    "start_time",
    "end_time",
    # per turn, in order (the turn model's fit: staleness_sim.validation.turn_fit)
    "turn_start",
    "turn_gen_s",
    "turn_tokens_in",
    "turn_tokens_out",
    "turn_command_s",
    # training with tasks.memo: how the episode ran (hit | partial | miss | audit; "" without)
    "memo",
    "memo_mismatch",
)


def docker_client(pool: int = 64):
    """A client of a reachable engine with the base image, or a UserError saying what to run."""
    import docker
    import docker.errors

    from runner.terminal.images import ImageConfig

    try:
        client = make_client(pool=pool)
        client.ping()
    except docker.errors.DockerException as exc:
        raise UserError(
            f"no Docker engine reachable ({exc}); run 'sudo bash scripts/setup_docker.sh'"
        ) from None
    base = ImageConfig().base_image
    try:
        client.images.get(base)
    except docker.errors.ImageNotFound:
        raise UserError(
            f"base image {base} is missing; run 'sudo bash scripts/setup_docker.sh'"
        ) from None
    return client


@dataclass
class SessionStats:
    tokens_in: int = 0
    tokens_out: int = 0
    generation_s: float = 0.0
    truncated_turns: int = 0
    turn_start: list[float] = field(default_factory=list)  # run clock at each request
    turn_gen_s: list[float] = field(default_factory=list)
    turn_tokens_in: list[int] = field(default_factory=list)
    turn_tokens_out: list[int] = field(default_factory=list)


class SessionAgent:
    """The agent of one episode: each turn is a request to the worker's batcher.

    Turn t of session ``slot`` samples with ``derive_seed(job_seed, slot, t)``, so two
    members sharing a sampling seed draw the same random numbers for the same task.
    """

    def __init__(
        self, batcher: SessionBatcher, seed: int, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.batcher, self.seed, self.clock = batcher, seed, clock
        self.stats = SessionStats()
        self.opened = False

    def __call__(self, messages: Sequence[Message]) -> str:
        if not self.opened:  # counted as a session once it first asks for a turn
            self.batcher.open_session()
            self.opened = True
        turn = sum(1 for m in messages if m["role"] == "assistant")
        start, t0 = self.clock(), time.perf_counter()
        out = self.batcher.generate(GenerationRequest(messages, derive_seed(self.seed, turn)))
        seconds = time.perf_counter() - t0
        s = self.stats
        s.generation_s += seconds
        s.tokens_in += out.tokens_in
        s.tokens_out += out.tokens_out
        s.truncated_turns += out.truncated
        s.turn_start.append(start)
        s.turn_gen_s.append(seconds)
        s.turn_tokens_in.append(out.tokens_in)
        s.turn_tokens_out.append(out.tokens_out)
        return out.text

    def close(self) -> None:
        if self.opened:
            self.batcher.close_session()
            self.opened = False


@dataclass(frozen=True)
class JobSpec:
    job_id: int
    version: int  # the weights it is evaluated at
    seed: int  # perturbation seed
    sign: int
    sampling_seed: int
    tasks: tuple[Task, ...]


@dataclass
class JobOutcome:
    reward: float  # mean episode reward (binary for native tasks)
    episodes: list[dict[str, Any]]
    perturb_s: float = 0.0
    generation_s: float = 0.0
    container_s: float = 0.0
    transcripts: list[dict[str, Any]] = field(default_factory=list)
    graded: float = 0.0  # mean fraction of the verifiers' checks that passed

    def fitness(self, kind: str) -> float:
        """What ES optimizes (``es.reward``): ``binary`` (the reward) or ``graded``."""
        if kind not in FITNESS:
            raise ValueError(f"es.reward must be one of {', '.join(FITNESS)}, got {kind!r}")
        return self.graded if kind == "graded" else self.reward


FITNESS = ("binary", "graded")


def episode_row(
    job: JobSpec,
    index: int,
    task: Task,
    rec: EpisodeRecord,
    stats: SessionStats,
    start: float,
    end: float,
) -> dict[str, Any]:
    container_s = rec.start_s + sum(t.duration_s for t in rec.transcript) + rec.verify_s
    return {
        "job_id": job.job_id,
        "version": job.version,
        "task_id": task.task_id,
        "category": task.category,
        "reward": float(rec.reward),
        "turns": rec.turns,
        "tokens_in": stats.tokens_in,
        "tokens_out": stats.tokens_out,
        "generation_s": stats.generation_s,
        "container_s": container_s,
        "duration_s": rec.duration_s,
        "timed_out": rec.timed_out,
        "error": rec.error,
        "index": index,
        "passed": rec.passed,
        "graded": float(rec.graded),
        "done": rec.done,
        "truncated_turns": stats.truncated_turns,
        "sandbox_start_s": rec.start_s,
        "verify_s": rec.verify_s,
        "start_time": start,
        "end_time": end,
        "turn_start": list(stats.turn_start),
        "turn_gen_s": list(stats.turn_gen_s),
        "turn_tokens_in": list(stats.turn_tokens_in),
        "turn_tokens_out": list(stats.turn_tokens_out),
        "turn_command_s": [t.duration_s for t in rec.transcript],
        "memo": rec.memo,
        "memo_mismatch": rec.memo_mismatch,
    }


def run_job(
    job: JobSpec,
    backend: GenerationBackend,
    batcher: SessionBatcher,
    *,
    concurrency: int,
    episode_config: EpisodeConfig,
    client,
    builder: ImageBuilder,
    abort: threading.Event,
    clock: Callable[[], float],
    perturb: bool = True,
    sandboxes: SandboxPool | None = None,
    memo: EpisodeMemo | None = None,
) -> JobOutcome:
    """Evaluate ``job`` (perturbed unless ``perturb`` is False: evaluation of the weights);
    ``sandboxes``: containers reused after a verified reset, ``memo``: repeated episodes
    answered without a container (training only)."""

    def episode(index: int, task: Task) -> tuple[dict[str, Any], dict[str, Any]]:
        agent = SessionAgent(batcher, derive_seed(job.sampling_seed, index), clock)
        start = clock()
        try:
            rec = run_episode(
                task, agent, client=client, builder=builder, config=episode_config, abort=abort,
                sandboxes=sandboxes, memo=memo,
            )  # fmt: skip
        finally:
            agent.close()
        row = episode_row(job, index, task, rec, agent.stats, start, clock())
        transcript = {"job_id": job.job_id, "index": index, "task_id": task.task_id,
                      "reward": rec.reward, "turns": [t.__dict__ for t in rec.transcript]}  # fmt: skip
        return row, transcript

    t0 = time.perf_counter()
    with backend.perturbed(job.seed, job.sign) if perturb else nullcontext():
        perturb_s = time.perf_counter() - t0
        with ThreadPoolExecutor(max(1, concurrency), thread_name_prefix=f"job{job.job_id}") as pool:
            done = list(pool.map(episode, range(len(job.tasks)), job.tasks))
        t1 = time.perf_counter()
    perturb_s += time.perf_counter() - t1  # the restore
    rows = [r for r, _ in done]
    rewards = [r["reward"] for r in rows]
    return JobOutcome(
        reward=sum(rewards) / len(rewards),
        graded=sum(r["graded"] for r in rows) / len(rows),
        episodes=rows,
        perturb_s=perturb_s,
        generation_s=sum(r["generation_s"] for r in rows),
        container_s=sum(r["container_s"] for r in rows),
        transcripts=[t for _, t in done],
    )
