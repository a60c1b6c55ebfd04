"""Supervised warm start of a tiny model on the generated tasks' reference solutions.

A random tiny model solves nothing, so every ES cohort has equal rewards and every update
is zero. This module teaches a tiny Qwen2-architecture model the agent protocol and the
task families from demonstrations, so that ES starts where it can see differences:

- **Data** (:mod:`runner.models.demonstrations`): one conversation per task of a folder's
  *train* split, the reference solution played by the scripted agent; optionally a fixed
  share of them carrying one shared wrong habit whatever the instruction
  (``habit``, ``habit_share``).
- **Rendering** and **tokenizer** (:mod:`runner.models.rendering`): each assistant turn as
  the ``hf`` backend renders it at rollout time; a byte-level BPE with single digits.
- **Training**: a plain torch loop (AdamW, cosine schedule with warm-up, gradient
  clipping), loss on assistant tokens (plus ``prompt_loss_weight`` on the others), seeded,
  on CPU; from a new model, or continuing an existing model folder (``init_from``: its
  weights and its tokenizer).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from runner.models.demonstrations import (
    SILENT,
    TrainingData,
    demonstration,
    load_train_tasks,
    sandbox_demonstrations,
    solution_commands,
    training_data,
    transcript_messages,
    with_habit,
)
from runner.models.rendering import (
    PRE_TOKENS,
    Example,
    conversation_examples,
    pack_turns,
    tokenizer_corpus,
    train_tokenizer,
    turn_examples,
)
from runner.models.tiny import tiny_config

# the names this module held before the split, still imported from here
__all__ = [
    "SILENT", "Example", "PRE_TOKENS", "PretrainConfig", "TrainingData", "conversation_examples",
    "demonstration", "load_train_tasks", "pack_turns", "pretrain_model", "sandbox_demonstrations",
    "solution_commands", "tokenizer_corpus", "train_tokenizer", "training_data",
    "transcript_messages", "turn_examples",
]  # fmt: skip


@dataclass
class PretrainConfig:
    """Everything that decides the warm-started model (written to ``pretrain.json``)."""

    steps: int = 1500
    batch_size: int = 16
    lr: float = 3e-3
    warmup: int = 30
    weight_decay: float = 0.01
    clip: float = 1.0
    seed: int = 0
    # weight of the loss on the conversation's other tokens (instructions, observations):
    # they repeat the task's names, which teaches the model to copy names from the prompt
    prompt_loss_weight: float = 1.0
    # tokenizer and model
    vocab_size: int = 1024
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    # the rollout-time rendering the conversations are cut to (the runner config's
    # context_tokens and sampling.max_new_tokens)
    context_tokens: int = 1024
    max_new_tokens: int = 160
    extra: dict[str, Any] = field(default_factory=dict)
    # continue an existing model folder (its weights and tokenizer; the architecture above
    # is then the folder's) instead of a new model
    init_from: str | None = None
    # a share of the demonstrations carrying one shared wrong habit (demonstrations.HABITS)
    habit: str | None = None
    habit_share: float = 0.0


# -- model and training ---------------------------------------------------------------------


def build_model(tokenizer: Any, cfg: PretrainConfig) -> Any:
    from transformers import AutoModelForCausalLM

    config = tiny_config(
        len(tokenizer),
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.context_tokens,
        **cfg.extra,
    )
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    config.bos_token_id = None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        # Eager attention trains 3-4x faster than SDPA on CPU at these sizes (measured).
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.float32, attn_implementation="eager"
        )
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"
)  # fmt: skip


def start_from(folder: str | os.PathLike[str], cfg: PretrainConfig) -> tuple[Any, Any, Any]:
    """An existing model folder's (model, tokenizer), and ``cfg`` with its architecture."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    )
    c = model.config
    cfg = replace(
        cfg,
        vocab_size=len(tokenizer),
        hidden_size=c.hidden_size,
        num_layers=c.num_hidden_layers,
        num_heads=c.num_attention_heads,
        num_kv_heads=c.num_key_value_heads,
        intermediate_size=c.intermediate_size,
    )
    return model, tokenizer, cfg


def weights_hash(model: Any) -> str:
    """The ES weights hash (what a run's checkpoint names as its base)."""
    from runner.es import ESOptimizer

    opt = ESOptimizer(model)
    try:
        return str(opt.base_hash)
    finally:
        opt.close()


