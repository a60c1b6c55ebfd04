"""Supervised warm start of a tiny model on the generated tasks' reference solutions.

A random tiny model solves nothing, so every ES cohort has equal rewards and every update
is zero. This module teaches a tiny Qwen2-architecture model the agent protocol and the
task families from demonstrations, so that ES starts where it can see differences:

- **Data**: one conversation per task of a folder's *train* split, made by the project's
  own :class:`~runner.terminal.protocol.ScriptedAgent` playing the task's reference
  solution (one command per line, one turn each, then ``<action>done</action>``) against
  the episode's own opening (:func:`~runner.terminal.episode.initial_messages`) and
  observations (:func:`~runner.terminal.protocol.observation`). The observations are the
  real ones from running the solution in a sandbox (``observations="sandbox"``), or their
  faithful record (``"record"``, the default, no container needed): every generated
  reference command writes its result to files and prints nothing, so each observation is
  ``observation("", 0)``; the tests check this record against the sandbox.
- **Rendering**: each assistant turn is rendered exactly as the ``hf`` backend renders it at
  rollout time: the prompt is :func:`~runner.backends.context.fit_prompt` of the
  conversation so far (the model's chat template, the rolling-context truncation to
  ``context_tokens - max_new_tokens``), the target is the reply's tokens and the end of
  turn. Consecutive turns whose prompts extend each other are packed into one sequence.
- **Tokenizer**: a byte-level BPE trained on the train split's conversations, digits split
  into single tokens, so file names and numbers of the instruction are copied as a few
  whole words and single digits.
- **Training**: a plain torch loop (AdamW, cosine schedule with warm-up, gradient
  clipping), loss only on assistant tokens, seeded, on CPU.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from runner.backends.context import fit_prompt
from runner.models.tiny import bpe_tokenizer, tiny_config
from runner.terminal.episode import initial_messages
from runner.terminal.protocol import SYSTEM_PROMPT, Message, ScriptedAgent, observation
from runner.terminal.task import Task

# The faithful record of a generated reference command's output: it prints nothing (its
# result goes to files) and succeeds.
SILENT = ("", 0)


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


# -- conversations ---------------------------------------------------------------------------


def solution_commands(task: Task) -> list[str]:
    """The reference solution as the scripted agent reads it: one command per line."""
    if task.solution is None:
        raise ValueError(f"{task.task_id}: no solution.sh")
    return ScriptedAgent.from_file(task.solution).commands


def demonstration(task: Task, outputs: Sequence[tuple[str, int]] | None = None) -> list[Message]:
    """The conversation of the scripted reference solution, as the episode loop builds it.

    ``outputs`` holds each command's (output, exit code); ``None`` uses the record
    (:data:`SILENT` for every command).
    """
    agent = ScriptedAgent(solution_commands(task))
    outputs = list(outputs) if outputs is not None else [SILENT] * len(agent.commands)
    messages = initial_messages(task)
    for step in [*outputs, None]:
        reply = agent(messages)
        messages.append({"role": "assistant", "content": reply})
        if step is None:
            break
        messages.append({"role": "user", "content": observation(*step)})
    return messages


def transcript_messages(task: Task, record) -> list[Message]:
    """The conversation of a finished episode (an ``EpisodeRecord``), as its agent saw it."""
    messages = initial_messages(task)
    for turn in record.transcript:
        messages.append({"role": "assistant", "content": turn.assistant})
        if turn.action != "done":
            messages.append({"role": "user", "content": turn.observation})
    return messages


def sandbox_demonstrations(
    tasks: Sequence[Task], *, client, builder, concurrency: int = 2, on_record=None
) -> tuple[dict[str, list[Message]], list[str]]:
    """Run each reference solution in its own container, one command per turn.

    Returns (conversations of the solutions that passed their verifier, task ids that did
    not pass, with the reason).
    """
    from runner.terminal.episode import EpisodeConfig, run_episodes

    jobs = [(t, ScriptedAgent(solution_commands(t))) for t in tasks]
    records = run_episodes(
        jobs,
        concurrency=concurrency,
        config=EpisodeConfig(max_turns=32),
        client=client,
        builder=builder,
        on_record=on_record,
    )
    good, bad = {}, []
    for task, rec in zip(tasks, records, strict=True):
        if rec.passed:
            good[task.task_id] = transcript_messages(task, rec)
        else:
            bad.append(f"{task.task_id}: {rec.error or 'reward ' + str(rec.reward)}")
    return good, bad


# -- tokenizer ------------------------------------------------------------------------------


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


# -- examples -------------------------------------------------------------------------------


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


def load_train_tasks(task_dir: Path) -> tuple[list[Task], list[str]]:
    """The train split's tasks that have a reference solution; (tasks, skipped with why)."""
    from runner.task_pool import split_ids
    from runner.terminal.errors import TerminalError
    from runner.terminal.loaders import load_task

    tasks, skipped = [], []
    for name in split_ids(task_dir, "train"):
        try:
            task = load_task(task_dir / name)
        except TerminalError as exc:
            skipped.append(f"{name}: {exc}")
            continue
        if task.solution is None:
            skipped.append(f"{name}: no solution.sh")
            continue
        tasks.append(task)
    return tasks, skipped


