"""A batch of sequences decoding together, which sequences join and leave at any step.

:class:`HFBackend` drives one :class:`DecodeBatch` in two ways. ``model.batching: turn``
admits a whole batch of turns, then steps until the last of them is done (a session whose
reply is done waits for the slowest reply of its batch). ``continuous`` steps on a thread
of its own and admits each new turn at the next step, so no session waits for another.

Rows are left-padded: a new group is prefilled in a key/value cache of its own, then both
caches are padded on the left to one width and concatenated. Every row carries its own
positions, so padding never changes what a row computes. When rows leave, columns that
are padding in every remaining row are cut off.

A row's tokens are sampled from its own generator (runner/backends/sampling.py), so a
reply does not depend on which other rows shared its batch or when it joined.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import DynamicCache

# (input ids, attention mask, positions, cache) -> logits of each row's last position
Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, DynamicCache], torch.Tensor]


@dataclass(eq=False)
class Row:
    """One turn being generated: its prompt, its sampling stream, its tokens so far."""

    prompt: list[int]
    truncated: bool
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    finish: str = "length"  # "stop", "eos" or "length"
    future: Future | None = None  # continuous batching: where the reply goes
    submitted: float = 0.0  # continuous batching: time.monotonic() at submit


class DecodeBatch:
    def __init__(self, forward: Forward, pad_id: int, device: torch.device) -> None:
        self.forward, self.pad_id, self.device = forward, pad_id, device
        self.rows: list[Row] = []
        self.cache: DynamicCache | None = None
        self.mask = self.next_pos = self.logits = None  # [rows, width], [rows, 1], [rows, V]

    def __len__(self) -> int:
        return len(self.rows)

    def admit(self, rows: Sequence[Row]) -> None:
        """Prefill ``rows`` and add them; their next-token logits join ``self.logits``."""
        if not rows:
            return
        width = max(len(r.prompt) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):  # left padding: every row ends at the same column
            ids[i, width - len(r.prompt) :] = torch.tensor(r.prompt, dtype=torch.long)
            mask[i, width - len(r.prompt) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        logits = self.forward(ids, mask, positions, cache)
        next_pos = positions[:, -1:] + 1
        if not self.rows:
            self.cache, self.mask, self.next_pos, self.logits = cache, mask, next_pos, logits
        else:
            common = max(self.mask.shape[1], width)
            self.cache = _concat_caches(
                _pad_left(self.cache, common - self.mask.shape[1]), _pad_left(cache, common - width)
            )
            self.mask = torch.cat(
                [
                    F.pad(self.mask, (common - self.mask.shape[1], 0)),
                    F.pad(mask, (common - width, 0)),
                ]
            )
            self.next_pos = torch.cat([self.next_pos, next_pos])
            self.logits = torch.cat([self.logits, logits])
        self.rows.extend(rows)

    def drop(self, leaving: Sequence[Row]) -> None:
        """Remove ``leaving`` from the batch (finished or cancelled rows)."""
        if not leaving:
            return
        gone = set(map(id, leaving))
        keep = [i for i, r in enumerate(self.rows) if id(r) not in gone]
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.cache = self.mask = self.next_pos = self.logits = None
            return
        index = torch.tensor(keep, device=self.device)
        self.cache.batch_select_indices(index)
        self.mask, self.next_pos = self.mask[index], self.next_pos[index]
        self.logits = self.logits[index]
        # columns that are padding in every remaining row hold nothing: cut them off
        lead = int(self.mask.any(dim=0).long().argmax())
        if lead > 0:
            self.mask = self.mask[:, lead:]
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[..., lead:, :], layer.values[..., lead:, :]

    def decode(self, tokens: Sequence[int]) -> None:
        """Feed each row its newest token; ``self.logits`` become the next ones."""
        step = torch.tensor([[t] for t in tokens], device=self.device)
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(self.rows), 1))], dim=1)
        self.logits = self.forward(step, self.mask, self.next_pos, self.cache)
        self.next_pos = self.next_pos + 1


def _pad_left(cache: DynamicCache, columns: int) -> DynamicCache:
    if columns > 0:
        for layer in cache.layers:
            layer.keys = F.pad(layer.keys, (0, 0, columns, 0))
            layer.values = F.pad(layer.values, (0, 0, columns, 0))
    return cache


def _concat_caches(first: DynamicCache, second: DynamicCache) -> DynamicCache:
    for a, b in zip(first.layers, second.layers, strict=True):
        a.keys = torch.cat([a.keys, b.keys])
        a.values = torch.cat([a.values, b.values])
    return first
