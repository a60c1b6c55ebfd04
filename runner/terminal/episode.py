"""Run episodes: build/reuse the image, start a sandbox, talk to the agent, verify.

Many episodes run at once on threads (the docker SDK is blocking; each episode spends
nearly all its time waiting on the engine or the agent). Ctrl-C cancels queued episodes
and removes every live container before re-raising.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field

import docker

from runner.terminal import reaper
from runner.terminal.errors import TerminalError
from runner.terminal.images import ImageBuilder, ImageConfig
from runner.terminal.memo import EpisodeMemo, MemoPlay
from runner.terminal.protocol import (
    PARSE_ERROR_OBSERVATION,
    SYSTEM_PROMPT,
    Agent,
    Message,
    observation,
    parse_action,
)
from runner.terminal.reset import SandboxPool
from runner.terminal.sandbox import Sandbox, SandboxConfig
from runner.terminal.task import Task
from runner.terminal.verifier import VerifierResult, check_initial, verify_final

ABORT = threading.Event()  # set on Ctrl-C: running episodes stop at their next turn


@dataclass
class EpisodeConfig:
    max_turns: int = 16
    command_timeout_s: float = 10.0
    episode_timeout_s: float = 300.0
    check_initial: bool = False  # run test_initial_state.py before the agent starts
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    # The verifier's network: None follows the task (Harbor's allow_internet; off for native
    # tasks), True/False overrides it. The agent never has one unless sandbox.network is set.
    verifier_network: bool | None = None
    # When the task's verifier needs a network it cannot use, run its pytest files with the
    # image's pytest instead (recorded as verifier="offline-pytest").
    offline_verifier: bool = False
    # How a native task's test files run: "pytest", or "light" (the light verifier's harness
    # where the file allows it, pytest elsewhere; light_verifier.py)
    verifier: str = "pytest"


@dataclass
class Turn:
    index: int
    action: str  # command | done | parse_error
    command: str
    observation: str
    exit_code: int | None
    timed_out: bool
    duration_s: float
    assistant: str = ""


@dataclass
class EpisodeRecord:
    task_id: str
    reward: float = 0.0
    passed: bool = False
    graded: float = 0.0  # fraction of the verifier's checks that passed (verifier.py)
    initial_ok: bool | None = None
    turns: int = 0
    done: bool = False  # the agent said done (rather than running out of turns/time)
    timed_out: bool = False
    error: str | None = None
    verifier_exit_code: int | None = None
    verifier_output: str = ""
    initial_output: str = ""
    image: str = ""
    # Added for third-party tasks (defaults keep older readers working):
    rewards: dict[str, float] = field(default_factory=dict)  # every named reward
    verifier: str = ""  # light | pytest | test.sh | run-tests.sh | offline-pytest
    verifier_error: str | None = None  # e.g. "verifier needs network: ..."
    build_notes: list[str] = field(default_factory=list)  # what the build dropped and why
    build_s: float = 0.0
    start_s: float = 0.0
    agent_s: float = 0.0
    verify_s: float = 0.0
    duration_s: float = 0.0
    transcript: list[Turn] = field(default_factory=list)
    # training episodes with a memo (runner.terminal.memo): hit | partial | miss | audit
    memo: str = ""
    memo_mismatch: bool = False  # a replayed output or an audited verdict differed

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


def make_client(pool: int = 64) -> docker.DockerClient:
    """A client whose timeout outlasts long verifier runs and whose pool fits many threads."""
    return docker.from_env(timeout=900, max_pool_size=pool)


def initial_messages(task: Task) -> list[Message]:
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task.instruction},
    ]


def run_episode(
    task: Task,
    agent: Agent,
    *,
    client: docker.DockerClient,
    builder: ImageBuilder | None = None,
    config: EpisodeConfig | None = None,
    abort: threading.Event | None = None,
    sandboxes: SandboxPool | None = None,
    memo: EpisodeMemo | None = None,
) -> EpisodeRecord:
    """One episode; failures of the task or engine land in ``record.error`` (reward 0).

    ``abort`` (besides the process-wide :data:`ABORT`) stops this episode at its next turn,
    unverified, with ``error="aborted"``: a job cancelled by its scheduling policy.
    ``sandboxes`` (training only) lends a container of the same task that a verified reset
    brought back to the task's fresh state, and takes it back (runner.terminal.reset).
    ``memo`` (training only) answers an episode that repeats an earlier one's commands
    without a container (runner.terminal.memo).
    """
    config = config or EpisodeConfig()
    stop = _Stop(abort)
    builder = builder or ImageBuilder(client)
    record = EpisodeRecord(task_id=task.task_id)
    t0 = time.perf_counter()
    verifier_network = (
        task.allow_internet if config.verifier_network is None else config.verifier_network
    )
    try:
        built = builder.ensure(task)
        record.image, record.build_s = built.tag, built.seconds
        record.build_notes = list(built.notes)

        def lease() -> AbstractContextManager[Sandbox]:
            if sandboxes is not None:
                return sandboxes.lease(
                    client, built.tag, task, config.sandbox, verifier_network=verifier_network
                )
            return Sandbox.for_task(
                client, built.tag, task, config.sandbox, verifier_network=verifier_network
            )

        def verify(sandbox: Sandbox) -> VerifierResult:
            sandbox.ensure_running()  # a container the agent stopped is not verified
            result = verify_final(
                sandbox, task, offline_fallback=config.offline_verifier, verifier=config.verifier
            )
            if result.exit_code < 0:  # the engine could not run it: was it stopping?
                sandbox.ensure_stopped_is_named()
            return result

        prepare = getattr(agent, "prepare", None)  # e.g. a solution script uploading its folder
        # the memo stands in for the container until the episode needs a real one; an
        # episode that checks the initial state or uploads files starts one at once
        play = (
            memo.play(built.tag, task.task_id, lease, config.command_timeout_s)
            if memo is not None and not config.check_initial and not callable(prepare)
            else None
        )
        with play if play is not None else lease() as sandbox:
            if play is None:
                record.start_s = sandbox.start_s
                if config.check_initial:
                    init = check_initial(sandbox, task, verifier=config.verifier)
                    if init is not None:
                        record.initial_ok, record.initial_output = init.passed, init.output
                if callable(prepare):
                    prepare(sandbox, task)
            _agent_loop(sandbox, task, agent, config, record, stop)
            if record.timed_out:
                record.verifier_output = "[not verified: the episode timed out]"
            elif not stop():
                tv = time.perf_counter()
                result = play.verify(verify) if play is not None else verify(sandbox)
                record.verify_s = time.perf_counter() - tv
                record.passed, record.reward = result.passed, result.reward
                record.graded = result.graded
                record.verifier_exit_code, record.verifier_output = result.exit_code, result.output
                record.rewards, record.verifier = dict(result.rewards), result.verifier
                if result.error:
                    record.verifier_error = result.error
                    record.error = f"{task.task_id}: {result.error}"
            if play is not None:
                record.start_s, record.memo = play.start_s, play.kind
                record.memo_mismatch = play.mismatch
    except TerminalError as exc:
        record.error = str(exc)
    except Exception as exc:  # noqa: BLE001 - an engine failure must not kill the batch
        record.error = f"{type(exc).__name__}: {exc}"
    record.duration_s = time.perf_counter() - t0
    return record


class _Stop:
    """True once Ctrl-C (:data:`ABORT`) or the episode's own abort event is set."""

    def __init__(self, abort: threading.Event | None) -> None:
        self.abort = abort

    def __call__(self) -> bool:
        return ABORT.is_set() or (self.abort is not None and self.abort.is_set())


