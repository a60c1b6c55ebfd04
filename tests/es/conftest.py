"""Fixtures for the ES tests: an independent noise reference and a tiny saved causal LM."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest
import torch


def _reference_noise(seed: int, name: str, numel: int, block: int) -> torch.Tensor:
    """The documented stream (runner/es/noise.py docstring), re-derived here from scratch."""
    parts = []
    for b, start in enumerate(range(0, numel, block)):
        msg = (
            b"runner.es.noise/v1\0"
            + seed.to_bytes(8, "little")
            + name.encode()
            + b"\0"
            + b.to_bytes(8, "little")
        )
        s = int.from_bytes(hashlib.blake2b(msg, digest_size=8).digest(), "little") & (2**63 - 1)
        g = torch.Generator().manual_seed(s)
        parts.append(torch.randn(min(block, numel - start), generator=g, dtype=torch.float32))
    return torch.cat(parts)


@pytest.fixture(scope="session")
def ref_noise() -> Callable[[int, str, int, int], torch.Tensor]:
    return _reference_noise


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from runner.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-lm"), seed=0)


class TwoTensors(torch.nn.Module):
    """Same-shape tensors plus odd sizes, so blocks, chunks and tails are all exercised."""

    def __init__(self, dtype: torch.dtype = torch.float32, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.a = torch.nn.Parameter((0.02 * torch.randn(40, 50, generator=g)).to(dtype))
        self.b = torch.nn.Parameter((0.02 * torch.randn(40, 50, generator=g)).to(dtype))
        self.c = torch.nn.Parameter(torch.randn(777, generator=g).to(dtype))
        self.d = torch.nn.Parameter(torch.ones(3, dtype=dtype))


@pytest.fixture
def two_tensors() -> Callable[..., TwoTensors]:
    return TwoTensors
