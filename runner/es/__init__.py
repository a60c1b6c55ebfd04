"""Evolution strategies for LLM-sized models, in two parts (as evosax keeps the strategy
apart from the kernels):

* the rule, torch-free: update records (:mod:`~runner.es.records`), fitness shaping
  (:mod:`~runner.es.shaping`), staleness rules (:mod:`~runner.es.staleness`), the update
  rule that turns a cohort into a record (:mod:`~runner.es.update_rule`), the noise
  schemes' names and seed checks (:mod:`~runner.es.schemes`) and the checkpoint document
  (:mod:`~runner.es.checkpoint_file`). A coordinator that holds no model (the runner's
  orchestrator) needs only these, and imports no torch;
* the kernels, torch: seeded noise regenerated per tensor (:mod:`~runner.es.noise`),
  perturb / restore around an fp32 master and the fp32 updates
  (:mod:`~runner.es.optimizer`), saving and loading an optimizer
  (:mod:`~runner.es.checkpoint`).

The torch part is imported here on first use of one of its names (``from runner.es
import ESOptimizer`` imports torch; ``from runner.es import UpdateRule`` does not). The
torch-free modules never import the torch ones. See ``docs/es.md``.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from runner.es.checkpoint_file import read_checkpoint, write_checkpoint
from runner.es.records import Result, UpdateRecord
from runner.es.schemes import LEGACY_SCHEME, NOISE_SCHEME, NOISE_SCHEMES, PHILOX_SCHEME
from runner.es.shaping import SHAPINGS, centered_rank, zscore
from runner.es.staleness import DropOver, LagWeighted, NoStaleness, parse_staleness
from runner.es.update_rule import UpdateRule

# the torch part: name -> module, imported on first access
_TORCH_NAMES = {
    "load_checkpoint": "runner.es.checkpoint",
    "save_checkpoint": "runner.es.checkpoint",
    "DEFAULT_BLOCK": "runner.es.noise",
    "block_seed": "runner.es.noise",
    "fill_noise": "runner.es.noise",
    "philox4x32_10": "runner.es.noise",
    "philox_key": "runner.es.noise",
    "philox_uniforms": "runner.es.noise",
    "philox_words": "runner.es.noise",
    "tensor_noise": "runner.es.noise",
    "DEFAULT_CHUNK": "runner.es.optimizer",
    "ESOptimizer": "runner.es.optimizer",
}

if TYPE_CHECKING:  # what the lazy names are, for type checkers and editors
    from runner.es.checkpoint import load_checkpoint, save_checkpoint
    from runner.es.noise import (
        DEFAULT_BLOCK,
        block_seed,
        fill_noise,
        philox4x32_10,
        philox_key,
        philox_uniforms,
        philox_words,
        tensor_noise,
    )
    from runner.es.optimizer import DEFAULT_CHUNK, ESOptimizer


def __getattr__(name: str) -> Any:
    module = _TORCH_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'runner.es' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


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
