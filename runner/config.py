"""The run configuration: YAML, dotted ``--set`` overrides, strict validation, one-line errors.

It reuses the simulator's keys where they mean the same thing (``name``, ``seed``,
``workers``, ``cohort``, ``updates``, ``policy``, ``drain_every``) and the simulator's
policy models and error messages, so a scenario and a run read alike.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from runner.es import UpdateRule, parse_staleness
from runner.es.schemes import check_scheme
from staleness_sim.cohort.config import PolicySpec
from staleness_sim.core.policies import make_policy
from staleness_sim.core.settings import (
    ConfigError,
    _Strict,
    describe_error,
    parse_assignment,
    read_yaml,
    with_overrides,
)

PosInt = Annotated[int, Field(ge=1)]
NonNegInt = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0.0)]


class ESConfig(_Strict):
    sigma: PosFloat = 0.0015
    alpha: Annotated[float, Field(ge=0.0)] = 0.00075
    shaping: Literal["zscore", "centered_rank", "raw"] = "zscore"
    antithetic: bool = False
    # what the update does with lagged results, beyond what the policy already decided
    staleness: str = "none"
    # blockseed-v1: torch's generator per block (bit-exact on one device type);
    # philox-v2: the same numbers on CPU and CUDA (docs/es.md, "Noise schemes")
    # lowrank-v1-r<R>: each matrix moves along rank-R factors drawn from the seed (EGGROLL)
    noise: str = "blockseed-v1"
    # what draws and applies the noise: auto (the fused Triton kernel for philox-v2 on
    # CUDA where Triton imports, else torch), torch or triton (docs/es.md, "Noise kernels")
    noise_kernel: Literal["auto", "torch", "triton"] = "auto"
    # a regular expression over the model's (Hugging Face) parameter names: ES perturbs
    # and updates only the parameters it matches (default: all of them)
    params: str | None = None
    # the fitness of a member: binary (its episodes' mean reward, pass/fail for native
    # tasks) or graded (the mean fraction of the verifiers' checks that passed, which
    # separates nudged members more often). Success is always the share that passed.
    reward: Literal["binary", "graded"] = "binary"

    @field_validator("params")
    @classmethod
    def _params(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value

    @field_validator("noise")
    @classmethod
    def _noise(cls, value: str) -> str:
        return check_scheme(value)

    @field_validator("staleness")
    @classmethod
    def _staleness(cls, value: str) -> str:
        return parse_staleness(value).spec()

    def optimizer_kwargs(self) -> dict[str, Any]:
        """The keys the workers' ESOptimizer takes (``reward`` concerns the controller)."""
        kwargs = self.model_dump(exclude={"reward", "noise_kernel"})
        return {**kwargs, "kernel": self.noise_kernel}

    def update_rule(self) -> UpdateRule:
        """The controller's update rule (``params`` concerns the workers' models only)."""
        return UpdateRule(
            self.sigma, self.alpha, self.shaping, self.antithetic, self.staleness, self.noise
        )


class VLLMEngineConfig(_Strict):
    """``model.vllm``: the engine of ``backend: vllm`` (runner/backends/vllm.py, docs/vllm.md)."""

    prefix_cache: Literal["off", "reset"] = "off"  # reset: on, reset at every weight change
    # GPU: default 0.5. CPU: unset, the KV cache is kv_cache_gb (default 1 GiB per engine)
    gpu_memory_utilization: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    kv_cache_gb: Annotated[float, Field(gt=0.0)] | None = None
    max_num_seqs: PosInt = 256
    enforce_eager: bool | None = None  # default: True on CPU, False on CUDA
    self_test: bool = True
    extra: dict[str, Any] = {}  # further AsyncEngineArgs fields


class ModelConfig(_Strict):
    backend: Literal["hf", "vllm"] = "hf"
    path: str
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"  # cpu | cuda | cuda:N; with several workers on cuda, one GPU each
    max_batch: PosInt = 64  # rows of one batched forward pass
    batch_window_s: Annotated[float, Field(ge=0.0)] = 0.05  # how long a batch waits to fill
    # hf: turn (a batch decodes until its last reply is done) or continuous (a turn joins
    # the running batch at the next token; no window, no turn barrier). vllm: always
    # continuous, in the engine.
    batching: Literal["turn", "continuous"] = "continuous"
    # hf: a session's next turn reuses the key/value states of its previous turn (and every
    # session the system prompt's), within one set of weights: cleared at every perturb,
    # restore and update. Off by default: reused states equal recomputed ones only to
    # rounding, so replies are reproducible only without it (docs/runner.md).
    prefix_reuse: bool = False
    vllm: VLLMEngineConfig = VLLMEngineConfig()  # backend vllm only (no batching window)

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        kind, _, index = value.partition(":")
        if (
            kind not in ("cpu", "cuda")
            or (index and not index.isdigit())
            or (kind == "cpu" and index)
        ):
            raise ValueError("must be cpu, cuda or cuda:N")
        return value


