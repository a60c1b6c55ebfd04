"""What every backend ends a turn with: sampling settings, the context budget, stop and EOS.

Written once for ``hf`` and ``vllm`` so that both read a run config the same way: the
same checks, the same stop strings, the same end-of-sequence ids (the generation config's
and the tokenizer's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TurnSettings:
    temperature: float
    top_p: float
    max_new_tokens: int
    context_tokens: int
    stop: tuple[str, ...]  # non-empty stop strings
    eos: frozenset[int]  # token ids that end a reply

    @property
    def prompt_budget(self) -> int:
        """Tokens a prompt may take (the rolling context keeps room for the reply)."""
        return self.context_tokens - self.max_new_tokens

    @classmethod
    def build(
        cls,
        tokenizer: Any,
        model_eos: int | Sequence[int] | None,
        *,
        temperature: float = 0.6,
        top_p: float = 1.0,
        max_new_tokens: int = 2048,
        context_tokens: int = 16384,
        stop: Sequence[str] = ("</command>", "</action>"),
    ) -> TurnSettings:
        """``model_eos``: the generation config's ``eos_token_id`` (one id, a list, or None).
        The keywords are those every backend takes (the run config's ``sampling`` and
        ``context_tokens``); the defaults are the config's."""
        if context_tokens <= max_new_tokens:
            raise ValueError(
                f"context_tokens ({context_tokens}) must exceed the tokens generated per turn "
                f"({max_new_tokens})"
            )
        ids = list(model_eos) if isinstance(model_eos, (list, tuple)) else [model_eos]
        eos = frozenset(int(e) for e in (*ids, tokenizer.eos_token_id) if e is not None)
        return cls(
            temperature, top_p, max_new_tokens, context_tokens, tuple(s for s in stop if s), eos
        )
