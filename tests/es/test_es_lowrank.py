"""Low-rank noise (scheme lowrank-v1-r<R>, EGGROLL-style): each matrix is perturbed along
A B^T / sqrt(R) with rank-R factors drawn from the seed.

The expected values come from an independent reference: the factors' normals from the
scalar Philox of test_es_noise_portable (checked there against Random123's known answers)
under the key derived here from the documented definition (runner/es/noise.py), and the
products in float64; nothing expected is computed by the code under test.
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
import torch
from test_es_noise_portable import M32, SMALL, ref_stream, run_updates

from runner.es import (
    ESOptimizer,
    UpdateRecord,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
    tensor_noise,
)

R = 3
LR = f"lowrank-v1-r{R}"


def ref_key(seed: int, name: str, factor: bytes) -> tuple[int, int]:
    msg = (
        b"runner.es.noise/lowrank-v1\0" + seed.to_bytes(8, "little") + name.encode() + b"\0"
        + factor
    )  # fmt: skip
    k = int.from_bytes(hashlib.blake2b(msg, digest_size=8).digest(), "little")
    return k & M32, k >> 32


def ref_factors(seed: int, name: str, m: int, n: int, rank: int = R):
    """(A, B) in float64: A[i, k] is element i * R + k of the factor's normal stream."""
    a = ref_stream(0, "", 0, m * rank, key=ref_key(seed, name, b"A"))[2].reshape(m, rank)
    b = ref_stream(0, "", 0, n * rank, key=ref_key(seed, name, b"B"))[2].reshape(n, rank)
    return a, b


def ref_eps(seed: int, name: str, m: int, n: int, rank: int = R) -> np.ndarray:
    a, b = ref_factors(seed, name, m, n, rank)
    return a @ b.T / math.sqrt(rank)


def assert_matches(got: torch.Tensor, want: np.ndarray, tol: float = 2e-6) -> None:
    """float32 ops against float64: within a few ulps of the terms' scale."""
    err = np.abs(got.double().numpy().reshape(want.shape) - want)
    assert float(err.max()) < tol * max(1.0, float(np.abs(want).max())), float(err.max())


def test_matrix_noise_is_the_reference_low_rank_product_and_vectors_are_philox():
    for seed, name, (m, n), rank in [(5, "a", (40, 50), R), (2**62, "layer.q.weight", (7, 300), 1),
                                     (9, "w", (33, 8), 8)]:  # fmt: skip
        got = tensor_noise(seed, name, m * n, scheme=f"lowrank-v1-r{rank}", shape=(m, n))
        want = ref_eps(seed, name, m, n, rank)
        assert_matches(got, want)
        assert np.linalg.matrix_rank(want) == min(rank, m, n)
    # not a matrix: the full-rank philox-v2 stream of the same name, bit for bit
    vec = tensor_noise(5, "c", 777, scheme=LR)
    assert torch.equal(vec, tensor_noise(5, "c", 777, scheme="philox-v2"))
    with pytest.raises(ValueError, match="noise must be one of"):
        tensor_noise(0, "w", 4, scheme="lowrank-v1-r0")


def test_elements_have_variance_one():
    # E[eps^2] = 1 for every element; over one large matrix the mean square is 1 within the
    # spread of R norms of 500-dimensional factor columns (a few percent).
    z = tensor_noise(2024, "stats", 500 * 400, scheme="lowrank-v1-r4", shape=(500, 400)).double()
    assert abs(z.mean().item()) < 0.05 and abs(z.square().mean().item() - 1) < 0.2


@pytest.mark.parametrize("chunk", [16, 48, 2**18])
def test_chunks_and_threads_do_not_change_the_perturbation(two_tensors, chunk):
    # zero weights and sigma 1: the perturbed weights are eps itself
    for threads in (1, 2):
        model = two_tensors()
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        opt = ESOptimizer(model, sigma=1.0, noise=LR, noise_block=16, chunk_size=chunk,
                          threads=threads)  # fmt: skip
        with opt.perturbed(31):
            for name, p in model.named_parameters():
                want = tensor_noise(31, name, p.numel(), scheme=LR, shape=tuple(p.shape))
                assert torch.equal(p.detach().flatten(), want), (name, chunk, threads)
        opt.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_perturb_and_restore_are_bit_exact(two_tensors, dtype):
    model = two_tensors(dtype)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = ESOptimizer(model, sigma=0.01, noise=LR, **SMALL)
    for seed in range(4):
        with opt.perturbed(seed, sign=1 if seed % 2 else -1):
            assert not torch.equal(model.a.detach(), before["a"])
        for n, p in model.named_parameters():
            assert torch.equal(p.detach(), before[n]), n


