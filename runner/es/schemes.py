"""The names of the noise schemes and the range of a seed: what a record is checked
against, without torch (the noise itself is :mod:`runner.es.noise`)."""

from __future__ import annotations

import re

LEGACY_SCHEME = "blockseed-v1"  # what a checkpoint that records no scheme was made with
PHILOX_SCHEME = "philox-v2"
NOISE_SCHEMES = (LEGACY_SCHEME, PHILOX_SCHEME)
NOISE_SCHEME = LEGACY_SCHEME  # the default for new optimizers
# "lowrank-v1-r<R>": per matrix, rank-R factors from philox-v2 streams (runner/es/noise.py)
LOWRANK_SCHEME = "lowrank-v1-r<R>"
SEED_LIMIT = 2**63


def check_seed(seed: int) -> int:
    """Return ``seed`` as an int, or raise ValueError if it is not in ``[0, 2**63)``."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        try:
            as_int = int(seed)
        except (TypeError, ValueError):
            raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}") from None
        if as_int != seed:
            raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}")
        seed = as_int
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed must be an integer in [0, 2**63), got {seed}")
    return seed


def lowrank_rank(scheme: str) -> int | None:
    """R of a low-rank scheme ``lowrank-v1-r<R>`` (R >= 1); None for any other name."""
    found = re.fullmatch(r"lowrank-v1-r([1-9][0-9]*)", scheme) if isinstance(scheme, str) else None
    return int(found.group(1)) if found else None


def check_scheme(scheme: str) -> str:
    """Return ``scheme`` if it names a noise scheme, else raise ValueError listing them."""
    if scheme not in NOISE_SCHEMES and lowrank_rank(scheme) is None:
        raise ValueError(
            f"noise must be one of {', '.join(NOISE_SCHEMES)}, {LOWRANK_SCHEME} (R >= 1); "
            f"got {scheme!r}"
        )
    return scheme
