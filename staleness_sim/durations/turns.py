"""Jobs of episodes made of turns on one shared engine (``TurnJob``): the opt-in job model
``job: {episodes, concurrency, turns, engine}``.

An episode is ``start_s``, then turns, then ``end_s`` (a sandbox start and a verifier, say).
A turn is a prefill of its prompt tokens, a decode of its reply tokens, then a command of
``command_s``. The D episodes of a job run over C sessions with continuous refill, as in
:class:`~staleness_sim.durations.jobs.EpisodicJob`, but the sessions share the worker's
engine: every session decoding at a moment advances one token per decode step, and a
step takes ``engine.step_s(batch, context)`` for the batch and context decoding then
(processor sharing). Rates change only when a session enters or leaves the decode batch,
so the simulation is an event loop over turn boundaries, not tokens. Prefills and
commands take their own time (a prefill does not stall the batch: left out).

An episode's shape is either drawn part by part from duration specs (``count``,
``prompt_tokens``, ``reply_tokens``, ``command_s``, ``start_s``, ``end_s``; a turn draws
its own sizes) or resampled jointly from a ``table`` of measured episodes (one row per
episode: its turns, its mean prompt and reply tokens and command seconds per turn, its
start and end seconds), which keeps the correlation between turn count and lengths.

Each job is simulated exactly, event by event, so the cost grows with turn boundaries. A
block of jobs' episodes is drawn first, part by part; then each job's event loop runs,
compiled where numba imports (the ``fast`` extra) and as plain Python otherwise, with the
same results.
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from staleness_sim.durations.engine_model import Engine
from staleness_sim.durations.models import make_duration
from staleness_sim.durations.moment_kernel import moment_jobs
from staleness_sim.durations.specs import DurationSpec
from staleness_sim.durations.turn_episodes import Episodes
from staleness_sim.durations.turn_kernel import turn_jobs

# A stream's jobs are drawn and simulated in chunks of _CHUNK jobs, whatever the sizes asked
# for, so job k of a seed is the same however its callers ask (and the compiled loop reads
# a chunk's drawn episodes, ~3 MB, while they are still in cache). Callers that extend a
# stream ask for stream_block = _CHUNK jobs at a time, so at most _CHUNK - 1 are simulated
# and never used.
_CHUNK = 64
_STREAMS = 32  # generators whose jobs simulated ahead are kept


class TurnTable(BaseModel):
    """Measured episodes, one per position in every column (equal lengths)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    turns: list[Annotated[int, Field(ge=1)]] = Field(min_length=1)
    prompt_tokens: list[float]  # per turn (the context a turn's prompt holds)
    reply_tokens: list[float]  # per turn
    command_s: list[float]  # per turn
    start_s: list[float] | None = None  # per episode, before the first turn
    end_s: list[float] | None = None  # per episode, after the last command
    # random: every episode resamples a row; cycle: episode j of a job takes row j mod n
    order: Literal["random", "cycle"] = "random"
    # The measured job each episode came from: then a simulated job draws one measured job
    # and replays its episodes in their order (cycling), so that what the episodes of one
    # job share (the machine's load at the time, the tasks) stays shared.
    job: list[int] | None = None

    @field_validator("prompt_tokens", "reply_tokens", "command_s", "start_s", "end_s")
    @classmethod
    def _non_negative(cls, v: list[float] | None, info) -> list[float] | None:
        if v is not None:
            bad = [x for x in v if not x >= 0]
            if bad:
                what = "token counts" if info.field_name.endswith("tokens") else "seconds"
                raise ValueError(f"{what} must be >= 0 (got {bad[0]:g})")
        return v

    @model_validator(mode="after")
    def _same_length(self) -> TurnTable:
        n = len(self.turns)
        for name in ("prompt_tokens", "reply_tokens", "command_s", "start_s", "end_s", "job"):
            v = getattr(self, name)
            if v is not None and len(v) != n:
                raise ValueError(f"{name} has {len(v)} values, turns has {n}")
        return self


class TurnsSpec(BaseModel):
    """An episode's turns: distributions part by part, or a ``table`` resampled jointly."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    count: DurationSpec | None = None  # turns per episode, rounded, at least 1
    prompt_tokens: DurationSpec | None = None
    reply_tokens: DurationSpec | None = None
    command_s: DurationSpec | None = None
    start_s: DurationSpec | None = None
    end_s: DurationSpec | None = None
    table: TurnTable | None = None
    timeout_s: Annotated[float, Field(gt=0)] | None = None  # an episode is cut at this age

    @model_validator(mode="after")
    def _one_form(self) -> TurnsSpec:
        parts = ("count", "prompt_tokens", "reply_tokens", "command_s")
        given = [p for p in (*parts, "start_s", "end_s") if getattr(self, p) is not None]
        if self.table is not None:
            if given:
                raise ValueError(f"give either table or distributions, not both ({given[0]})")
        else:
            missing = [p for p in parts if getattr(self, p) is None]
            if missing:
                raise ValueError(f"needs a table, or distributions of {', '.join(missing)}")
        return self


class DemandCurve(BaseModel):
    """The cores an engine keeps busy at each batch size (linear between, flat beyond)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    batch: list[Annotated[int, Field(ge=1)]] = Field(min_length=1)
    cores: list[Annotated[float, Field(gt=0)]] = Field(min_length=1)

    @model_validator(mode="after")
    def _aligned(self) -> DemandCurve:
        if len(self.batch) != len(self.cores):
            raise ValueError(f"batch has {len(self.batch)} values, cores {len(self.cores)}")
        if any(b <= a for a, b in zip(self.batch, self.batch[1:], strict=False)):
            raise ValueError(f"batch must increase, got {self.batch}")
        return self


