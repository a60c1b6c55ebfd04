"""philox-v2 on CPU at the rate of ``torch.randn``: the integer part compiled with numba.

The torch path (:func:`runner.es.noise._fill_philox`) spends most of its time in about 25
int64 tensor ops per normal (Philox4x32-10 emulated in int64) and in strided writes of the
interleaved lanes. Here one numba loop per sub-chunk computes the words and turns them
straight into the float32 inputs of Box-Muller; ``log``, ``sqrt``, ``cos`` and ``sin``
stay torch ops on contiguous rows (so they are the very same functions as on the torch
path: torch's vectorised CPU ``sqrt`` is not always correctly rounded, and a numba
``sqrt`` would differ from it in the last bit of ~17 % of elements), and a second numba
loop multiplies radius and angle terms into the output in element order. Every value is
therefore bit-identical to the torch path (``tests/es/test_es_philox_kernels.py``): the
integer ops are exact, the int-to-float32 conversion and the scalings are the same
correctly rounded float32 ops (numba does not contract ``a * b`` into an FMA without
``fastmath``), and the transcendental ops are torch's.

Where numba does not import, :data:`AVAILABLE` is False and the torch ops run.
"""

from __future__ import annotations

import numpy as np
import torch

try:
    from numba import njit
except ImportError:  # the optional ``fast`` extra
    njit = None

AVAILABLE = njit is not None

_TWO_PI = np.float32(2 * np.pi)  # the float32 value philox-v2's angle is scaled by
_INV_2_33 = np.float32(2.0**-33)
_LO = np.uint64(0xFFFFFFFF)


def _box_muller_inputs(q0, nq, k0, k1, radius, angle):  # pragma: no cover - compiled
    """Counters q0 .. q0+nq-1 under key (k0, k1): ``radius[p * nq + i]`` <- the uniform of
    lane 2p of counter i (log side), ``angle[p * nq + i]`` <- float32(2 pi) * the uniform of
    lane 2p + 1."""
    m0, m1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    w0, w1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
    thirty_two = np.uint64(32)
    for i in range(nq):
        q = np.uint64(q0 + i)
        c0, c1 = np.uint32(q & _LO), np.uint32(q >> thirty_two)
        c2, c3 = np.uint32(0), np.uint32(0)
        a, b = np.uint32(k0), np.uint32(k1)
        for _ in range(10):
            p0 = np.uint64(c0) * m0
            p1 = np.uint64(c2) * m1
            c0, c2 = np.uint32(p1 >> thirty_two) ^ c1 ^ a, np.uint32(p0 >> thirty_two) ^ c3 ^ b
            c1, c3 = np.uint32(p1 & _LO), np.uint32(p0 & _LO)
            a, b = np.uint32(a + w0), np.uint32(b + w1)
        # u = float32(2x + 1) * 2**-33: one correctly rounded conversion, an exact scaling
        radius[i] = np.float32(np.int64(c0) * 2 + 1) * _INV_2_33
        radius[nq + i] = np.float32(np.int64(c2) * 2 + 1) * _INV_2_33
        angle[i] = (np.float32(np.int64(c1) * 2 + 1) * _INV_2_33) * _TWO_PI
        angle[nq + i] = (np.float32(np.int64(c3) * 2 + 1) * _INV_2_33) * _TWO_PI


def _element(j, nq, radius, cos, sin):  # pragma: no cover - compiled
    """Normal of element j of the quads (j // 4 the quad, j % 4 the lane)."""
    q, lane = j >> 2, j & 3
    k = (lane >> 1) * nq + q
    return radius[k] * (cos[k] if lane & 1 == 0 else sin[k])


def _interleave(skip, take, nq, radius, cos, sin, out):  # pragma: no cover - compiled
    """out[i] <- the normal of element ``skip + i`` of the quads, i < take."""
    head = min((4 - skip % 4) % 4, take)  # elements before the first whole quad
    for i in range(head):
        out[i] = _element(skip + i, nq, radius, cos, sin)
    first, whole = (skip + head) >> 2, (take - head) >> 2
    r0, c0, s0 = radius[first:nq], cos[first:nq], sin[first:nq]  # lanes 0, 1
    r1, c1, s1 = radius[nq + first :], cos[nq + first :], sin[nq + first :]  # lanes 2, 3
    dst = out[head:]
    for k in range(whole):  # a plain loop from 0 over slices: LLVM vectorises it
        dst[4 * k] = r0[k] * c0[k]
        dst[4 * k + 1] = r0[k] * s0[k]
        dst[4 * k + 2] = r1[k] * c1[k]
        dst[4 * k + 3] = r1[k] * s1[k]
    for i in range(head + 4 * whole, take):  # a tail that ends mid-quad
        out[i] = _element(skip + i, nq, radius, cos, sin)


if njit is not None:
    _box_muller_inputs = njit(cache=True, nogil=True)(_box_muller_inputs)
    _element = njit(cache=True, inline="always")(_element)
    _interleave = njit(cache=True, nogil=True)(_interleave)


def fill(out: torch.Tensor, key: tuple[int, int], start: int, rows: torch.Tensor) -> None:
    """Elements ``[start, start + out.numel())`` of the philox-v2 stream under ``key`` into
    the contiguous 1-D float32 CPU tensor ``out``, a sub-chunk of ``rows.shape[1] // 2``
    quads at a time; ``rows`` is float32 scratch of shape (3, 2 * quads)."""
    quads = rows.shape[1] // 2
    radius_t, angle_t, cos_t = rows[0], rows[1], rows[2]
    dst = out.numpy()
    n, pos = out.numel(), 0
    while pos < n:
        q0, skip = divmod(start + pos, 4)
        nq = min(quads, (start + n - 4 * q0 + 3) // 4)
        take = min(4 * nq - skip, n - pos)
        radius, angle, cos = radius_t[: 2 * nq], angle_t[: 2 * nq], cos_t[: 2 * nq]
        _box_muller_inputs(q0, nq, key[0], key[1], radius.numpy(), angle.numpy())
        # the torch path's own ops, in its order: r = sqrt(-2 log u), cos t, sin t
        radius.log_().mul_(-2.0).sqrt_()
        torch.cos(angle, out=cos)
        angle.sin_()
        _interleave(skip, take, nq, radius.numpy(), cos.numpy(), angle.numpy(), dst[pos:])
        pos += take