class SamplingConfig(_Strict):
    temperature: Annotated[float, Field(ge=0.0)] = 0.6
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    max_new_tokens: PosInt = 2048  # per turn
    stop: list[str] = ["</command>", "</action>"]  # generation ends after one of these


class GenerateTasks(_Strict):
    n: PosInt
    seed: NonNegInt = 0
    categories: list[str] | None = None


class SignalBand(_Strict):
    """``tasks.signal``: train only on tasks whose predicted success (the probability of the
    reference episode under the run's model, runner/models/task_scores.py) is in [min, max]."""

    min: Annotated[float, Field(ge=0.0, le=1.0)] = 0.1
    max: Annotated[float, Field(ge=0.0, le=1.0)] = 0.9

    @model_validator(mode="after")
    def _ordered(self) -> SignalBand:
        if self.min >= self.max:
            raise ValueError(f"min ({self.min:g}) must be below max ({self.max:g})")
        return self


class EpisodeMemoConfig(_Strict):
    """``tasks.memo``: training episodes that repeat an earlier one's commands on the same
    task take its outputs and verdict without a container (runner/terminal/memo.py)."""

    # the share of such episodes replayed and verified in a real container and compared
    audit: Annotated[float, Field(ge=0.0, le=1.0)] = 0.1
    max_entries: PosInt = 50_000  # memoised commands and verdicts kept per worker


class TasksConfig(_Strict):
    dir: str | None = None  # a folder of tasks (native or Harbor layout)
    generate: GenerateTasks | None = None  # or generated into the run directory
    split: str = "train"  # train | validation | test (files <split>.txt), or all
    # How native tasks' test files run, in training and evaluation alike: light (the light
    # verifier, equal to pytest on every checked file; pytest where a file needs it) or pytest
    verifier: Literal["light", "pytest"] = "light"
    # Training episodes reuse a container of the same task after a verified reset
    # (runner/terminal/reset.py); evaluation never does
    reuse_containers: bool = False
    # Training episodes that repeat an earlier one's commands are answered by a memo
    # (true, or {audit, max_entries}); evaluation never is
    memo: EpisodeMemoConfig | None = None
    # train only on the split's tasks with predicted success in a band (None: every task)
    signal: SignalBand | None = None

    @field_validator("memo", mode="before")
    @classmethod
    def _memo_switch(cls, value: object) -> object:
        return {} if value is True else None if value is False else value

    @model_validator(mode="after")
    def _one_source(self) -> TasksConfig:
        if (self.dir is None) == (self.generate is None):
            raise ValueError("give exactly one of tasks.dir and tasks.generate")
        return self


class EvalConfig(_Strict):
    split: str = "test"
    seeds: list[NonNegInt] = [42, 43, 44]
    max_tasks: PosInt | None = None  # evaluate on the first K tasks of the split only
    # evaluate version 0 (the base model) during training too; off where one evaluation of
    # the base serves many runs (`es-runner eval --model`: the same episodes, same seeds)
    initial: bool = True


TrackerName = Literal["console", "jsonl", "tensorboard", "wandb", "mlflow"]


class LoggingConfig(_Strict):
    """``logging:``: where live metrics go (runner/tracking/, the table in docs/metrics.md)."""

    to: list[TrackerName] = ["jsonl"]
    project: str | None = None  # the W&B project / MLflow experiment (default: the run's name)

    @field_validator("to")
    @classmethod
    def _once_each(cls, value: list[str]) -> list[str]:
        twice = sorted({v for v in value if value.count(v) > 1})
        if twice:
            raise ValueError(f"names {', '.join(twice)} more than once")
        return value


