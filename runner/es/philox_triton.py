"""philox-v2 as one fused Triton kernel: draw a tensor's normals and apply them in one pass.

One kernel (:func:`_philox_pass`), five modes, each a single pass over memory with no
int64 intermediates in it:

* ``NORMALS`` / ``WORDS`` / ``UNIFORMS``: elements ``[start, start + n)`` of the stream
  into ``out`` (the last two for tests: they must equal the torch path bit for bit);
* ``PERTURB``: ``working = cast(master + c * eps)``, reading the fp32 master once and
  writing the working weights once;
* ``UPDATE``: ``master += sum_k c_k * eps_k`` over K (key, coefficient) entries, the noise
  of every entry regenerated in registers, then ``working = cast(master)``: one read and
  one write of the master and one write of the working weights, whatever K (no K x tensor
  scratch, no chunk buffer: the extra memory is 12 bytes per entry for keys and
  coefficients).

Every program takes ``QUADS`` consecutive Philox counters (4 elements each) as a
(QUADS, 4) tile, so loads and stores are contiguous and a tensor may start or end mid
counter. The arithmetic is the ``philox-v2`` definition (:mod:`runner.es.noise`), in the
torch path's order: Philox4x32-10 on uint32 words (64-bit products), ``u = float32(2x + 1)
* 2**-33`` (one correctly rounded conversion, an exact scaling), ``r = sqrt(-2 log u_a)``
(correctly rounded ``sqrt``), ``t = float32(2 pi) * u_b``, ``r cos t`` / ``r sin t``, then
``c * eps`` and the sums as separate float32 ops (launched with ``enable_fp_fusion=False``:
no FMA contraction). On CUDA ``log``/``cos``/``sin`` are libdevice's (``__nv_logf`` etc.,
what torch's own CUDA kernels call); in Triton's interpreter (``TRITON_INTERPRET=1``,
CPU tensors, the tests) numpy's. Words and uniforms are therefore bit-identical to the
torch path on any device; normals within the ulps of ``log``/``cos``/``sin``
(docs/es.md, "Noise kernels").

Triton reads ``TRITON_INTERPRET`` when a function is decorated and when it is launched, so
the kernel is decorated on first use, once per mode (compiled or interpreted), and a test
that sets the variable for its own duration gets the interpreter without leaking it. The
kernel calls Triton builtins only (``tl.full``, not ``tl.zeros``: the helpers of
``triton.language.standard`` are themselves decorated when Triton is imported, compiled,
and the interpreter cannot call them).
"""

import torch
import triton
import triton.language as tl
from triton import knobs
from triton.language.extra import libdevice

NORMALS, WORDS, UNIFORMS, PERTURB, UPDATE = range(5)
QUADS = 256  # counters per program: 1024 elements, 4 KiB of fp32 per tile
# compiled launches: no FMA contraction of the kernel's own mul + add (libdevice's internal
# fma instructions are its own and stay)
COMPILE_OPTIONS = {"enable_fp_fusion": False}