@dataclass
class TrainingData:
    """The conversations a warm start learns from, and where they came from."""

    folder: Path  # the task folder whose train split was read
    generated: dict[str, Any] | None  # how it was generated (None: given)
    tasks: list[Task]
    conversations: list[list[Message]]
    skipped: list[str]  # task ids left out, with the reason
    observations: str  # record | sandbox


def training_data(
    out: Path,
    *,
    task_dir: str | os.PathLike[str] | None,
    n_tasks: int,
    task_seed: int,
    categories: Sequence[str] | None,
    observations: str,
    show_progress: bool,
) -> TrainingData:
    """Generate the tasks into ``out/tasks`` (or read ``task_dir``) and make one
    demonstration per train task, with recorded or sandboxed observations."""
    import sys

    from tqdm import tqdm

    from runner.errors import UserError
    from runner.terminal.generator.writer import write_tasks

    if task_dir is None:
        folder = out / "tasks"
        write_tasks(folder, n_tasks, task_seed, list(categories) if categories else None)
        generated = {"n": n_tasks, "seed": task_seed, "categories": categories}
    else:
        folder, generated = Path(task_dir), None
    tasks, skipped = load_train_tasks(folder)
    if observations == "sandbox":
        from runner.rollouts import docker_client
        from runner.terminal.images import ImageBuilder

        client = docker_client()
        with tqdm(total=len(tasks), desc="solutions in sandboxes", unit="task",
                  disable=not show_progress, file=sys.stderr) as bar:  # fmt: skip
            by_id, failed = sandbox_demonstrations(
                tasks, client=client, builder=ImageBuilder(client), on_record=lambda r: bar.update()
            )
        skipped += failed
        tasks = [t for t in tasks if t.task_id in by_id]
        conversations = [by_id[t.task_id] for t in tasks]
    elif observations == "record":
        conversations = [demonstration(t) for t in tasks]
    else:
        raise ValueError(f"observations must be record or sandbox, got {observations!r}")
    if not tasks:
        raise UserError(
            f"{folder}: no train task with a reference solution ({len(skipped)} skipped)"
        )
    return TrainingData(folder, generated, tasks, conversations, skipped, observations)


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
    tokenizer = train_tokenizer(tokenizer_corpus(data.conversations), cfg.vocab_size)
    examples = [
        e
        for c in data.conversations
        for e in conversation_examples(tokenizer, c, cfg.context_tokens, cfg.max_new_tokens)
    ]
    longest = max(len(e.ids) for e in examples)
    if longest > cfg.context_tokens:
        raise UserError(f"a conversation needs {longest} tokens: raise --context")
    model = build_model(tokenizer, cfg)
    rows = train_with_progress(model, examples, cfg, tokenizer.pad_token_id, show_progress)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if rows:
        save_loss_curve(rows, out)
    summary = pretrain_summary(out, cfg, data, examples, model, tokenizer, rows, longest)
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
