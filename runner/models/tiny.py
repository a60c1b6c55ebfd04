"""A tiny random causal LM and a locally trained tokenizer, saved like a real checkpoint.

Nothing is downloaded: the tokenizer is a byte-level BPE trained on a small built-in
corpus (so any text, shell commands included, tokenizes), the model is a Qwen2 or Llama
architecture with random seeded weights. Both are written with ``save_pretrained`` and
read back with ``AutoTokenizer`` / ``AutoModelForCausalLM``, the code path a real
checkpoint takes, so backends and tests exercise the real loading path.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

# Small, varied text: chat turns, shell commands and the agent protocol tags.
CORPUS: tuple[str, ...] = (
    "You are a helpful assistant working in a Linux terminal.",
    "Run one command at a time and read its output before the next.",
    "<command>ls -la /home/user</command>",
    "<command>cat README.md | head -n 20</command>",
    "<command>grep -rn 'error' /var/log/app.log</command>",
    "<command>mkdir -p /tmp/work && cd /tmp/work</command>",
    "<command>python3 -c 'print(2 + 2)'</command>",
    "<command>find . -name '*.py' -type f | wc -l</command>",
    "<command>echo hello world > out.txt</command>",
    "<command>sort data.csv | uniq -c | sort -nr</command>",
    "<action>done</action>",
    "The task is complete. All tests passed.",
    "The file was created and contains the expected lines.",
    "Count the lines, words and characters of the input file.",
    "Rename every file ending in .txt to end in .md instead.",
    "Print the largest number in numbers.txt on a single line.",
    "yes no true false ok error warning info debug",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000",
    "the quick brown fox jumps over the lazy dog",
    "user assistant system tool output result",
)

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# ChatML, as Qwen2.5 instruct models use.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer(vocab_size: int = 512) -> Any:
    """Train a byte-level BPE on :data:`CORPUS`; returns a PreTrainedTokenizerFast."""
    return bpe_tokenizer(CORPUS, vocab_size)


def bpe_tokenizer(texts: Iterable[str], vocab_size: int, split_pattern: str | None = None) -> Any:
    """A byte-level BPE trained on ``texts`` with the ChatML template and special tokens.

    ``split_pattern``: pieces isolated before the byte-level step (a regex; merges never
    cross them); None keeps byte-level's own GPT-2 word split.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    if split_pattern is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split_pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        chat_template=CHAT_TEMPLATE,
    )


def tiny_config(
    vocab_size: int,
    *,
    arch: str = "qwen2",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 512,
    tie_word_embeddings: bool = True,
    **extra: Any,
) -> Any:
    """A Qwen2Config or LlamaConfig of the given (tiny) size."""
    from transformers import LlamaConfig, Qwen2Config

    classes = {"qwen2": Qwen2Config, "llama": LlamaConfig}
    if arch not in classes:
        raise ValueError(f"arch must be one of {sorted(classes)}, got {arch!r}")
    return classes[arch](
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        **extra,
    )


def build_tiny_model(
    out_dir: str | os.PathLike[str],
    seed: int = 0,
    *,
    arch: str = "qwen2",
    vocab_size: int = 512,
    **config_kwargs: Any,
) -> Path:
    """Build, seed and save a tiny causal LM plus tokenizer into ``out_dir``; returns it.

    The same ``seed`` and arguments give identical weights; the global torch RNG is left
    untouched (the init runs inside ``torch.random.fork_rng``).
    """
    from transformers import AutoModelForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size)
    config = tiny_config(len(tokenizer), arch=arch, **config_kwargs)
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    config.bos_token_id = None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def load_tiny_model(
    path: str | os.PathLike[str],
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> tuple[Any, Any]:
    """Load (model, tokenizer) from ``path`` through the Auto classes, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer
