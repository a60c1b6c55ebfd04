"""Seeded Gaussian noise, regenerated on demand, one independent stream per tensor.

Definition of the stream (scheme ``blockseed-v1``; keep it stable, checkpoints depend on it):

* A perturbation is named by an integer ``seed`` in ``[0, 2**63)``.
* Each tensor is named by its qualified parameter name (``model.named_parameters()``),
  so two tensors of the same shape never share noise, and the noise of a tensor does not
  depend on which other tensors the optimizer manages.
* The flattened tensor is cut into blocks of ``block`` elements (default ``2**18``); the
  last block may be shorter. Block ``b`` holds ``torch.randn(n_b, dtype=float32)`` drawn
  from a fresh ``torch.Generator`` on the tensor's device seeded with
  ``block_seed(seed, name, b)``: the first 8 bytes (little endian, top bit cleared) of
  ``blake2b(b"runner.es.noise/v1\\0" + seed.to_bytes(8, "little") + name.encode() +
  b"\\0" + b.to_bytes(8, "little"), digest_size=8)``. Python's ``hash()`` is salted per
  process and is never used.
* The values therefore depend on (seed, name, block size, device type): CPU uses
  mt19937, CUDA uses Philox, so a CPU and a GPU run of one seed differ.

Seeding every block makes the noise of any element computable without generating the
elements before it, so a chunked loop touches one chunk of extra memory and the result
does not depend on the chunk size or on how chunks are spread over threads.

Known limit: the CPU generator (mt19937) keeps only the low 32 bits of its seed, so two
blocks collide with probability 2**-32 per pair; with 2**18-element blocks a 7B-parameter
model has ~27k blocks per perturbation, i.e. ~0.08 expected identical block pairs within
one perturbation. CUDA's Philox uses the full 64-bit seed.
"""

from __future__ import annotations

import hashlib

import torch

NOISE_SCHEME = "blockseed-v1"
DEFAULT_BLOCK = 2**18
_PREFIX = b"runner.es.noise/v1\0"
_SEED_LIMIT = 2**63


def check_seed(seed: int) -> int:
    """Return ``seed`` as an int, or raise ValueError if it is not in ``[0, 2**63)``."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        try:
            as_int = int(seed)
        except (TypeError, ValueError):
            raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}") from None
        if as_int != seed:
            raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}")
        seed = as_int
    if not 0 <= seed < _SEED_LIMIT:
        raise ValueError(f"seed must be an integer in [0, 2**63), got {seed}")
    return seed


def stream_hasher(seed: int, name: str) -> hashlib.blake2b:
    """The hash state shared by all blocks of one (seed, tensor) stream; copy it per block."""
    h = hashlib.blake2b(digest_size=8)
    h.update(_PREFIX)
    h.update(check_seed(seed).to_bytes(8, "little"))
    h.update(name.encode("utf-8"))
    h.update(b"\0")
    return h


def block_seed(
    seed: int, name: str, block_index: int, *, _hasher: hashlib.blake2b | None = None
) -> int:
    """Generator seed of block ``block_index`` of tensor ``name`` for perturbation ``seed``."""
    h = (_hasher or stream_hasher(seed, name)).copy()
    h.update(block_index.to_bytes(8, "little"))
    return int.from_bytes(h.digest(), "little") & (_SEED_LIMIT - 1)


def fill_noise(
    out: torch.Tensor,
    seed: int,
    name: str,
    start: int,
    *,
    block: int = DEFAULT_BLOCK,
    generator: torch.Generator | None = None,
    hasher: hashlib.blake2b | None = None,
    numel: int | None = None,
) -> torch.Tensor:
    """Write elements ``[start, start + out.numel())`` of the stream into the 1-D fp32 ``out``.

    ``start`` must be a multiple of ``block``. ``out`` may end mid-block only at the end of
    the tensor (the last block is shorter; a shorter draw is not a prefix of a longer one);
    pass the tensor's ``numel`` to have that checked.
    """
    if start % block:
        raise ValueError(f"start {start} is not a multiple of the noise block {block}")
    if numel is not None and out.numel() % block and start + out.numel() != numel:
        raise ValueError(
            f"elements [{start}, {start + out.numel()}) end inside a noise block of a tensor of "
            f"{numel} elements; only the tensor's last block may be partial"
        )
    if out.dtype != torch.float32 or out.dim() != 1:
        raise ValueError("out must be a 1-D float32 tensor")
    gen = generator if generator is not None else torch.Generator(device=out.device)
    hasher = hasher or stream_hasher(seed, name)
    n = out.numel()
    first = start // block
    for offset in range(0, n, block):
        gen.manual_seed(block_seed(seed, name, first + offset // block, _hasher=hasher))
        piece = out[offset : offset + block]
        torch.randn(piece.shape, generator=gen, dtype=torch.float32, device=out.device, out=piece)
    return out


def tensor_noise(
    seed: int,
    name: str,
    numel: int,
    *,
    block: int = DEFAULT_BLOCK,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """The whole stream of one tensor as a new 1-D fp32 tensor (for tests and small tensors)."""
    out = torch.empty(numel, dtype=torch.float32, device=device)
    return fill_noise(out, seed, name, 0, block=block, numel=numel)
