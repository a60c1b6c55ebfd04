"""Each task's predicted success: the probability of its reference episode under a model.

The reference episode is the task's demonstration (:func:`~runner.models.demonstrations
.demonstration`: the reference solution played one command per turn by the scripted agent,
with the silent record of observations that a generated task's reference commands give).
Rendered as the ``hf`` backend renders its prompts at rollout time
(:func:`~runner.models.rendering.conversation_examples`, the code the warm start trains
with), one forward pass over it gives p(token | prefix) for every token the agent would
sample; at the run's temperature T (and top-p, as :mod:`runner.backends.sampling` applies
them) the product over those tokens is the probability that a rollout replays the reference
episode token for token. Nothing runs in a container.

Which tokens count: every token of every reply, and a reply's end-of-turn token only where
the reply does not end at a stop string (the backend stops there and never samples it). A
reply longer than ``max_new_tokens`` cannot be replayed (log p = -inf).

It is a lower bound on the task's success probability (other replies may also solve it)
and exact for what it names. A task without a reference solution gets NaN.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from runner.errors import UserError

SCORES_FILE = "task_scores.parquet"  # in the run directory (tasks.signal)
COLUMNS = ("task", "category", "log_p", "p", "tokens")


@dataclass(frozen=True)
class Scoring:
    """How a rollout samples: what the probability of a reply depends on."""

    temperature: float = 0.6
    top_p: float = 1.0
    context_tokens: int = 1024
    max_new_tokens: int = 160
    stop: tuple[str, ...] = ("</command>", "</action>")


@dataclass
class _Sequence:
    task: int  # index into the tasks scored
    ids: list[int]
    mask: list[int]  # 1 where the token's probability counts


def _sequences(tokenizer: Any, tasks: Sequence[Any], how: Scoring) -> tuple[list, list[bool]]:
    """The packed sequences of every task's demonstration, and which tasks can be scored at
    all (a reference solution, every reply within ``max_new_tokens``)."""
    from runner.models.demonstrations import demonstration
    from runner.models.rendering import pack_turns, turn_examples

    budget = how.context_tokens - how.max_new_tokens
    out, possible = [], []
    for i, task in enumerate(tasks):
        try:
            messages = demonstration(task)
        except ValueError:  # no reference solution
            out.append(None)
            possible.append(False)
            continue
        turns = turn_examples(tokenizer, messages, budget)
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        # the end-of-turn token is sampled only where no stop string ended the reply
        sampled_end = [not any(r.endswith(s) for s in how.stop) for r in replies]
        lengths = [len(t) - (not end) for (_, t), end in zip(turns, sampled_end, strict=True)]
        possible.append(all(n <= how.max_new_tokens for n in lengths))
        examples = pack_turns(turns)
        _drop_unsampled_ends(examples, sampled_end)
        out.append([_Sequence(i, e.ids, e.mask) for e in examples])
    return out, possible


def _drop_unsampled_ends(examples: Sequence[Any], sampled_end: Sequence[bool]) -> None:
    """Unmark the last target token (the end of turn) of each turn that ends at a stop.

    ``pack_turns`` marks each turn's target as one run of 1s (a user message separates
    two turns), so the k-th run is the k-th turn."""
    turn = 0
    for e in examples:
        for j, m in enumerate(e.mask):
            if m and (j + 1 == len(e.mask) or not e.mask[j + 1]):
                if not sampled_end[turn]:
                    e.mask[j] = 0
                turn += 1
    if turn != len(sampled_end):
        raise AssertionError(f"{turn} packed turns for {len(sampled_end)} replies")


def _token_log_probs(logits, targets, temperature: float, top_p: float):
    """log p(target) under the sampler's distribution (temperature, top-p; T = 0: greedy)."""
    import torch

    from runner.backends.sampling import filter_top_p

    if temperature <= 0.0:
        hit = logits.argmax(dim=-1) == targets
        return torch.where(hit, 0.0, float("-inf"))
    logp = torch.log_softmax(filter_top_p(logits.float() / temperature, top_p), dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def _batches(seqs: list[_Sequence], batch_tokens: int) -> list[list[_Sequence]]:
    """Sequences of similar length together, at most ``batch_tokens`` (padded) a batch."""
    order = sorted(seqs, key=lambda s: len(s.ids))
    out: list[list[_Sequence]] = []
    for s in order:
        if out and (len(out[-1]) + 1) * len(s.ids) <= batch_tokens:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def score_tasks(
    model: Any,
    tokenizer: Any,
    tasks: Sequence[Any],
    how: Scoring | None = None,
    *,
    batch_tokens: int = 8192,
    progress: Callable[[int, int], None] | None = None,
) -> pd.DataFrame:
    """One row per task (``COLUMNS``): log p of its reference episode, p, the tokens scored.

    ``progress(done, total)``: sequences scored so far, of all (about one per task)."""
    import torch

    from runner.models.pretrain import collate

    how = how or Scoring()
    per_task, possible = _sequences(tokenizer, tasks, how)
    seqs = [s for group in per_task if group for s in group]
    log_p = np.zeros(len(tasks))
    tokens = np.zeros(len(tasks), dtype=np.int64)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    device = next(model.parameters()).device
    done = 0
    with torch.no_grad():
        for batch in _batches(seqs, batch_tokens):
            ids, attn, mask = (t.to(device) for t in collate(batch, pad))
            logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
            lp = _token_log_probs(logits, ids[:, 1:], how.temperature, how.top_p)
            counted = mask[:, 1:].bool()
            sums = torch.where(counted, lp, 0.0).sum(dim=1).double().cpu().numpy()
            for s, value, n in zip(batch, sums, counted.sum(dim=1).tolist(), strict=True):
                log_p[s.task] += value
                tokens[s.task] += n
            done += len(batch)
            if progress is not None:
                progress(done, len(seqs))
    log_p[~np.array(possible, dtype=bool)] = -np.inf
    log_p[[group is None for group in per_task]] = np.nan
    return pd.DataFrame(
        {
            "task": [t.task_id for t in tasks],
            "category": [t.category or "" for t in tasks],
            "log_p": log_p,
            "p": np.exp(log_p),
            "tokens": tokens,
        }
    )


def in_band(scores: pd.DataFrame, low: float, high: float) -> pd.Series:
    """Whether each task's p lies in [low, high] (NaN: never)."""
    return scores["p"].between(low, high) & scores["p"].notna()


def category_table(scores: pd.DataFrame, band: tuple[float, float] = (0.1, 0.9)) -> pd.DataFrame:
    """Per category and over all: tasks, mean p (the predicted success rate), median p and
    the share of tasks in ``band``."""
    frame = scores.assign(in_band=in_band(scores, *band))

    def row(name: str, part: pd.DataFrame) -> dict[str, Any]:
        return {
            "category": name,
            "tasks": len(part),
            "mean_p": part["p"].mean(),
            "median_p": part["p"].median(),
            "in_band": part["in_band"].mean(),
        }

    rows = [row(str(c), part) for c, part in frame.groupby("category", sort=True)]
    return pd.DataFrame([*rows, row("all", frame)])


def format_table(table: pd.DataFrame, band: tuple[float, float]) -> str:
    width = max(len("category"), *(len(c) for c in table["category"]))
    share = f"in [{band[0]:g}, {band[1]:g}]"
    lines = [f"{'category':<{width}}  tasks  mean p  median p  {share}"]
    for r in table.itertuples():
        lines.append(
            f"{r.category:<{width}}  {r.tasks:5d}  {r.mean_p:6.3f}  {r.median_p:8.3g}  "
            f"{r.in_band:{len(share)}.2f}"
        )
    return "\n".join(lines)


def load_split(folder: Path, split: str, limit: int | None = None) -> tuple[list[Any], list[str]]:
    """The split's (first ``limit``) tasks that load, and those that do not (with why)."""
    from runner.task_pool import split_ids
    from runner.terminal.errors import TerminalError
    from runner.terminal.loaders import load_task

    tasks, failed = [], []
    for name in split_ids(folder, split)[:limit]:
        try:
            tasks.append(load_task(folder / name))
        except TerminalError as exc:
            failed.append(f"{name}: {exc}")
    return tasks, failed


def score_folder(
    model_dir: str | Path,
    tasks: Sequence[Any],
    how: Scoring,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    show_progress: bool = False,
) -> pd.DataFrame:
    """:func:`score_tasks` with the model folder loaded as the ``hf`` backend loads it."""
    import sys

    from tqdm import tqdm

    from runner.backends.hf import ModelLoadError, load_model

    try:
        model, tokenizer = load_model(model_dir, dtype, device)
    except ModelLoadError as exc:
        raise UserError(str(exc)) from None
    try:
        with tqdm(desc="scoring tasks", unit="seq", leave=False, disable=not show_progress,
                  file=sys.stderr) as bar:  # fmt: skip

            def progress(done: int, total: int) -> None:
                bar.total = total
                bar.update(done - bar.n)

            return score_tasks(model, tokenizer, tasks, how, progress=progress)
    finally:
        del model
        if device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()


# -- tasks.signal: a run trains on the tasks whose predicted success is in a band -----------


def run_scoring(config: Any) -> Scoring:
    """How the run's rollouts sample (its ``sampling`` and ``context_tokens``)."""
    s = config.sampling
    return Scoring(s.temperature, s.top_p, config.context_tokens, s.max_new_tokens, tuple(s.stop))


def signal_task_ids(run: Any, config: Any, folder: Path, *, show_progress: bool = False):
    """The task ids of the run's split whose predicted success is in ``tasks.signal``.

    The split is scored with the run's model once, and the scores kept in the run directory
    (``task_scores.parquet``, with ``in_band``); a resumed run reads them back, so its tasks
    stay those it started with. Refuses (one line) if fewer in-band tasks remain than one
    job's ``episodes_per_job``.
    """
    band = config.tasks.signal
    path = run / SCORES_FILE
    if path.is_file():
        scores = pd.read_parquet(path)
    else:
        tasks, _ = load_split(folder, config.tasks.split)
        m = config.model
        scores = score_folder(
            m.path, tasks, run_scoring(config), dtype=m.dtype, device=m.device,
            show_progress=show_progress,
        )  # fmt: skip
        scores["in_band"] = in_band(scores, band.min, band.max)
        run.write_table(SCORES_FILE, scores)
    keep = scores.loc[scores["in_band"], "task"].tolist()
    need = config.episodes_per_job
    if len(keep) < need:
        raise UserError(
            f"tasks.signal: {len(keep)} of the {len(scores)} {config.tasks.split} tasks have a "
            f"predicted success in [{band.min:g}, {band.max:g}]; a job needs episodes_per_job "
            f"= {need} (widen the band, or see {path})"
        )
    return keep
