"""The philox-v2 kernels against the torch path (runner/es/noise.py's int64 torch ops, which
test_es_noise_portable.py checks against an independent reference and Random123):

* the fused Triton kernel (runner/es/philox_triton.py), run on CPU tensors by Triton's
  interpreter (TRITON_INTERPRET=1, set per test with monkeypatch: Triton reads it when the
  kernel is decorated and launched, and the module decorates once per mode, so it does not
  leak into other tests): words and uniforms bit for bit, normals within 1e-6 relative,
  perturb / restore, updates, checkpoints across kernels;
* the compiled CPU path (runner/es/philox_cpu.py, numba): every value bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from runner.config import ESConfig
from runner.es import (
    ESOptimizer,
    fill_noise,
    load_checkpoint,
    philox_key,
    philox_uniforms,
    philox_words,
    save_checkpoint,
    tensor_noise,
)
from runner.es.noise import PhiloxScratch
from runner.es.optimizer import resolve_kernel

V2 = "philox-v2"
F32_EPS = float(np.finfo(np.float32).eps)
CPU = torch.device("cpu")
# (seed, name, start, count, quads): odd sizes, starts and ends mid-counter, one to many
# programs, the counter's second word turning over
DRAWS = [
    (0, "w", 0, 1, 4),
    (12345, "layer.0.weight", 3, 257, 4),
    (5, "x", 1001, 1030, 64),
    (2**63 - 1, "model.embed_tokens.weight", 6, 13, 1),
    (7, "b", 4 * (2**32 - 3) + 2, 30, 2),
]


@pytest.fixture
def triton_kernel(monkeypatch):
    """runner.es.philox_triton with Triton's interpreter on for this test only."""
    pytest.importorskip("triton", reason="Triton is not installed (pip install triton)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from runner.es import philox_triton

    assert philox_triton.interpreting()
    return philox_triton


def reference_normals(seed: int, name: str, start: int, count: int) -> np.ndarray:
    """Box-Muller in float64 from the torch path's uniforms (checked bit for bit against
    an independent reference elsewhere): r = sqrt(-2 ln u_a), t = float32(2 pi) * u_b."""
    q0 = start // 4
    u = philox_uniforms(seed, name, 4 * q0, (start + count + 3) // 4 * 4 - 4 * q0)
    u = u.view(-1, 4).numpy()
    t = (np.float32(2 * math.pi) * u[:, 1::2]).astype(np.float64)  # a float32 product
    r = np.sqrt(-2.0 * np.log(u[:, 0::2].astype(np.float64)))
    z = np.stack([r[:, 0] * np.cos(t[:, 0]), r[:, 0] * np.sin(t[:, 0]),
                  r[:, 1] * np.cos(t[:, 1]), r[:, 1] * np.sin(t[:, 1])], axis=1)  # fmt: skip
    return z.reshape(-1)[start - 4 * q0 : start - 4 * q0 + count]


def assert_within(got: torch.Tensor, ref, rel: float = 1e-6) -> None:
    g, r = got.double().numpy(), np.asarray(ref, dtype=np.float64)
    err = np.abs(g - r)
    assert bool(np.all(err <= rel * np.abs(r) + 1e-30)), float(np.max(err / np.abs(r)))


# ---------------------------------------------------------------------- Triton: draws
def test_the_kernel_meets_random123s_known_answer(triton_kernel):
    # counter (0, 0, 0, 0), key (0, 0): the first "philox4x32 10" line of Random123's
    # tests/kat_vectors; it is the kernel's counter 0 under key (0, 0)
    words = triton_kernel.words((0, 0), 0, 4, CPU)
    assert words.tolist() == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


@pytest.mark.parametrize(("seed", "name", "start", "count", "quads"), DRAWS)
def test_words_and_uniforms_equal_the_torch_path_bitwise(
    triton_kernel, seed, name, start, count, quads
):
    key = philox_key(seed, name)
    words = triton_kernel.words(key, start, count, CPU, quads)
    assert torch.equal(words, philox_words(seed, name, start, count))
    got = triton_kernel.uniforms(key, start, count, CPU, quads)
    want = philox_uniforms(seed, name, start, count)
    assert got.view(torch.int32).tolist() == want.view(torch.int32).tolist()


@pytest.mark.parametrize(("seed", "name", "start", "count", "quads"), DRAWS)
def test_normals_are_within_1e_6_of_the_definition(triton_kernel, seed, name, start, count, quads):
    got = triton_kernel.fill(torch.empty(count), philox_key(seed, name), start, quads)
    assert_within(got, reference_normals(seed, name, start, count))
    torch_path = fill_noise(torch.empty(count), seed, name, start, scheme=V2)
    assert_within(got, torch_path.double().numpy(), rel=1e-6)


def test_chunked_fills_equal_the_whole_tensor_bitwise(triton_kernel):
    numel, key = 2100, philox_key(3, "w")
    whole = triton_kernel.fill(torch.empty(numel), key, 0)
    for chunk in (250, 1001, 1024):  # starts on every lane of a counter
        parts = [
            triton_kernel.fill(torch.empty(min(chunk, numel - s)), key, s, quads=16)
            for s in range(0, numel, chunk)
        ]
        assert torch.equal(torch.cat(parts), whole), chunk


# ---------------------------------------------------------------------- Triton: passes
def test_perturbation_is_the_noise_and_restore_is_bit_exact(triton_kernel, two_tensors):
    model = two_tensors(torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    opt = ESOptimizer(model, sigma=1.0, noise=V2, kernel="triton")
    assert opt.kernel == "triton" and opt.config()["noise"]["kernel"] == "triton"
    with opt.perturbed(31):  # zero weights, sigma 1: the working weights are eps itself
        for name, p in model.named_parameters():
            assert_within(p.detach().flatten(), reference_normals(31, name, 0, p.numel()))
    assert all(bool((p == 0).all()) for p in model.parameters())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_perturb_then_restore_is_bit_exact_in_any_dtype(triton_kernel, two_tensors, dtype):
    model = two_tensors(dtype)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    fused = ESOptimizer(model, sigma=0.01, noise=V2, kernel="triton")
    reference = ESOptimizer(two_tensors(dtype), sigma=0.01, noise=V2, kernel="torch")
    for seed, sign in ((4, 1), (5, -1)):
        with fused.perturbed(seed, sign), reference.perturbed(seed, sign):
            for (name, p), q in zip(
                model.named_parameters(), reference.model.parameters(), strict=True
            ):
                # the same cast of the same fp32 sum, up to the normals' last bits: a
                # working weight may land one ulp of its dtype away, rarely
                differ = p != q
                assert differ.float().mean() < 0.02, name
                ulp = torch.finfo(dtype).eps * q.abs().double() + torch.finfo(dtype).tiny
                assert bool(((p.double() - q.double()).abs() <= ulp)[differ].all()), name
        for name, p in model.named_parameters():
            assert torch.equal(p, before[name]), (seed, name)
    fused.close()
    reference.close()


def update_bound(opt: ESOptimizer, entries: list[tuple[int, float]]) -> dict[str, torch.Tensor]:
    """Per element: 1e-6 relative on each c_k * eps_k (the normals' tolerance) plus one
    float32 rounding per term and one for the master's add, of the largest magnitude
    involved. The noise comes from the torch path, not from the kernel under test."""
    out = {}
    for name, m in opt.master_parameters():
        terms = [c * tensor_noise(s, name, m.numel(), scheme=V2).double() for s, c in entries]
        size = sum(t.abs() for t in terms)
        top = size + m.flatten().double().abs()
        out[name] = 1e-6 * size + (len(entries) + 1) * F32_EPS * top
    return out


def test_an_update_equals_the_torch_paths_within_the_bound(triton_kernel, two_tensors):
    entries = [(11, 0.5), (12, -0.25), (13, 3e-4), (14, 0.0), (15, -1.5)]
    fused = ESOptimizer(two_tensors(torch.bfloat16), noise=V2, kernel="triton")
    reference = ESOptimizer(two_tensors(torch.bfloat16), noise=V2, kernel="torch")
    bound = update_bound(reference, entries)
    fused._apply_entries(entries)
    reference._apply_entries(entries)
    diffs = []
    for (name, a), (_, b) in zip(
        fused.master_parameters(), reference.master_parameters(), strict=True
    ):
        err = (a.double() - b.double()).abs().flatten()
        assert bool((err <= bound[name]).all()), name
        diffs.append(int((err > 0).sum()))
    assert sum(diffs) > 0  # the kernels' normals do differ in the last bits: a real bound
    for (name, p), w in zip(fused.model.named_parameters(), fused.master_parameters(), strict=True):
        assert torch.equal(p, w[1].to(p.dtype)), name  # working = cast(master)


@pytest.mark.parametrize(("write", "read"), [("triton", "torch"), ("torch", "triton")])
def test_a_checkpoint_of_one_kernel_replays_with_the_other(
    triton_kernel, two_tensors, tmp_path, write, read
):
    opt = ESOptimizer(two_tensors(), noise=V2, kernel=write)
    cohorts = [[(21, 1.0, 0), (22, -0.5, 0), (23, 0.3, 0)], [(24, 2.0, 1), (25, -1.0, 1)]]
    for cohort in cohorts:
        opt.step(cohort)
    save_checkpoint(opt, tmp_path)
    loaded = load_checkpoint(two_tensors(), tmp_path, kernel=read)
    assert loaded.kernel == read and loaded.version == 2
    # the updates' bounds add up (each measured against the torch path's noise)
    bounds = [update_bound(loaded, list(record.entries)) for record in opt.log]
    pairs = zip(loaded.master_parameters(), opt.master_parameters(), strict=True)
    for (name, a), (_, b) in pairs:
        err = (a.double() - b.double()).abs().flatten()
        assert bool((err <= sum(bound[name] for bound in bounds)).all()), name
        assert bool((err > 0).any()) or name == "d", name  # the kernels did differ
    loaded.close()
    opt.close()


# ---------------------------------------------------------------------- Triton: compiled
def compile_for_h100(mode: int, out: str, fusion: bool = False) -> str:
    """The kernel compiled (not run) for sm_90 by Triton's bundled ptxas, specialised as a
    launch on 16-byte aligned tensors of a multiple of 16 elements is; its PTX."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from runner.es import philox_triton

    signature = {"out_ptr": f"*{out}", "master_ptr": "*fp32", "keys_ptr": "*i64",
                 "coefs_ptr": "*fp32", "n_keys": "i32", "q_first": "i64", "n": "i64",
                 "SKIP": "constexpr", "MODE": "constexpr", "QUADS": "constexpr",
                 "LIBDEVICE": "constexpr"}  # fmt: skip
    aligned = [["tt.divisibility", 16]]
    source = ASTSource(
        fn=triton.jit(philox_triton._philox_pass),
        signature=signature,
        constexprs={"SKIP": 0, "MODE": mode, "QUADS": philox_triton.QUADS, "LIBDEVICE": True},
        attrs={(0,): aligned, (1,): aligned, (6,): aligned},
    )
    options = {**philox_triton.COMPILE_OPTIONS, "enable_fp_fusion": fusion}
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    assert kernel.asm["cubin"]  # ptxas accepted it
    return kernel.asm["ptx"]


def test_the_kernel_compiles_for_an_h100_with_precise_math_and_vector_loads(monkeypatch):
    """What can be checked of the CUDA build without a GPU (docs/gpu.md: its figures await
    a session with a device)."""
    pytest.importorskip("triton.backends.nvidia", reason="Triton has no CUDA backend here")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    update = compile_for_h100(4, "bf16")
    assert ".approx" not in update  # libdevice log/cos/sin, not the fast hardware ones
    assert "sqrt.rn.f32" in update  # the correctly rounded sqrt of the definition
    assert "ld.global.v4" in update  # the master read 16 bytes at a time
    # the kernel's own c * eps + acc is not contracted into an FMA (libdevice's are its own)
    assert update.count("fma.rn.f32") < compile_for_h100(4, "bf16", fusion=True).count("fma.rn.f32")
    assert "fma" not in compile_for_h100(2, "fp32")  # the uniforms: integer ops and scalings


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_compiled_kernel_agrees_with_the_torch_path(monkeypatch, two_tensors):
    pytest.importorskip("triton", reason="Triton is not installed (pip install triton)")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    from runner.es import philox_triton

    cuda = torch.device("cuda")
    for seed, name, start, count, _ in DRAWS:
        key = philox_key(seed, name)
        words = philox_triton.words(key, start, count, cuda).cpu()
        assert torch.equal(words, philox_words(seed, name, start, count))
        uniforms = philox_triton.uniforms(key, start, count, cuda).cpu()
        assert torch.equal(uniforms, philox_uniforms(seed, name, start, count))
        got = philox_triton.fill(torch.empty(count, device=cuda), key, start).cpu()
        assert_within(got, reference_normals(seed, name, start, count))
        on_cuda = fill_noise(torch.empty(count, device=cuda), seed, name, start, scheme=V2)
        assert_within(got, on_cuda.cpu().double().numpy())
    entries = [(11, 0.5), (12, -0.25), (13, 3e-4), (15, -1.5)]
    fused = ESOptimizer(two_tensors(torch.bfloat16).to(cuda), noise=V2, kernel="triton")
    reference = ESOptimizer(two_tensors(torch.bfloat16), noise=V2, kernel="torch")
    assert fused.kernel == "triton"
    bound = update_bound(reference, entries)
    fused._apply_entries(entries)
    reference._apply_entries(entries)
    pairs = zip(fused.master_parameters(), reference.master_parameters(), strict=True)
    for (name, a), (_, b) in pairs:
        err = (a.cpu().double() - b.double()).abs().flatten()
        assert bool((err <= bound[name]).all()), name


# ---------------------------------------------------------------------- selection
def test_auto_takes_torch_on_cpu_and_an_impossible_choice_says_why(monkeypatch, two_tensors):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert resolve_kernel("auto", V2, CPU) == "torch"
    try:
        import triton  # noqa: F401

        on_cuda = "triton"
    except ImportError:
        on_cuda = "torch"
    assert resolve_kernel("auto", V2, torch.device("cuda")) == on_cuda
    assert resolve_kernel("auto", "blockseed-v1", torch.device("cuda")) == "torch"
    opt = ESOptimizer(two_tensors(), noise=V2)
    assert opt.kernel == "torch" and opt.config()["noise"]["kernel"] == "torch"
    with pytest.raises(ValueError, match="kernel must be one of auto, torch, triton"):
        ESOptimizer(two_tensors(), noise=V2, kernel="cuda")
    with pytest.raises(ValueError, match="draws philox-v2 noise only"):
        ESOptimizer(two_tensors(), kernel="triton")
    with pytest.raises(ValueError, match="triton"):  # no CUDA here, no interpreter
        ESOptimizer(two_tensors(), noise=V2, kernel="triton")


def test_the_config_key_reaches_the_optimizer():
    es = ESConfig(noise=V2, noise_kernel="torch")
    assert (
        es.optimizer_kwargs()["kernel"] == "torch" and "noise_kernel" not in es.optimizer_kwargs()
    )
    assert ESConfig().noise_kernel == "auto"
    with pytest.raises(ValueError, match="noise_kernel"):
        ESConfig(noise_kernel="numba")


# ---------------------------------------------------------------------- compiled CPU path
@pytest.mark.parametrize(
    ("start", "count", "max_elements"),
    [(0, 1, 10), (3, 257, 100), (1001, 3000, 100), (5, 2**17 + 1300, None), (2**34 + 1, 30, None)],
)
def test_the_compiled_cpu_path_equals_the_torch_ops_bitwise(start, count, max_elements):
    pytest.importorskip("numba", reason="numba is not installed (the fast extra)")
    compiled = PhiloxScratch(CPU, max_elements)
    assert compiled.compiled
    ops = PhiloxScratch(CPU, max_elements, compiled=False)
    a = fill_noise(torch.empty(count), 8, "w", start, scheme=V2, scratch=compiled)
    b = fill_noise(torch.empty(count), 8, "w", start, scheme=V2, scratch=ops)
    assert a.view(torch.int32).tolist() == b.view(torch.int32).tolist()
