"""A memo of repeated training episodes (``tasks.memo``): an episode that sends the same
commands as an earlier episode of the same task takes that episode's outputs and verdict
without starting a container.

Why it holds: every episode starts from its task's fresh initial state, so what a command
prints and what the verifier finds depend only on the commands run before it (for
commands that do not read the clock, process ids or randomness: those are what the checks
below count). The members of an ES update share tasks and sampling seeds and a small
perturbation changes few tokens, so most training episodes repeat an earlier one's
commands exactly (about three in four in the habit runs of docs/learning.md).

How: an episode plays against the memo while each command it sends is one the memo has
seen after the same earlier commands. The first unseen command starts a real container,
replays the earlier commands in it, and the episode goes on for real, adding to the memo;
a replayed command whose output or exit code differs from the memo's is a *mismatch*. An
episode that never leaves the memo takes its verdict from it, except a share ``audit`` of
them, which are replayed in full in a real container and verified there (that result is
the one used; a different verdict or output is a mismatch). Commands that timed out,
restarted the shell or hit the process limit are never memoised. Held-out evaluation never
uses the memo: only training workers hold one.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import replace

from runner.terminal.sandbox import CommandResult, Sandbox
from runner.terminal.verifier import VerifierResult

log = logging.getLogger(__name__)


class EpisodeMemo:
    """Command outputs and verdicts of training episodes, keyed by task image, task and the
    commands run so far; at most ``max_entries`` of them (the oldest go first)."""

    def __init__(self, *, audit: float = 0.1, max_entries: int = 50_000, seed: int = 0) -> None:
        if not 0.0 <= audit <= 1.0:
            raise ValueError(f"audit must be in [0, 1], not {audit}")
        self.audit = audit
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple, CommandResult | VerifierResult] = OrderedDict()
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self.counts: Counter[str] = Counter()  # episodes by kind, and mismatches

    def play(
        self,
        image: str,
        task_id: str,
        open_sandbox: Callable[[], AbstractContextManager[Sandbox]],
        command_timeout_s: float,
    ) -> MemoPlay:
        """One episode of ``task_id`` against the memo; ``open_sandbox`` starts its real
        container when one is needed."""
        return MemoPlay(self, (image, task_id), open_sandbox, command_timeout_s)

    def close(self) -> None:
        if self.counts:
            log.info("training episodes' memo: %s", dict(sorted(self.counts.items())))

    # --- the store -----------------------------------------------------------------------
    def _get(self, key: tuple) -> CommandResult | VerifierResult | None:
        with self._lock:
            return self._entries.get(key)

    def _put(self, key: tuple, value: CommandResult | VerifierResult) -> None:
        with self._lock:
            self._entries[key] = value
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def _count(self, kind: str, mismatch: bool) -> None:
        with self._lock:
            self.counts[kind] += 1
            self.counts["mismatch"] += mismatch

    def _draw_audit(self) -> bool:
        with self._lock:
            return self._rng.random() < self.audit


def _same(a: CommandResult, b: CommandResult) -> bool:
    return (a.output, a.exit_code) == (b.output, b.exit_code)


class MemoPlay:
    """One episode's commands answered by the memo until one is unseen; then a real sandbox.
    It stands in for the episode's sandbox (``run``) and gives its verdict (``verify``).

    ``kind`` says how the episode ran: ``hit`` (no container), ``partial`` (some commands
    from the memo, then a container), ``miss`` (a container from the first command),
    ``audit`` (a hit replayed and verified in a container)."""

    def __init__(
        self,
        memo: EpisodeMemo,
        key: tuple,
        open_sandbox: Callable[[], AbstractContextManager[Sandbox]],
        command_timeout_s: float,
    ) -> None:
        self.memo, self.key, self._open = memo, key, open_sandbox
        self.command_timeout_s = command_timeout_s
        self.commands: list[str] = []
        self.sandbox: Sandbox | None = None
        self.answered = 0  # commands the memo answered
        self.audited = False
        self.mismatch = False
        self._stack = ExitStack()

    def __enter__(self) -> MemoPlay:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
        self.memo._count(self.kind, self.mismatch)

    @property
    def kind(self) -> str:
        if self.audited:
            return "audit"
        if self.sandbox is None:
            return "hit"
        return "partial" if self.answered else "miss"

    @property
    def start_s(self) -> float:
        return self.sandbox.start_s if self.sandbox is not None else 0.0

    def run(self, command: str, timeout: float) -> CommandResult:
        commands = (*self.commands, command)
        if self.sandbox is None:
            known = self.memo._get((*self.key, "run", commands))
            # a command the memo saw finish within this episode's remaining time
            if isinstance(known, CommandResult) and known.duration_s < timeout:
                self.commands.append(command)
                self.answered += 1
                return replace(known, duration_s=0.0, notes=list(known.notes))
            self._materialize()
        assert self.sandbox is not None
        result = self.sandbox.run(command, timeout)
        self.commands.append(command)
        if not (result.timed_out or result.shell_restarted or result.notes):
            self.memo._put((*self.key, "run", commands), result)
        return result

    def verify(self, verify: Callable[[Sandbox], VerifierResult]) -> VerifierResult:
        """The verdict of the episode's final state: the memo's, or ``verify`` run on the
        real sandbox (always for an audit)."""
        key = (*self.key, "verify", tuple(self.commands))
        known = self.memo._get(key)
        if self.sandbox is None:
            if isinstance(known, VerifierResult) and not self.memo._draw_audit():
                return known
            self.audited = isinstance(known, VerifierResult)
            self._materialize()
        assert self.sandbox is not None
        result = verify(self.sandbox)
        if isinstance(known, VerifierResult):
            self.mismatch |= (known.passed, known.graded) != (result.passed, result.graded)
        if result.error is None and result.exit_code >= 0:
            self.memo._put(key, result)
        return result

    def _materialize(self) -> None:
        """Start the real container and replay the commands the memo answered."""
        self.sandbox = self._stack.enter_context(self._open())
        for i, command in enumerate(self.commands):
            known = self.memo._get((*self.key, "run", tuple(self.commands[: i + 1])))
            got = self.sandbox.run(command, self.command_timeout_s)
            if isinstance(known, CommandResult) and not _same(known, got):
                self.mismatch = True
