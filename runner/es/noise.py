"""Seeded Gaussian noise, regenerated on demand, one independent stream per tensor.

Two schemes define the stream; a checkpoint records which one its log was made with.

Common to both:

* A perturbation is named by an integer ``seed`` in ``[0, 2**63)``.
* Each tensor is named by its qualified parameter name (``model.named_parameters()``),
  so two tensors of the same shape never share noise, and the noise of a tensor does not
  depend on which other tensors the optimizer manages.
* Python's ``hash()`` is salted per process and is never used.
* Any element's noise is computable without generating the elements before it, so a
  chunked loop touches one chunk of extra memory (plus, for ``philox-v2``, a fixed
  scratch) and the values do not depend on the chunk size or on how chunks are spread
  over threads.

Scheme ``blockseed-v1`` (:data:`LEGACY_SCHEME`, still the default; keep it stable, old
checkpoints depend on it):

* The flattened tensor is cut into blocks of ``block`` elements (default ``2**18``); the
  last block may be shorter. Block ``b`` holds ``torch.randn(n_b, dtype=float32)`` drawn
  from a fresh ``torch.Generator`` on the tensor's device seeded with
  ``block_seed(seed, name, b)``: the first 8 bytes (little endian, top bit cleared) of
  ``blake2b(b"runner.es.noise/v1\\0" + seed.to_bytes(8, "little") + name.encode() +
  b"\\0" + b.to_bytes(8, "little"), digest_size=8)``.
* The values therefore depend on (seed, name, block size, device type): CPU uses
  mt19937, CUDA uses Philox, so a CPU and a GPU run of one seed differ.
* Known limit: the CPU generator (mt19937) keeps only the low 32 bits of its seed, so two
  blocks collide with probability 2**-32 per pair; with 2**18-element blocks a
  7B-parameter model has ~27k blocks per perturbation, i.e. ~0.08 expected identical
  block pairs within one perturbation. CUDA's Philox uses the full 64-bit seed.

Scheme ``philox-v2`` (device-independent): Philox4x32-10 (Salmon et al., SC'11, the
generator of cuRAND and of Random123, whose known-answer vectors the tests check)
written with plain int64 / float32 torch ops, so it runs the same on any device:

* Key: ``k = int.from_bytes(blake2b(b"runner.es.noise/v2\\0" + seed.to_bytes(8,
  "little") + name.encode() + b"\\0", digest_size=8).digest(), "little")``, as the two
  32-bit words ``(k & 0xFFFFFFFF, k >> 32)``.
* Element ``j`` of the flattened tensor (``q = j // 4``, lane ``j % 4``): the four 32-bit
  words ``x0..x3 = Philox4x32-10(counter=(q & 0xFFFFFFFF, q >> 32, 0, 0), key)``. The
  block size plays no part (``noise_block`` only sets the chunk granularity): the value
  of element ``j`` is a function of (seed, name, j) alone.
* Uniform of element ``j``: ``u_j = float32(2 * x_{j % 4} + 1) * 2**-33``, i.e.
  ``(x + 1/2) / 2**32`` rounded once to float32 (round to nearest even), in ``(0, 1]``.
* Box-Muller in float32, per pair of lanes ``(0, 1)`` and ``(2, 3)`` of one counter, with
  ``a`` the even and ``b`` the odd lane: ``r = sqrt(-2 * log(u_a))``,
  ``t = float32(2*pi) * u_b``; element ``a`` is ``r * cos(t)``, element ``b`` is
  ``r * sin(t)`` (each op a separate, rounded float32 op). ``|z| <= 6.77``.
* Keys collide between two (seed, name) pairs with probability 2**-64; within one
  stream every counter is distinct, so no two blocks or chunks ever share noise.

What philox-v2 guarantees:

* The Philox words and the uniforms are bit-identical on every device (CPU, CUDA), for any
  chunking and thread count: integer ops, one correctly rounded int-to-float32 conversion
  and an exact scaling by a power of two.
* The normals also go through ``log``, ``sqrt``, ``cos`` and ``sin``. The multiplications
  are correctly rounded everywhere, and so is ``sqrt`` on CUDA; torch's vectorised CPU
  ``sqrt`` is not always (one ulp off the correctly rounded value for ~17 % of these
  inputs, measured); ``log``/``cos``/``sin`` come from different libraries (Sleef or MKL
  on CPU, CUDA's libdevice, numpy in Triton's interpreter), each within a few float32 ulps
  of the exact value (measured on CPU against a float64 reference: <= 1.9e-7 relative). So
  across device types and kernels the normals agree to within 1e-6 relative in float32,
  before any cast to the weights' dtype (a bf16/fp16 cast can rarely turn that into a
  1-ulp difference of a working weight). They are bit-exact for one device type, kernel,
  torch build and CPU instruction set, whatever the chunking or thread count.
* A log written on one device type (or with one kernel) therefore replays on another to
  within that tolerance, not bit for bit; with the same ones it replays bit for bit.

Scheme ``lowrank-v1-r<R>`` (low-rank perturbations, as in EGGROLL; device-independent like
philox-v2, which draws its factors):

* A 2-D parameter ``W`` of shape ``(m, n)`` is perturbed along ``A B^T / sqrt(R)``, with
  factors ``A`` (``m x R``) and ``B`` (``n x R``) drawn from the same seed: ``A[i, k]`` is
  element ``i * R + k`` and ``B[j, k]`` element ``j * R + k`` of a philox-v2 normal stream
  (the definition above) under the key ``k = int.from_bytes(blake2b(
  b"runner.es.noise/lowrank-v1\0" + seed.to_bytes(8, "little") + name.encode() + b"\0" +
  factor, digest_size=8).digest(), "little")``, ``factor`` being ``b"A"`` or ``b"B"``,
  split into two 32-bit words as for philox-v2.
* Element ``(i, j)`` (flat index ``i * n + j``) is ``s * (((A[i,0] * B[j,0]) + A[i,1] *
  B[j,1]) + ...)``, every product and sum a separate float32 op in that order, and ``s``
  the float32 value of ``1 / sqrt(R)``: each element has variance 1 (a sum of R products
  of independent standard normals, over R), so sigma means what it means for full noise,
  and an update is a sum of rank-R matrices along the drawn factors.
* Parameters that are not matrices (biases, norms) get the philox-v2 stream of their name
  (full rank, the same numbers as under philox-v2).
* Any element depends on (seed, name, shape, R) only, not on chunking or threads; the
  factors' rows a chunk needs are drawn for it (``B`` whole, ``(n + rows) * R`` normals a
  chunk). Products and sums are correctly rounded float32 ops, so across device types the
  elements inherit philox-v2's tolerance (the factors' normals within 1e-6 relative);
  on one device type they are bit-exact.

Cost. Here (the ``torch`` kernel) Philox is written in int64 torch ops, about 25
element-ops per normal: ~0.3x the rate of ``torch.randn`` on CPU, and on CUDA ~130 small
kernels per sub-chunk. On CPU, where numba imports, the words and the final products are
compiled instead (:mod:`runner.es.philox_cpu`: the same values bit for bit, about the rate
of ``torch.randn``); on CUDA the ``triton`` kernel (:mod:`runner.es.philox_triton`) draws
and applies the noise in one fused pass. Work runs in sub-chunks of at most
``PHILOX_SUB_ELEMENTS`` elements with one scratch of ``PhiloxScratch.BYTES_PER_QUAD``
bytes per 4 elements (1.5 MiB on CPU), held per thread and reused.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import torch

from runner.es import philox_cpu
from runner.es.schemes import (  # noqa: F401 - re-exported: the names noise is made under
    LEGACY_SCHEME,
    NOISE_SCHEME,
    NOISE_SCHEMES,
    PHILOX_SCHEME,
    SEED_LIMIT,
    check_scheme,
    check_seed,
    lowrank_rank,
)

DEFAULT_BLOCK = 2**18
_PREFIX = b"runner.es.noise/v1\0"
_PREFIX_V2 = b"runner.es.noise/v2\0"
_PREFIX_LOWRANK = b"runner.es.noise/lowrank-v1\0"

# Philox4x32 constants (Random123): multipliers and the Weyl key increments.
_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = 0xFFFFFFFF
PHILOX_ROUNDS = 10
_TWO_PI_F32 = float(torch.tensor(2 * math.pi, dtype=torch.float32))  # exactly representable
# Elements per Philox sub-chunk (capped by the caller's chunk). CPU: per-op overhead against
# cache misses; 2**17..2**18 measured fastest on a shared 2-core machine (2**16: ~25 %
# slower), 2**17 keeps the scratch at 1.5 MiB. Elsewhere larger: each op is a kernel
# launch. The values do not depend on it.
PHILOX_SUB_ELEMENTS = {"cpu": 2**17}
_PHILOX_SUB_OTHER = 2**20


# ---------------------------------------------------------------------- blockseed-v1
def stream_hasher(seed: int, name: str) -> hashlib.blake2b:
    """The hash state shared by all blocks of one blockseed-v1 stream; copy it per block."""
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
    return int.from_bytes(h.digest(), "little") & (SEED_LIMIT - 1)


# ---------------------------------------------------------------------- philox-v2
def philox_key(seed: int, name: str) -> tuple[int, int]:
    """The Philox key ``(k0, k1)`` (two 32-bit words) of one (seed, tensor) stream."""
    h = hashlib.blake2b(digest_size=8)
    h.update(_PREFIX_V2)
    h.update(check_seed(seed).to_bytes(8, "little"))
    h.update(name.encode("utf-8"))
    h.update(b"\0")
    k = int.from_bytes(h.digest(), "little")
    return k & _MASK32, k >> 32


def _philox_rounds(
    c0: torch.Tensor,
    c1: torch.Tensor,
    c2: torch.Tensor,
    c3: torch.Tensor,
    t0: torch.Tensor,
    t1: torch.Tensor,
    k0: int,
    k1: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32-10 in place on int64 tensors holding uint32 words; returns the 4 outputs.

    Unsigned 32-bit arithmetic is emulated in int64: the product of two words is below
    2**64 and int64 multiplication wraps (CPU and CUDA), so its 64 bits are those of the
    unsigned product; ``>> 32`` is arithmetic, so the high word is masked after the shift.
    ``c1``/``c3`` may carry garbage above bit 31 (the unmasked previous products): it is
    cleared by the mask that follows each xor, and by the final masks. ``t0``/``t1`` are
    scratch; the returned tensors are among the six arguments.
    """
    for _ in range(PHILOX_ROUNDS):
        torch.mul(c0, _M0, out=t0)  # p0 = M0 * c0: hi0 = p0 >> 32, lo0 = p0 & mask
        torch.mul(c2, _M1, out=t1)  # p1 = M1 * c2
        torch.bitwise_right_shift(t1, 32, out=c0)  # new c0 = hi1 ^ c1 ^ k0
        c0.bitwise_xor_(c1).bitwise_xor_(k0).bitwise_and_(_MASK32)
        torch.bitwise_right_shift(t0, 32, out=c2)  # new c2 = hi0 ^ c3 ^ k1
        c2.bitwise_xor_(c3).bitwise_xor_(k1).bitwise_and_(_MASK32)
        c1, t1 = t1, c1  # new c1 = lo1, new c3 = lo0 (masked at the end)
        c3, t0 = t0, c3
        k0, k1 = (k0 + _W0) & _MASK32, (k1 + _W1) & _MASK32
    return c0, c1.bitwise_and_(_MASK32), c2, c3.bitwise_and_(_MASK32)