class RunConfig(_Strict):
    name: str = "run"
    seed: NonNegInt = 0
    workers: PosInt
    cohort: PosInt
    updates: PosInt
    policy: PolicySpec
    drain_every: NonNegInt = 0
    es: ESConfig = ESConfig()
    model: ModelConfig
    sampling: SamplingConfig = SamplingConfig()
    tasks: TasksConfig
    episodes_per_job: PosInt  # D
    concurrency: PosInt  # C: sessions of one job in flight at once
    max_turns: PosInt = 16
    context_tokens: Annotated[int, Field(ge=2)] = 16384
    command_timeout_s: PosFloat = 10.0
    episode_timeout_s: PosFloat = 300.0
    checkpoint_every: NonNegInt = 1  # 0: only at the end
    eval_every: NonNegInt = 0  # 0: no evaluation during training
    eval: EvalConfig = EvalConfig()
    # where workers run: in this process, or as Ray actors (runner/workers/); the key was
    # called `backend` before (still read, see RENAMED)
    placement: Literal["local", "ray"] = "local"
    # true: members dispatched at one version share task batch and sampling seed (as
    # published); pair: the two members of an antithetic pair share them, each pair its own
    # (more distinct tasks per update); false: every member its own
    common_random_numbers: bool | Literal["pair"] = True
    logging: LoggingConfig = LoggingConfig()  # live metrics: console, jsonl, tensorboard, ...

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        if self.context_tokens <= self.sampling.max_new_tokens:
            raise ValueError(
                f"context_tokens ({self.context_tokens}) must exceed sampling.max_new_tokens "
                f"({self.sampling.max_new_tokens})"
            )
        return self

    @field_validator("common_random_numbers", mode="before")
    @classmethod
    def _crn(cls, value: Any, info: ValidationInfo) -> Any:
        if not (isinstance(value, bool) or value == "pair"):
            raise ValueError("must be true, false or pair")
        es = info.data.get("es")
        if value == "pair" and es is not None and not es.antithetic:
            raise ValueError("pair needs es.antithetic: true (a pair is an antithetic pair)")
        return value


# Top-level keys renamed (old: new). An old name keeps working for now: a recorded run
# reads silently, a config file or --set says the new name in one line (load_run_config).
RENAMED = {"backend": "placement"}


def _renamed(data: dict[str, Any], source: str) -> tuple[dict[str, Any], list[str]]:
    """``data`` with each old top-level key under its new name, and the old names used."""
    old = [k for k in RENAMED if k in data]
    for key in old:
        if RENAMED[key] in data:
            raise ConfigError(
                f"{source}: {key}: renamed to {RENAMED[key]}; give {RENAMED[key]} only"
            )
    return {RENAMED.get(k, k): v for k, v in data.items()}, old


def validate_run(data: dict[str, Any], source: str = "config") -> RunConfig:
    data, _ = _renamed(data, source)
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{source}: {describe_error(e, data, RunConfig)}") from None
    try:  # the policy's own checks (e.g. a delay fraction that leaves no fresh result)
        make_policy(config.policy, config.cohort, config.drain_every)
    except ValueError as e:
        raise ConfigError(f"{source}: policy: {e}") from None
    return config


def load_run_config(path: str | Path, sets: list[str] | tuple[str, ...] = ()) -> RunConfig:
    data, old = _renamed(read_yaml(path), str(path))
    overrides, old_set = _renamed(dict(parse_assignment(s) for s in sets), "--set")
    for key in dict.fromkeys(old + old_set):
        print(
            f"{path}: '{key}' is now called '{RENAMED[key]}' (the old name works for now)",
            file=sys.stderr,
        )
    return validate_run(with_overrides(data, overrides), str(path))


def resolve_paths(config: RunConfig, base: Path | None = None) -> RunConfig:
    """The config with relative model and task paths resolved against ``base`` (default:
    the working directory) and made absolute; absolute ones stay as they are."""
    base = base or Path.cwd()
    return _map_paths(config, lambda p: str((base / p).resolve()))


def repository_root(path: str | Path) -> Path | None:
    """The work tree (a folder holding ``.git``, a folder or a worktree's file) that holds
    ``path``, or None."""
    here = Path(path).resolve()
    for folder in (here, *here.parents):
        if (folder / ".git").exists():
            return folder
    return None


def run_base(run_dir: str | Path) -> Path:
    """What a run directory's relative paths are relative to: the root of the repository
    that holds it, or else the run directory itself."""
    return repository_root(run_dir) or Path(run_dir).resolve()


def portable_path(path: str, run_dir: str | Path) -> str:
    """``path`` as a run directory records it: relative to the repository that holds the
    run (so a clone elsewhere finds it) when it lies inside it, else absolute."""
    root = repository_root(run_dir)
    full = Path(path).resolve()
    if root is not None and full.is_relative_to(root):
        return full.relative_to(root).as_posix()
    return str(full)


def portable_paths(config: RunConfig, run_dir: str | Path) -> RunConfig:
    """The config as a run directory records it (:func:`portable_path` of each path)."""
    return _map_paths(config, lambda p: portable_path(p, run_dir))


def run_paths(config: RunConfig, run_dir: str | Path) -> RunConfig:
    """A run directory's recorded config with its paths made absolute (:func:`run_base`)."""
    return resolve_paths(config, run_base(run_dir))


def _map_paths(config: RunConfig, fn) -> RunConfig:
    data = config.model_dump(mode="json")
    data["model"]["path"] = fn(config.model.path)
    if config.tasks.dir is not None:
        data["tasks"]["dir"] = fn(config.tasks.dir)
    return RunConfig.model_validate(data)


def config_yaml(config: RunConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