class CpuShare(BaseModel):
    """The CPU a worker's sessions and engine share (a CPU run, where containers and the
    engine compete for a few cores): ``cores`` CPUs shared max-min fairly moment by moment
    among threads (:mod:`~staleness_sim.durations.moment_kernel`): every session in a timed
    part (a command, a sandbox start, a verifier, a prefill) is one thread wanting a core;
    the engine, while it decodes, is ``engine_threads`` threads (default one a core, as
    torch runs a CPU engine) wanting ``engine_demand`` cores between them (default: all
    ``cores``) or, by batch, ``engine_cores``. Each part advances at its share; the turn
    and engine times are uncontended times."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    cores: Annotated[float, Field(gt=0)]
    engine_demand: Annotated[float, Field(ge=0)] | None = None
    engine_threads: Annotated[int, Field(ge=1)] | None = None
    engine_cores: DemandCurve | None = None

    @model_validator(mode="after")
    def _one_demand(self) -> CpuShare:
        if self.engine_cores is not None and self.engine_demand is not None:
            raise ValueError("give engine_demand or engine_cores, not both")
        return self

    @property
    def engine(self) -> float:
        return self.cores if self.engine_demand is None else self.engine_demand

    @property
    def threads(self) -> int:
        """The engine's threads: one a core by default."""
        return self.engine_threads or max(1, round(self.cores))

    def demand_curve(self) -> tuple[np.ndarray, np.ndarray]:
        """The engine's demand by batch, as arrays (a constant: one point)."""
        if self.engine_cores is not None:
            curve = self.engine_cores
            return np.asarray(curve.batch, np.float64), np.asarray(curve.cores, np.float64)
        return np.ones(1), np.full(1, float(self.engine))


class _Table:
    """Episodes resampled whole from a measured table."""

    def __init__(self, t: TurnTable) -> None:
        n = len(t.turns)
        zeros = [0.0] * n
        self.turns = np.asarray(t.turns, dtype=np.int64)
        self.prompt = np.asarray(t.prompt_tokens, dtype=np.float64)
        self.reply = np.asarray(t.reply_tokens, dtype=np.float64)
        self.command = np.asarray(t.command_s, dtype=np.float64)
        self.start = np.asarray(t.start_s or zeros, dtype=np.float64)
        self.end = np.asarray(t.end_s or zeros, dtype=np.float64)
        self.cycle = t.order == "cycle"
        self.groups = None
        if t.job is not None:  # rows of each measured job, in table order
            order = np.argsort(np.asarray(t.job), kind="stable")
            _, first, size = np.unique(
                np.asarray(t.job)[order], return_index=True, return_counts=True
            )
            self.groups, self.first, self.size = order, first, size

    def block(self, rng: np.random.Generator, n: int, d: int) -> Episodes:
        """The ``d`` episodes of each of ``n`` jobs (by measured job: each job draws the
        measured job it replays, and its episodes cycle through that job's)."""
        number = np.tile(np.arange(d), n)
        if self.groups is not None:
            g = np.repeat(rng.integers(0, len(self.size), n), d)
            row = self.groups[self.first[g] + number % self.size[g]]
        elif self.cycle:
            row = number % len(self.turns)
        else:
            row = rng.integers(0, len(self.turns), n * d)
        turns = self.turns[row]
        per_turn = (np.repeat(x[row], turns) for x in (self.prompt, self.reply, self.command))
        return Episodes.of(turns, self.start[row], self.end[row], *per_turn)

    def describe(self) -> str:
        if self.groups is not None:
            return (
                f"{len(self.size)} measured jobs' {len(self.turns)} episodes, a job resampled whole"
            )
        how = "taken in order" if self.cycle else "resampled whole"
        return f"{len(self.turns)} measured episodes {how}"