def philox4x32_10(
    counter: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], key: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32-10 of int64 counter words (values in [0, 2**32)) under ``key``; new tensors."""
    c = [w.to(torch.int64).clone() for w in counter]
    t = [torch.empty_like(c[0]), torch.empty_like(c[0])]
    out = _philox_rounds(*c, *t, int(key[0]), int(key[1]))
    return tuple(x.clone() for x in out)  # type: ignore[return-value]


class PhiloxScratch:
    """Reusable buffer for philox-v2 on one device (one per thread): six int64 rows of one
    sub-chunk's counters (four lanes, two products); once the words are out, the same bytes
    hold the float32 uniforms, cosines and an interleaved block for unaligned ends. On CPU
    with ``compiled`` (default: where numba imports) the words are made by
    :mod:`runner.es.philox_cpu` instead, in half of the same bytes, with the same values."""

    BYTES_PER_QUAD = 6 * 8  # 48 bytes per 4 elements

    def __init__(
        self,
        device: torch.device | str,
        max_elements: int | None = None,
        *,
        compiled: bool | None = None,
    ) -> None:
        self.device = torch.device(device)
        sub = PHILOX_SUB_ELEMENTS.get(self.device.type, _PHILOX_SUB_OTHER)
        if max_elements is not None:
            sub = min(sub, max_elements + 6)  # a chunk can straddle two extra quads
        self.quads = max(1, -(-sub // 4))
        on_cpu = self.device.type == "cpu" and philox_cpu.AVAILABLE
        self.compiled = on_cpu if compiled is None else bool(compiled and on_cpu)
        self._ints: torch.Tensor | None = None

    def ints(self) -> torch.Tensor:
        if self._ints is None:
            self._ints = torch.empty(6, self.quads, dtype=torch.int64, device=self.device)
        return self._ints

    def float_rows(self) -> torch.Tensor:
        """The compiled CPU path's (3, 2 * quads) float32 rows, in the same bytes."""
        return self.ints().view(-1).view(torch.float32)[: 6 * self.quads].view(3, -1)

    def nbytes(self) -> int:
        return 0 if self._ints is None else self.quads * self.BYTES_PER_QUAD


