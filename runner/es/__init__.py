"""Evolution strategies in torch for LLM-sized models.

Seeded noise regenerated per tensor (:mod:`runner.es.noise`), perturb / restore around an
fp32 master, fp32 updates, fitness shaping, staleness rules and an update log from which
any version is rebuilt. See ``docs/es.md``.
"""

from runner.es.checkpoint import (
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
    write_checkpoint,
)
from runner.es.noise import (
    DEFAULT_BLOCK,
    LEGACY_SCHEME,
    NOISE_SCHEME,
    NOISE_SCHEMES,
    PHILOX_SCHEME,
    block_seed,
    fill_noise,
    philox4x32_10,
    philox_key,
    philox_uniforms,
    philox_words,
    tensor_noise,
)
from runner.es.optimizer import DEFAULT_CHUNK, ESOptimizer
from runner.es.records import Result, UpdateRecord
from runner.es.shaping import SHAPINGS, centered_rank, zscore
from runner.es.staleness import DropOver, LagWeighted, NoStaleness, parse_staleness
from runner.es.update_rule import UpdateRule

__all__ = [
    "DEFAULT_BLOCK",
    "DEFAULT_CHUNK",
    "LEGACY_SCHEME",
    "NOISE_SCHEME",
    "NOISE_SCHEMES",
    "PHILOX_SCHEME",
    "SHAPINGS",
    "DropOver",
    "ESOptimizer",
    "LagWeighted",
    "NoStaleness",
    "Result",
    "UpdateRecord",
    "UpdateRule",
    "block_seed",
    "centered_rank",
    "fill_noise",
    "load_checkpoint",
    "parse_staleness",
    "philox4x32_10",
    "philox_key",
    "philox_uniforms",
    "philox_words",
    "read_checkpoint",
    "save_checkpoint",
    "tensor_noise",
    "write_checkpoint",
    "zscore",
]