class _Drawn:
    """Every part drawn from its own distribution (a turn draws its own sizes)."""

    def __init__(self, s: TurnsSpec) -> None:
        self.count = make_duration(s.count)
        self.start = make_duration(s.start_s) if s.start_s is not None else None
        self.end = make_duration(s.end_s) if s.end_s is not None else None
        self.per_turn = [make_duration(x) for x in (s.prompt_tokens, s.reply_tokens, s.command_s)]

    def block(self, rng: np.random.Generator, n: int, d: int) -> Episodes:
        """The ``d`` episodes of each of ``n`` jobs: every episode's count, start and end,
        then every turn's prompt, reply and command, each part in one call."""
        m = n * d
        turns = np.maximum(1, np.rint(self.count.sample(rng, m))).astype(np.int64)
        start, end = (
            x.sample(rng, m) if x is not None else np.zeros(m) for x in (self.start, self.end)
        )
        total = int(turns.sum())
        return Episodes.of(turns, start, end, *(x.sample(rng, total) for x in self.per_turn))

    def describe(self) -> str:
        prompt, reply, command = (x.describe() for x in self.per_turn)
        return (
            f"turns ~ {self.count.describe()}, prompt ~ {prompt}, reply ~ {reply} tokens, "
            f"command ~ {command} s"
        )


class TurnJob:
    """D episodes of turns over C sessions sharing one engine; duration = makespan."""

    def __init__(
        self,
        turns: TurnsSpec,
        engine: Engine,
        episodes: int,
        concurrency: int,
        cpu: CpuShare | None = None,
    ) -> None:
        if episodes < 1 or concurrency < 1:
            raise ValueError(
                f"episodes and concurrency must be >= 1, got {episodes}, {concurrency}"
            )
        self.spec, self.engine = turns, engine
        self.episodes, self.concurrency = int(episodes), int(concurrency)
        self.source = _Table(turns.table) if turns.table is not None else _Drawn(turns)
        self.timeout = turns.timeout_s if turns.timeout_s is not None else np.inf
        self.cpu = cpu
        # per stream (the caller's generator, by id): it, the generator its episodes are
        # drawn from, and the jobs simulated but not yet handed out
        self._ahead: dict[int, tuple[np.random.Generator, np.random.Generator, np.ndarray]] = {}

    stream_block = _CHUNK  # jobs a caller extending a stream asks for at a time

    def sample(self, rng: np.random.Generator, n_jobs: int) -> np.ndarray:
        """The next ``n_jobs`` job durations of ``rng``'s stream, simulated in chunks of
        ``_CHUNK`` jobs (one stream per generator; job k of a stream is the same whatever the
        sizes asked for, and the kept remainder is handed out first). The episodes are drawn
        from an SFC64 generator seeded from ``rng`` once, at the stream's first call: its
        normals take 18 % less time than PCG64's, and drawing is a third of the cost."""
        if id(rng) in self._ahead:
            _, draws, ahead = self._ahead.pop(id(rng))
        else:
            draws = np.random.Generator(np.random.SFC64(int(rng.integers(2**63))))
            ahead = np.empty(0)
        if len(ahead) < n_jobs:
            chunks = -(-(n_jobs - len(ahead)) // _CHUNK)
            ahead = np.concatenate([ahead, self._simulate(draws, chunks)])
        # the generator is held with its jobs, so its id cannot be reused meanwhile
        self._ahead[id(rng)] = (rng, draws, ahead[n_jobs:])
        while len(self._ahead) > _STREAMS:
            self._ahead.pop(next(iter(self._ahead)))
        return ahead[:n_jobs]

    def describe(self) -> str:
        cut = f", cut at {self.timeout:g} s" if np.isfinite(self.timeout) else ""
        cpu = ""
        if self.cpu is not None:
            want = f"{self.cpu.engine:g}"
            if self.cpu.engine_cores is not None:
                want = f"{min(self.cpu.engine_cores.cores):g}-{max(self.cpu.engine_cores.cores):g}"
            cpu = (
                f"; containers and engine (wanting {want}) share {self.cpu.cores:g} cores"
                " (moment by moment)"
            )
        return (
            f"makespan of {self.episodes} episodes over {self.concurrency} sessions sharing "
            f"one engine ({self.engine.describe()}); {self.source.describe()}{cut}{cpu}"
        )

    def _simulate(self, rng: np.random.Generator, chunks: int) -> np.ndarray:
        """Makespans of ``chunks`` chunks of ``_CHUNK`` jobs, each chunk's episodes drawn
        together (one call per part), then each job simulated exactly by its event loop
        (:mod:`~staleness_sim.durations.turn_kernel`; with a shared CPU,
        :mod:`~staleness_sim.durations.moment_kernel`)."""
        c = min(self.concurrency, self.episodes)
        if self.cpu is not None:
            simulate = moment_jobs(self.engine, self.episodes, self.timeout, c, self.cpu)
        else:
            simulate = turn_jobs(self.engine, self.episodes, self.timeout, c)
        return np.concatenate([simulate(self._chunk(rng), _CHUNK) for _ in range(chunks)])

    def _chunk(self, rng: np.random.Generator) -> Episodes:
        return self.source.block(rng, _CHUNK, self.episodes)
