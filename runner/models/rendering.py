"""Conversations as training examples: the tokenizer, and each assistant turn rendered
exactly as the ``hf`` backend renders it at rollout time.

The prompt is :func:`~runner.backends.context.fit_prompt` of the conversation so far (the
model's chat template, the rolling-context truncation to ``context_tokens -
max_new_tokens``), the target is the reply's tokens and the end of turn. Consecutive turns
whose prompts extend each other are packed into one sequence. The tokenizer is a
byte-level BPE trained on the train split's conversations, digits split into single
tokens, so file names and numbers of the instruction are copied as a few whole words and
single digits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from runner.backends.context import fit_prompt
from runner.models.tiny import bpe_tokenizer
from runner.terminal.protocol import SYSTEM_PROMPT, Message


def tokenizer_corpus(conversations: Iterable[Sequence[Message]]) -> Iterable[str]:
    yield SYSTEM_PROMPT
    for messages in conversations:
        for m in messages[1:]:
            yield m["content"]
    yield from ("<command>", "</command>", "<action>done</action>", "<think>", "</think>")


# Units BPE merges within: a run of white space, one digit, a run of ASCII letters, or a run
# of other characters. A word is the same token wherever it stands (no leading-space
# variant), so copying a name from the instruction into a command is copying tokens.
PRE_TOKENS = r"\s+|\d|[A-Za-z]+|[^\sA-Za-z\d]+"


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Any:
    """A byte-level BPE with every digit its own token; ChatML template, as ``make-tiny``."""
    return bpe_tokenizer(texts, vocab_size, split_pattern=PRE_TOKENS)


@dataclass
class Example:
    ids: list[int]
    mask: list[int]  # 1 where the token is an assistant token to learn, 0 elsewhere


def turn_examples(
    tokenizer: Any, messages: Sequence[Message], budget: int
) -> list[tuple[list[int], list[int]]]:
    """(prompt, target) per assistant turn: the prompt as the backend builds it at rollout.

    The target is the reply's tokens followed by the end-of-turn token, the tokens the
    chat template renders for that reply in the next turn's prompt.
    """
    eos = tokenizer.eos_token_id
    out = []
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prompt, _ = fit_prompt(tokenizer, messages[:k], budget)
        target = tokenizer.encode(m["content"], add_special_tokens=False) + [eos]
        out.append((prompt, target))
    return out


def pack_turns(turns: Sequence[tuple[list[int], list[int]]]) -> list[Example]:
    """Merge turns whose prompt starts with the previous turn's prompt + target."""
    examples: list[Example] = []
    ids: list[int] = []
    mask: list[int] = []
    for prompt, target in turns:
        if ids and prompt[: len(ids)] == ids:
            rest = prompt[len(ids) :]
        else:
            if ids:
                examples.append(Example(ids, mask))
            ids, mask, rest = [], [], prompt
        ids = ids + rest + target
        mask = mask + [0] * len(rest) + [1] * len(target)
    if ids:
        examples.append(Example(ids, mask))
    return examples


def conversation_examples(
    tokenizer: Any, messages: Sequence[Message], context_tokens: int, max_new_tokens: int
) -> list[Example]:
    return pack_turns(turn_examples(tokenizer, messages, context_tokens - max_new_tokens))