def _philox_pass(
    out_ptr,  # NORMALS/UNIFORMS: fp32; WORDS: int64; PERTURB/UPDATE: the working weights
    master_ptr,  # fp32 master (PERTURB, UPDATE)
    keys_ptr,  # int64 (K, 2): the Philox key words k0, k1 of each entry
    coefs_ptr,  # fp32 (K,): each entry's coefficient
    n_keys,
    q_first,  # the counter of out[0]: out[0] is element 4 * q_first + SKIP of the stream
    n,  # elements of out
    SKIP: tl.constexpr,  # 0..3; a compile-time 0 lets the loads and stores be vectorised
    MODE: tl.constexpr,
    QUADS: tl.constexpr,
    LIBDEVICE: tl.constexpr,
):
    local = tl.program_id(0).to(tl.int64) * QUADS + tl.arange(0, QUADS).to(tl.int64)
    q = q_first + local  # counters
    lane = tl.arange(0, 4)[None, :]
    idx = (4 * local)[:, None] + lane - SKIP  # (QUADS, 4): offsets into out, element order
    mask = (idx >= 0) & (idx < n)
    c0_in = (q & 0xFFFFFFFF).to(tl.uint32)  # counter = (q & mask, q >> 32, 0, 0)
    c1_in = (q >> 32).to(tl.uint32)
    if MODE >= 3:
        master = tl.load(master_ptr + idx, mask=mask, other=0.0)
    acc = tl.full([QUADS, 4], 0.0, dtype=tl.float32)
    for k in range(n_keys):
        k0 = tl.load(keys_ptr + 2 * k)  # int64 holding a uint32
        k1 = tl.load(keys_ptr + 2 * k + 1)
        c0, c1 = c0_in, c1_in
        c2 = tl.full([QUADS], 0, dtype=tl.uint32)
        c3 = tl.full([QUADS], 0, dtype=tl.uint32)
        for r in tl.static_range(10):  # Philox4x32-10 (Random123's constants)
            kr0 = ((k0 + r * 0x9E3779B9) & 0xFFFFFFFF).to(tl.uint32)  # the Weyl-bumped key
            kr1 = ((k1 + r * 0xBB67AE85) & 0xFFFFFFFF).to(tl.uint32)
            p0 = c0.to(tl.uint64) * 0xD2511F53
            p1 = c2.to(tl.uint64) * 0xCD9E8D57
            c0 = (p1 >> 32).to(tl.uint32) ^ c1 ^ kr0
            c2 = (p0 >> 32).to(tl.uint32) ^ c3 ^ kr1
            c1 = p1.to(tl.uint32)
            c3 = p0.to(tl.uint32)
        if MODE == 1:
            w = tl.where(lane == 0, c0[:, None], tl.where(lane == 1, c1[:, None], c2[:, None]))
            w = tl.where(lane == 3, c3[:, None], w)
            tl.store(out_ptr + idx, w.to(tl.int64), mask=mask)
        else:
            # one correctly rounded conversion of 2x + 1 < 2**33, an exact scaling
            u0 = (c0.to(tl.uint64) * 2 + 1).to(tl.float32) * 1.16415321826934814453125e-10
            u1 = (c1.to(tl.uint64) * 2 + 1).to(tl.float32) * 1.16415321826934814453125e-10
            u2 = (c2.to(tl.uint64) * 2 + 1).to(tl.float32) * 1.16415321826934814453125e-10
            u3 = (c3.to(tl.uint64) * 2 + 1).to(tl.float32) * 1.16415321826934814453125e-10
            if MODE == 2:
                u = tl.where(lane == 0, u0[:, None], tl.where(lane == 1, u1[:, None], u2[:, None]))
                u = tl.where(lane == 3, u3[:, None], u)
                tl.store(out_ptr + idx, u, mask=mask)
            else:
                t1 = u1 * 6.2831854820251465  # float32(2 pi), exactly representable
                t3 = u3 * 6.2831854820251465
                if LIBDEVICE:
                    r0 = tl.sqrt_rn(libdevice.log(u0) * -2.0)
                    r2 = tl.sqrt_rn(libdevice.log(u2) * -2.0)
                    z0, z1 = r0 * libdevice.cos(t1), r0 * libdevice.sin(t1)
                    z2, z3 = r2 * libdevice.cos(t3), r2 * libdevice.sin(t3)
                else:
                    r0 = tl.sqrt_rn(tl.log(u0) * -2.0)
                    r2 = tl.sqrt_rn(tl.log(u2) * -2.0)
                    z0, z1 = r0 * tl.cos(t1), r0 * tl.sin(t1)
                    z2, z3 = r2 * tl.cos(t3), r2 * tl.sin(t3)
                z = tl.where(lane == 0, z0[:, None], tl.where(lane == 1, z1[:, None], z2[:, None]))
                z = tl.where(lane == 3, z3[:, None], z)
                if MODE == 0:
                    tl.store(out_ptr + idx, z, mask=mask)
                else:
                    # the torch path's rounding: c * eps, then summed (no FMA)
                    acc += tl.load(coefs_ptr + k) * z
    if MODE >= 3:
        # PERTURB: working = cast(master + c * eps); UPDATE: master += the whole update,
        # added once, and working = cast(master)
        res = master + acc
        if MODE == 4:
            tl.store(master_ptr + idx, res, mask=mask)
        if out_ptr.dtype.element_ty == tl.bfloat16:
            # round to nearest even by hand (as torch's cast does for finite values):
            # Triton's interpreter truncates fp32 -> bf16
            bits = res.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
            tl.store(out_ptr + idx, bits.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=mask)
        else:
            tl.store(out_ptr + idx, res.to(out_ptr.dtype.element_ty), mask=mask)


