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

A row may start from the key/value states of an earlier turn whose tokens begin its
prompt (``prefix_kv``; :class:`PrefixStore` keeps them): only the rest of the prompt is
prefilled. Its cache row is then [padding, the reused prefix, padding, the new suffix].
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import DynamicCache

# (input ids, attention mask, positions, cache) -> logits of each row's last position
Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, DynamicCache], torch.Tensor]
# per layer: (keys, values), each [1, kv heads, tokens, head dim]
KV = list[tuple[torch.Tensor, torch.Tensor]]


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
    prefix_kv: KV | None = None  # the states of prompt[:reused], computed earlier
    reused: int = 0

    def fed(self) -> list[int]:
        """The tokens whose states the batch holds: the last sampled one was never fed,
        unless the reply ended at end-of-sequence (which is not kept)."""
        return self.prompt + (self.tokens if self.finish == "eos" else self.tokens[:-1])


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
        reused = max(r.reused for r in rows)
        suffixes = [r.prompt[r.reused :] for r in rows]
        span = max(len(x) for x in suffixes)
        ids = torch.full((len(rows), span), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), reused + span), dtype=torch.long)
        start = torch.zeros((len(rows), 1), dtype=torch.long)  # each suffix's first position
        for i, (r, x) in enumerate(zip(rows, suffixes, strict=True)):
            ids[i, span - len(x) :] = torch.tensor(x, dtype=torch.long)
            mask[i, reused - r.reused : reused] = 1  # left padding in both parts
            mask[i, reused + span - len(x) :] = 1
            start[i] = r.reused
        ids, mask, start = ids.to(self.device), mask.to(self.device), start.to(self.device)
        positions = start + (mask[:, reused:].cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        if reused:
            for layer, (k, v) in enumerate(_stack_prefixes(rows, reused)):
                cache.update(k, v, layer)
        logits = self.forward(ids, mask, positions, cache)
        next_pos = positions[:, -1:] + 1
        width = reused + span
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

    def states(self, row: Row) -> KV:
        """The key/value states the batch holds for ``row`` (its ``fed()`` tokens)."""
        b = self.rows.index(row)
        # its real columns: a row that reused states has padding between prefix and suffix
        cols = self.mask[b].nonzero().squeeze(1)
        return [
            (layer.keys[b : b + 1, :, cols], layer.values[b : b + 1, :, cols])
            for layer in self.cache.layers
        ]

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


def _stack_prefixes(rows: Sequence[Row], width: int) -> KV:
    """Per layer, the rows' reused states left-padded to ``width`` (zeros: masked)."""
    template = next(r.prefix_kv for r in rows if r.reused)
    out = []
    for layer, (k0, v0) in enumerate(template):
        keys, values = [], []
        for r in rows:
            if r.reused:
                k, v = r.prefix_kv[layer]
                k, v = k[:, :, : r.reused], v[:, :, : r.reused]
            else:
                k, v = k0[:, :, :0], v0[:, :, :0]
            keys.append(F.pad(k, (0, 0, width - k.shape[2], 0)))
            values.append(F.pad(v, (0, 0, width - v.shape[2], 0)))
        out.append((torch.cat(keys), torch.cat(values)))
    return out


class PrefixStore:
    """The states of finished turns, for the next turn of the same session to reuse.

    An agent's next prompt is its previous prompt, its reply and the command's output:
    the longest common prefix with a stored turn (``min_tokens`` at least) is not
    prefilled again. Entries carry a tag (the weights they were computed with); a lookup
    with another tag finds nothing, and the owner clears the store at every weight
    change, so states never cross a perturbation or an update. Least recently stored
    entries go first beyond ``capacity``.
    """

    def __init__(self, capacity: int, min_tokens: int = 16) -> None:
        self.capacity, self.min_tokens = capacity, min_tokens
        self._entries: OrderedDict[int, tuple[torch.Tensor, KV, object]] = OrderedDict()
        self._next = 0
        self._lock = threading.Lock()
        self.stats = {"lookups": 0, "hits": 0, "tokens_reused": 0}

    def put(self, tokens: Sequence[int], states: KV, tag: object) -> None:
        with self._lock:
            self._entries[self._next] = (torch.tensor(tokens, dtype=torch.long), states, tag)
            self._next += 1
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def take(self, prompt: Sequence[int], tag: object) -> tuple[int, KV | None]:
        """(tokens reusable, their states) for ``prompt``; (0, None) if none is worth it.

        At least the prompt's last token is left to prefill (its logits start the reply).
        """
        query = torch.tensor(prompt, dtype=torch.long)
        best, best_key = 0, None
        with self._lock:
            self.stats["lookups"] += 1
            for key, (tokens, _, entry_tag) in self._entries.items():
                if entry_tag != tag:
                    continue
                n = min(len(tokens), len(query) - 1)
                differ = (tokens[:n] != query[:n]).nonzero()
                common = int(differ[0]) if len(differ) else n
                if common >= best:
                    best, best_key = common, key
            if best < self.min_tokens or best_key is None:
                return 0, None
            # shared, not taken: states are never changed in place, and other sessions
            # may share a prefix with it too (the system prompt)
            _, states, _ = self._entries[best_key]
            self._entries.move_to_end(best_key)
            self.stats["hits"] += 1
            self.stats["tokens_reused"] += best
        return best, states

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


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
