"""Generation backends behind one interface (:class:`GenerationBackend`).

``hf`` (transformers, CPU or GPU) is built in. GPU-only backends (``vllm``, docs/vllm.md)
are imported lazily by :func:`make_backend`, so nothing here imports them on a machine
without a GPU.
"""

from __future__ import annotations

from typing import Any

from runner.backends.base import Generation, GenerationBackend, GenerationRequest
from runner.backends.batching import SessionBatcher

BACKENDS = ("hf", "vllm")

__all__ = [
    "BACKENDS",
    "Generation",
    "GenerationBackend",
    "GenerationRequest",
    "SessionBatcher",
    "make_backend",
]


def make_backend(kind: str, **kwargs: Any) -> GenerationBackend:
    """Build the backend named ``kind`` (``model.backend`` in a run config)."""
    if kind == "hf":
        from runner.backends.hf import HFBackend

        return HFBackend(**kwargs)
    if kind == "vllm":  # imports vLLM only now; without it, one line says what to install
        from runner.backends.vllm import VLLMBackend

        return VLLMBackend(**kwargs)
    raise ValueError(f"model.backend must be one of {', '.join(BACKENDS)}, got {kind!r}")