def test_an_update_moves_each_matrix_along_its_drawn_factors(two_tensors):
    opt = ESOptimizer(two_tensors(), sigma=0.01, alpha=0.01, noise=LR, **SMALL)
    start = {n: t.double().clone() for n, t in opt.master_parameters()}
    coef = 0.3
    opt.apply(UpdateRecord(1, ((77, coef),), 0.01, 0.01, noise=LR))
    for name in ("a", "b"):
        delta = dict(opt.master_parameters())[name].double() - start[name]
        a, b = ref_factors(77, name, 40, 50)
        assert_matches(delta, coef * a @ b.T / math.sqrt(R), tol=1e-6)
        d = delta.numpy()
        # rank R; its columns lie in span(A), its rows in span(B)
        assert np.linalg.matrix_rank(d, tol=1e-6 * np.abs(d).max()) == R
        for basis, mat in ((a, d), (b, d.T)):
            q, _ = np.linalg.qr(basis)
            assert np.abs(mat - q @ (q.T @ mat)).max() < 1e-6 * np.abs(mat).max()
    # the vector moved along its full-rank philox-v2 noise
    delta_c = dict(opt.master_parameters())["c"].double() - start["c"]
    want_c = coef * tensor_noise(77, "c", 777, scheme="philox-v2").double()
    torch.testing.assert_close(delta_c, want_c, rtol=1e-5, atol=1e-7)


def test_replay_from_the_log_and_checkpoints_are_bit_exact(two_tensors, tmp_path):
    opt = ESOptimizer(two_tensors(), noise=LR, **SMALL)
    run_updates(opt, 3)
    assert all(r.noise == LR for r in opt.log)
    fresh = ESOptimizer(two_tensors(), noise=LR, **SMALL)
    assert fresh.replay(opt.log) == 3 and fresh.weights_hash() == opt.weights_hash()
    for (name, x), (_, y) in zip(fresh.master_parameters(), opt.master_parameters(), strict=True):
        assert torch.equal(x, y), name
    # another chunking replays the same bits (the values do not depend on it)
    other = ESOptimizer(two_tensors(), noise=LR, noise_block=16, chunk_size=16, threads=2)
    other.replay(opt.log)
    assert other.weights_hash() == opt.weights_hash()
    save_checkpoint(opt, tmp_path)
    doc = read_checkpoint(tmp_path)
    assert doc["config"]["noise"]["scheme"] == LR
    assert load_checkpoint(two_tensors(), tmp_path, **SMALL).weights_hash() == opt.weights_hash()
    # the noise does not depend on the device type: a log made elsewhere loads here
    doc["config"]["noise"]["device_type"] = "cuda"
    (tmp_path / "es_checkpoint.json").write_text(json.dumps(doc))
    assert load_checkpoint(two_tensors(), tmp_path).weights_hash() == opt.weights_hash()
    # another rank is another scheme: its log is refused
    with pytest.raises(ValueError, match="lowrank-v1-r3"):
        ESOptimizer(two_tensors(), noise="lowrank-v1-r2", **SMALL).replay(opt.log)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cpu_and_cuda_low_rank_noise_agree(two_tensors):
    for seed, name, shape in [(1, "w", (40, 50)), (2**40, "layer.3.q", (1024, 513))]:
        n = math.prod(shape)
        cpu = tensor_noise(seed, name, n, scheme=LR, shape=shape)
        gpu = tensor_noise(seed, name, n, scheme=LR, shape=shape, device="cuda").cpu()
        torch.testing.assert_close(gpu, cpu, rtol=1e-5, atol=1e-6)
    # a log made on the GPU replays on the CPU to within the factors' tolerance
    gpu_opt = ESOptimizer(two_tensors().cuda(), noise=LR, **SMALL)
    run_updates(gpu_opt, 3)
    cpu_opt = ESOptimizer(two_tensors(), noise=LR, **SMALL)
    cpu_opt.replay(gpu_opt.log)
    for (name, a), (_, b) in zip(
        cpu_opt.master_parameters(), gpu_opt.master_parameters(), strict=True
    ):
        torch.testing.assert_close(a, b.cpu(), rtol=1e-5, atol=1e-7, msg=name)