def collate(batch: Sequence[Example], pad: int) -> tuple[torch.Tensor, ...]:
    width = max(len(e.ids) for e in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    attn = torch.zeros((len(batch), width), dtype=torch.long)
    loss_mask = torch.zeros((len(batch), width), dtype=torch.float32)
    for i, e in enumerate(batch):
        n = len(e.ids)
        ids[i, :n] = torch.tensor(e.ids)
        attn[i, :n] = 1
        loss_mask[i, :n] = torch.tensor(e.mask, dtype=torch.float32)
    return ids, attn, loss_mask


def masked_loss(model: Any, ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor):
    """Mean cross-entropy of (the assistant tokens, the other tokens), each token predicted
    from the ones before it; padding counts in neither."""
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    target, mine = ids[:, 1:], mask[:, 1:]
    other = attn[:, 1:].float() - mine
    ce = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none"
    ).view_as(mine)
    return (
        (ce * mine).sum() / mine.sum().clamp(min=1.0),
        (ce * other).sum() / other.sum().clamp(min=1.0),
    )


def lr_at(step: int, cfg: PretrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def batches(examples: Sequence[Example], size: int, seed: int) -> Iterable[list[Example]]:
    """Endless shuffled epochs; each batch's rows have similar lengths (less padding)."""
    rng = random.Random(seed)
    while True:
        order = list(range(len(examples)))
        rng.shuffle(order)
        chunks = [order[i : i + size * 8] for i in range(0, len(order), size * 8)]
        out = []
        for chunk in chunks:
            chunk.sort(key=lambda i: len(examples[i].ids))
            out += [chunk[i : i + size] for i in range(0, len(chunk), size)]
        rng.shuffle(out)
        for b in out:
            yield [examples[i] for i in b]


def train(
    model: Any,
    examples: Sequence[Example],
    cfg: PretrainConfig,
    pad: int,
    *,
    on_step: Callable[[int, float], None] | None = None,
) -> list[dict[str, float]]:
    """Train in place; returns one row per step (step, loss, lr, tokens, seconds)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
        no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
        opt = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": cfg.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=cfg.lr,
            betas=(0.9, 0.98),
        )
        model.train()
        rows = []
        t0 = time.perf_counter()
        stream = batches(examples, cfg.batch_size, cfg.seed)
        for step in range(cfg.steps):
            batch = next(stream)
            lr = lr_at(step, cfg)
            for g in opt.param_groups:
                g["lr"] = lr
            ids, attn, mask = collate(batch, pad)
            loss, prompt_loss = masked_loss(model, ids, attn, mask)
            opt.zero_grad(set_to_none=True)
            (loss + cfg.prompt_loss_weight * prompt_loss).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            opt.step()
            value = float(loss.detach())
            rows.append(
                {
                    "step": step + 1,
                    "loss": value,
                    "prompt_loss": float(prompt_loss.detach()),
                    "lr": lr,
                    "tokens": int(attn.sum()),
                    "seconds": time.perf_counter() - t0,
                }
            )
            if on_step is not None:
                on_step(step + 1, value)
        model.eval()
    return rows


def save_loss_curve(rows: Sequence[dict[str, float]], out: Path) -> None:
    """``loss.csv`` (one row per step) and ``loss.png`` (the curve and its moving average)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ["step", "loss", "prompt_loss", "lr", "tokens", "seconds"]
    lines = [",".join(keys)] + [
        ",".join(f"{r[k]:.6g}" if isinstance(r[k], float) else str(r[k]) for k in keys)
        for r in rows
    ]
    (out / "loss.csv").write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    steps = [r["step"] for r in rows]
    losses = [r["loss"] for r in rows]
    ax.plot(steps, losses, lw=0.8, alpha=0.5, label="loss (per step)")
    k = max(1, len(rows) // 30)
    if len(rows) > k:
        smooth = [sum(losses[max(0, i - k + 1) : i + 1]) / len(losses[max(0, i - k + 1) : i + 1])
                  for i in range(len(losses))]  # fmt: skip
        ax.plot(steps, smooth, lw=1.5, label=f"moving average ({k})")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy of assistant tokens")
    ax.set_title("warm start on reference solutions (train split)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "loss.png")
    plt.close(fig)


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def config_dict(cfg: PretrainConfig) -> dict[str, Any]:
    return asdict(cfg)


# -- the command ----------------------------------------------------------------------------


def train_with_progress(
    model: Any, examples: Sequence[Example], cfg: PretrainConfig, pad: int, show: bool
) -> list[dict[str, float]]:
    """:func:`train` behind a progress bar (the last step's loss beside it)."""
    import sys

    from tqdm import tqdm

    with tqdm(total=cfg.steps, desc="pretrain", unit="step", disable=not show,
              dynamic_ncols=True, file=sys.stderr,
              mininterval=0.5 if sys.stderr.isatty() else 10.0) as bar:  # fmt: skip

        def on_step(step: int, loss: float) -> None:
            bar.update()
            bar.set_postfix_str(f"loss {loss:.3f}", refresh=False)

        return train(model, examples, cfg, pad, on_step=on_step)


def pretrain_model(
    out: str | os.PathLike[str],
    cfg: PretrainConfig,
    *,
    task_dir: str | os.PathLike[str] | None = None,
    n_tasks: int = 700,
    task_seed: int = 0,
    categories: Sequence[str] | None = None,
    observations: str = "record",
    show_progress: bool = False,
) -> dict[str, Any]:
    """Generate (or read) tasks, warm-start a model on the train split, save it into ``out``.

    Returns what ``pretrain.json`` holds; its ``result`` entry is the one-line summary.
    """
    from runner.errors import UserError

    t_start = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = training_data(
        out, task_dir=task_dir, n_tasks=n_tasks, task_seed=task_seed, categories=categories,
        observations=observations, show_progress=show_progress,
    )  # fmt: skip
    if cfg.habit is not None:
        data = with_habit(data, cfg.habit, cfg.habit_share, cfg.seed)
    start = None
    if cfg.init_from is not None:
        model, tokenizer, cfg = start_from(cfg.init_from, cfg)
        start = {"dir": cfg.init_from, "weights_hash": weights_hash(model)}
    else:
        tokenizer = train_tokenizer(tokenizer_corpus(data.conversations), cfg.vocab_size)
    examples = [
        e
        for c in data.conversations
        for e in conversation_examples(tokenizer, c, cfg.context_tokens, cfg.max_new_tokens)
    ]
    longest = max(len(e.ids) for e in examples)
    if longest > cfg.context_tokens:
        raise UserError(f"a conversation needs {longest} tokens: raise --context")
    if start is None:
        model = build_model(tokenizer, cfg)
    elif longest > model.config.max_position_embeddings:
        raise UserError(
            f"a conversation needs {longest} tokens; {cfg.init_from} takes "
            f"{model.config.max_position_embeddings}"
        )
    rows = train_with_progress(model, examples, cfg, tokenizer.pad_token_id, show_progress)
    model.save_pretrained(out)
    if start is None:
        tokenizer.save_pretrained(out)
    else:  # the folder's own files, byte for byte (a reload may re-serialise them)
        for name in TOKENIZER_FILES:
            if (Path(cfg.init_from) / name).is_file():
                shutil.copyfile(Path(cfg.init_from) / name, out / name)
    if rows:
        save_loss_curve(rows, out)
    summary = pretrain_summary(out, cfg, data, examples, model, tokenizer, rows, longest)
    summary["data"]["from"], summary["data"]["habit"] = start, data.habit
    summary["result"]["weights_hash"] = weights_hash(model)
    summary["result"]["seconds"] = round(time.perf_counter() - t_start, 1)
    write_json(out / "pretrain.json", summary)
    return summary


def pretrain_summary(
    out: Path,
    cfg: PretrainConfig,
    data: TrainingData,
    examples: Sequence[Example],
    model: Any,
    tokenizer: Any,
    rows: Sequence[dict[str, float]],
    longest: int,
) -> dict[str, Any]:
    """What ``pretrain.json`` holds (its ``result``: the one-line summary)."""
    params = sum(p.numel() for p in model.parameters())
    tail = [r["loss"] for r in rows[-max(1, len(rows) // 10) :]]
    result = {
        "dir": str(out),
        "tasks": str(data.folder),
        "train_tasks": len(data.tasks),
        "parameters": params,
        "vocab": len(tokenizer),
        "steps": cfg.steps,
        "first_loss": rows[0]["loss"] if rows else None,
        "last_loss": rows[-1]["loss"] if rows else None,
        "last_loss_mean": sum(tail) / len(tail) if tail else None,
        "train_s": round(rows[-1]["seconds"] if rows else 0.0, 1),
        "seconds": None,  # the whole command's, set by the caller
    }
    return {
        "result": result,
        "config": config_dict(cfg),
        "data": {
            "task_dir": str(data.folder),
            "generated": data.generated,
            "split": "train",
            "observations": data.observations,
            "conversations": len(data.conversations),
            "examples": len(examples),
            "tokens": sum(len(e.ids) for e in examples),
            "assistant_tokens": sum(sum(e.mask) for e in examples),
            "longest_example": longest,
            "skipped": data.skipped,
            "train_task_ids": sorted(t.task_id for t in data.tasks),
        },
        "model": {
            "architecture": type(model).__name__,
            "parameters": params,
            "layers": cfg.num_layers,
            "hidden": cfg.hidden_size,
            "heads": cfg.num_heads,
            "kv_heads": cfg.num_kv_heads,
            "intermediate": cfg.intermediate_size,
            "context": cfg.context_tokens,
        },
        "tokenizer": {"kind": "byte-level BPE", "pre_tokens": PRE_TOKENS, "vocab": len(tokenizer)},
    }