def _agent_loop(
    sandbox: Sandbox | MemoPlay,
    task: Task,
    agent: Agent,
    config: EpisodeConfig,
    record: EpisodeRecord,
    stop: _Stop,
) -> None:
    messages = initial_messages(task)
    t_start = time.perf_counter()
    # The task's own agent timeout (upstream config) can only shorten the episode.
    deadline = time.monotonic() + min(config.episode_timeout_s, task.limits.agent_timeout_s)
    for index in range(config.max_turns):
        if stop():
            record.error = "aborted"
            break
        reply = agent(messages)
        messages.append({"role": "assistant", "content": reply})
        record.turns = index + 1
        action = parse_action(reply)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            record.timed_out = True
            break
        if action.kind == "done":
            record.done = True
            record.transcript.append(Turn(index, "done", "", "", None, False, 0.0, reply))
            break
        if action.kind == "parse_error":
            obs, code, timed_out, dur = PARSE_ERROR_OBSERVATION, None, False, 0.0
        else:
            # An agent may ask for longer commands (a solution script runs as one command).
            per_command = getattr(agent, "command_timeout_s", None) or config.command_timeout_s
            timeout = min(per_command, remaining)
            result = sandbox.run(action.command, timeout)
            obs = observation(result.output, result.exit_code)
            code, timed_out, dur = result.exit_code, result.timed_out, result.duration_s
            if timed_out and time.monotonic() >= deadline:
                record.timed_out = True
        record.transcript.append(
            Turn(index, action.kind, action.command, obs, code, timed_out, dur, reply)
        )
        messages.append({"role": "user", "content": obs})
        if record.timed_out:
            break
    record.agent_s = time.perf_counter() - t_start


def run_episodes(
    jobs: Sequence[tuple[Task, Agent]],
    *,
    concurrency: int = 4,
    config: EpisodeConfig | None = None,
    client: docker.DockerClient | None = None,
    builder: ImageBuilder | None = None,
    image_config: ImageConfig | None = None,
    on_record: Callable[[EpisodeRecord], None] | None = None,
) -> list[EpisodeRecord]:
    """Run ``jobs`` with at most ``concurrency`` live sandboxes; records in job order."""
    client = client or make_client(pool=max(16, 2 * concurrency + 4))
    builder = builder or ImageBuilder(client, image_config)
    reaper.reap_orphans_once(client)
    pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="episode")
    try:
        futures = [
            pool.submit(run_episode, task, agent, client=client, builder=builder, config=config)
            for task, agent in jobs
        ]
        records = []
        for fut in futures:
            record = fut.result()
            if on_record is not None:
                on_record(record)
            records.append(record)
        return records
    except BaseException:
        ABORT.set()
        pool.shutdown(wait=False, cancel_futures=True)
        reaper.remove_all_live()
        raise
    finally:
        pool.shutdown(wait=True)
        ABORT.clear()