_KERNELS: dict[bool, object] = {}


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return bool(knobs.runtime.interpret)


def usable_on(device: torch.device) -> bool:
    """Whether the kernel can run on tensors of ``device``: CUDA compiled, CPU interpreted."""
    return device.type == "cuda" or (device.type == "cpu" and interpreting())


def _kernel():
    mode = interpreting()
    if mode not in _KERNELS:  # decorated now, so that the decorator sees the mode
        _KERNELS[mode] = triton.jit(do_not_specialize=["n_keys", "q_first"])(_philox_pass)
    return _KERNELS[mode]


def _launch(
    mode: int,
    out: torch.Tensor,
    start: int,
    keys: torch.Tensor,
    coefs: torch.Tensor | None = None,
    master: torch.Tensor | None = None,
    quads: int = QUADS,
) -> torch.Tensor:
    """One pass over the 1-D contiguous ``out`` (and ``master``): elements [start, start +
    out.numel()) of the stream under each key in ``keys`` ((K, 2) int64 on out's device)."""
    n = out.numel()
    if n == 0:
        return out
    if not usable_on(out.device):
        raise RuntimeError(
            f"the triton noise kernel runs on CUDA tensors (or on CPU in Triton's interpreter, "
            f"TRITON_INTERPRET=1), not on {out.device.type}"
        )
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    counters = (start + n + 3) // 4 - start // 4
    grid = (triton.cdiv(counters, quads),)
    coefs = keys if coefs is None else coefs  # unused by the drawing modes
    master = out if master is None else master
    interp = interpreting()
    _kernel()[grid](
        out, master, keys, coefs, keys.shape[0], start // 4, n,
        SKIP=start % 4, MODE=mode, QUADS=quads, LIBDEVICE=not interp,
        **({} if interp else COMPILE_OPTIONS),
    )  # fmt: skip
    return out


def key_tensor(keys: list[tuple[int, int]], device: torch.device) -> torch.Tensor:
    """Philox keys as the kernel's (K, 2) int64 tensor on ``device``."""
    return torch.tensor(keys, dtype=torch.int64).view(-1, 2).to(device)


def coef_tensor(coefs: list[float], device: torch.device) -> torch.Tensor:
    """Coefficients as the kernel's (K,) fp32 tensor (each rounded to float32 once, as a
    Python scalar is in torch's float32 ops)."""
    return torch.tensor(coefs, dtype=torch.float32).to(device)


def fill(out: torch.Tensor, key: tuple[int, int], start: int, quads: int = QUADS) -> torch.Tensor:
    """Normals of elements [start, start + out.numel()) into the 1-D fp32 ``out``."""
    return _launch(NORMALS, out, start, key_tensor([key], out.device), quads=quads)


def words(
    key: tuple[int, int], start: int, count: int, device: torch.device, quads: int = QUADS
) -> torch.Tensor:
    """The 32-bit Philox word of each element (int64 values), as the kernel makes them."""
    out = torch.empty(count, dtype=torch.int64, device=device)
    return _launch(WORDS, out, start, key_tensor([key], device), quads=quads)


def uniforms(
    key: tuple[int, int], start: int, count: int, device: torch.device, quads: int = QUADS
) -> torch.Tensor:
    """The float32 uniform of each element, as the kernel makes them."""
    out = torch.empty(count, dtype=torch.float32, device=device)
    return _launch(UNIFORMS, out, start, key_tensor([key], device), quads=quads)


def perturb(
    working: torch.Tensor,
    master: torch.Tensor,
    key: torch.Tensor,
    scale: torch.Tensor,
    start: int = 0,
    quads: int = QUADS,
) -> None:
    """``working = cast(master + scale * eps(key))``: 1-D views, master fp32, ``key`` a (1, 2)
    int64 and ``scale`` a (1,) fp32 tensor on their device."""
    _launch(PERTURB, working, start, key, scale, master, quads)


def update(
    working: torch.Tensor,
    master: torch.Tensor,
    keys: torch.Tensor,
    coefs: torch.Tensor,
    start: int = 0,
    quads: int = QUADS,
) -> None:
    """``master += sum_k coefs[k] * eps(keys[k])``, then ``working = cast(master)``."""
    _launch(UPDATE, working, start, keys, coefs, master, quads)