def _philox_quads(
    q0: int, nq: int, key: tuple[int, int], ints: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Words x0..x3 of counters q0 .. q0+nq-1: rows 0..3 of ``ints`` (rows 4, 5 are free)."""
    c0, c1, c2, c3, t0, t1 = (row[:nq] for row in ints)
    torch.arange(q0, q0 + nq, dtype=torch.int64, device=ints.device, out=c0)
    torch.bitwise_right_shift(c0, 32, out=c1)  # counter = (q & mask, q >> 32, 0, 0)
    c0.bitwise_and_(_MASK32)
    c2.zero_()
    c3.zero_()
    words = _philox_rounds(c0, c1, c2, c3, t0, t1, key[0], key[1])
    # An even number of rounds swaps the lane and product buffers back into place.
    assert PHILOX_ROUNDS % 2 == 0 and words[1] is c1 and words[3] is c3
    return words


def _f32_rows(ints: torch.Tensor, first: int, rows: int, nq: int) -> torch.Tensor:
    """A contiguous (2 * rows, nq) float32 view of the bytes of int64 rows [first, first + rows)."""
    flat = ints[first : first + rows].view(-1).view(torch.float32)
    return flat[: 2 * rows * nq].view(2 * rows, nq)


def _uniform_rows(words: tuple[torch.Tensor, ...], uni: torch.Tensor) -> None:
    """uni rows (0, 1, 2, 3) <- uniforms of lanes (0, 2, 1, 3): log-side lanes first, so the
    transcendental ops run on contiguous rows. Consumes (overwrites) ``words``."""
    for row, x in zip((0, 2, 1, 3), words, strict=True):
        x.mul_(2).add_(1)  # 2x + 1 < 2**33: exact in int64
        uni[row].copy_(x)  # one correctly rounded int -> float32 conversion
    uni.mul_(2.0**-33)  # exact: a power of two, no underflow


def _box_muller(uni: torch.Tensor, cos: torch.Tensor, dst: torch.Tensor) -> None:
    """dst (4, nq), lanes as rows (any strides) <- normals from ``uni`` (clobbered)."""
    r, t = uni[0:2], uni[2:4]
    r.log_().mul_(-2.0).sqrt_()
    t.mul_(_TWO_PI_F32)
    torch.cos(t, out=cos)
    t.sin_()
    torch.mul(r, cos, out=dst[0::2])
    torch.mul(r, t, out=dst[1::2])


def _fill_philox(
    out: torch.Tensor, key: tuple[int, int], start: int, scratch: PhiloxScratch
) -> torch.Tensor:
    """Elements [start, start + out.numel()) of the philox-v2 stream, sub-chunk by sub-chunk."""
    if scratch.compiled and out.is_contiguous():
        philox_cpu.fill(out, key, start, scratch.float_rows())
        return out
    ints = scratch.ints()
    n, pos = out.numel(), 0
    while pos < n:
        j = start + pos
        q0, skip = divmod(j, 4)
        nq = min(scratch.quads, (start + n - 4 * q0 + 3) // 4)
        take = min(4 * nq - skip, n - pos)
        words = _philox_quads(q0, nq, key, ints)
        # The same bytes, reused as float32 once the words are consumed: the uniforms in
        # rows 4-5 (free), then cosines in row 0 and the interleaved block in rows 1-2.
        uni = _f32_rows(ints, 4, 2, nq)
        _uniform_rows(words, uni)
        cos = _f32_rows(ints, 0, 1, nq)
        if skip == 0 and take == 4 * nq:  # whole quads: write straight into out
            _box_muller(uni, cos, out[pos : pos + take].view(nq, 4).T)
        else:  # a ragged end: through the interleaved block
            inter = _f32_rows(ints, 1, 2, nq).view(-1)[: 4 * nq]
            _box_muller(uni, cos, inter.view(nq, 4).T)
            out[pos : pos + take].copy_(inter[skip : skip + take])
        pos += take
    return out


def _philox_lanes_to_elements(
    lanes: tuple[torch.Tensor, ...], start: int, count: int
) -> torch.Tensor:
    q0 = start // 4
    inter = torch.stack(lanes, dim=1).reshape(-1)
    return inter[start - 4 * q0 : start - 4 * q0 + count]


def philox_words(
    seed: int, name: str, start: int, count: int, *, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """The 32-bit Philox word of each element ``[start, start + count)`` (int64 values)."""
    q0, q1 = start // 4, (start + count + 3) // 4
    ints = torch.empty(6, q1 - q0, dtype=torch.int64, device=device)
    lanes = _philox_quads(q0, q1 - q0, philox_key(seed, name), ints)
    return _philox_lanes_to_elements(tuple(x.clone() for x in lanes), start, count)


def philox_uniforms(
    seed: int, name: str, start: int, count: int, *, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """The float32 uniform ``u_j`` of each element ``[start, start + count)``."""
    q0, q1 = start // 4, (start + count + 3) // 4
    ints = torch.empty(6, q1 - q0, dtype=torch.int64, device=device)
    uni = torch.empty(4, q1 - q0, dtype=torch.float32, device=device)
    _uniform_rows(_philox_quads(q0, q1 - q0, philox_key(seed, name), ints), uni)
    lanes = (uni[0], uni[2], uni[1], uni[3])  # rows hold lanes (0, 2, 1, 3)
    return _philox_lanes_to_elements(lanes, start, count)


# ---------------------------------------------------------------------- lowrank-v1-r<R>
def lowrank_key(seed: int, name: str, factor: str) -> tuple[int, int]:
    """The Philox key of factor ``"A"`` or ``"B"`` of one (seed, matrix) perturbation."""
    if factor not in ("A", "B"):
        raise ValueError(f"factor must be 'A' or 'B', got {factor!r}")
    h = hashlib.blake2b(digest_size=8)
    h.update(_PREFIX_LOWRANK)
    h.update(check_seed(seed).to_bytes(8, "little"))
    h.update(name.encode("utf-8"))
    h.update(b"\0" + factor.encode())
    k = int.from_bytes(h.digest(), "little")
    return k & _MASK32, k >> 32


class LowRankStream:
    """What all chunks of one (seed, tensor) low-rank stream share: the rank, the keys of
    the two factors and of the full-rank stream (for parameters that are not matrices)."""

    def __init__(self, seed: int, name: str, rank: int) -> None:
        self.rank = rank
        self.a, self.b = lowrank_key(seed, name, "A"), lowrank_key(seed, name, "B")
        self.full = philox_key(seed, name)
        # float32(1 / sqrt(R)), exactly representable in the ops' float32 arithmetic
        self.scale = float(torch.tensor(1 / math.sqrt(rank), dtype=torch.float32))


def _philox_normals(
    key: tuple[int, int], start: int, count: int, device: torch.device, scratch: PhiloxScratch
) -> torch.Tensor:
    return _fill_philox(torch.empty(count, device=device), key, start, scratch)


def _fill_lowrank(
    out: torch.Tensor,
    st: LowRankStream,
    start: int,
    shape: tuple[int, ...],
    scratch: PhiloxScratch,
) -> torch.Tensor:
    """Elements [start, start + out.numel()) of the flattened perturbation of a tensor of
    ``shape``: low rank for a matrix, the full-rank philox-v2 stream otherwise."""
    if len(shape) != 2:
        return _fill_philox(out, st.full, start, scratch)
    n, r, count = shape[1], st.rank, out.numel()
    row0 = start // n
    rows = (start + count - 1) // n + 1 - row0
    a = _philox_normals(st.a, row0 * r, rows * r, out.device, scratch).view(rows, r)
    b = _philox_normals(st.b, 0, n * r, out.device, scratch).view(n, r)
    block = torch.empty(rows, n, device=out.device)
    term = torch.empty_like(block) if r > 1 else None
    # sum_k A[i, k] * B[j, k], one rounded product and one rounded sum at a time (no fused
    # multiply-add, no matmul): the same bits whatever the chunk, thread or vector width
    torch.mul(a[:, :1], b[:, 0], out=block)
    for k in range(1, r):
        torch.mul(a[:, k : k + 1], b[:, k], out=term)
        block.add_(term)
    block.mul_(st.scale)
    offset = start - row0 * n
    return out.copy_(block.view(-1)[offset : offset + count])


# ---------------------------------------------------------------------- every scheme
def stream_state(seed: int, name: str, scheme: str = NOISE_SCHEME) -> Any:
    """What all chunks of one (seed, tensor) stream share: the blake2b state
    (blockseed-v1), the Philox key (philox-v2) or a :class:`LowRankStream`. Pass it to
    :func:`fill_noise`."""
    if check_scheme(scheme) == LEGACY_SCHEME:
        return stream_hasher(seed, name)
    rank = lowrank_rank(scheme)
    if rank is not None:
        return LowRankStream(seed, name, rank)
    return philox_key(seed, name)


def uses_philox(scheme: str) -> bool:
    """Whether the scheme draws with Philox (and so wants a :class:`PhiloxScratch`)."""
    return check_scheme(scheme) != LEGACY_SCHEME


def fill_noise(
    out: torch.Tensor,
    seed: int,
    name: str,
    start: int,
    *,
    block: int = DEFAULT_BLOCK,
    scheme: str = NOISE_SCHEME,
    generator: torch.Generator | None = None,
    scratch: PhiloxScratch | None = None,
    stream: Any = None,
    numel: int | None = None,
    shape: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """Write elements ``[start, start + out.numel())`` of the stream into the 1-D fp32 ``out``.

    blockseed-v1: ``start`` must be a multiple of ``block``, and ``out`` may end mid-block
    only at the end of the tensor (the last block is shorter; a shorter draw is not a
    prefix of a longer one); pass the tensor's ``numel`` to have that checked.
    ``generator`` is reused if given. philox-v2: any ``start`` (the stream does not depend
    on ``block``); ``scratch`` is reused if given. lowrank-v1-r<R>: as philox-v2, and the
    tensor's ``shape`` is required (the flattened elements of a matrix of that shape).
    ``stream`` is :func:`stream_state`'s result, to skip recomputing it per chunk.
    """
    if out.dtype != torch.float32 or out.dim() != 1:
        raise ValueError("out must be a 1-D float32 tensor")
    rank = lowrank_rank(check_scheme(scheme))
    if rank is not None:
        if shape is None:
            raise ValueError(f"{scheme} noise needs the tensor's shape")
        if start < 0 or start + out.numel() > math.prod(shape):
            raise ValueError(f"elements [{start}, {start + out.numel()}) outside shape {shape}")
        st = stream if stream is not None else LowRankStream(seed, name, rank)
        return _fill_lowrank(out, st, start, shape, scratch or PhiloxScratch(out.device))
    if scheme == PHILOX_SCHEME:
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        key = stream if stream is not None else philox_key(seed, name)
        return _fill_philox(out, key, start, scratch or PhiloxScratch(out.device, out.numel()))
    if start % block:
        raise ValueError(f"start {start} is not a multiple of the noise block {block}")
    if numel is not None and out.numel() % block and start + out.numel() != numel:
        raise ValueError(
            f"elements [{start}, {start + out.numel()}) end inside a noise block of a tensor of "
            f"{numel} elements; only the tensor's last block may be partial"
        )
    gen = generator if generator is not None else torch.Generator(device=out.device)
    hasher = stream if stream is not None else stream_hasher(seed, name)
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
    scheme: str = NOISE_SCHEME,
    shape: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """The whole stream of one tensor as a new 1-D fp32 tensor (for tests and small tensors);
    low-rank schemes need the tensor's ``shape`` (default: a vector of ``numel``)."""
    out = torch.empty(numel, dtype=torch.float32, device=device)
    shape = (numel,) if shape is None else tuple(shape)
    return fill_noise(out, seed, name, 0, block=block, scheme=scheme, numel=numel, shape=shape)
