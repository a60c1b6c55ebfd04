"""Noise streams: documented definition, one stream per tensor, seed determinism."""

from __future__ import annotations

import math

import pytest
import torch

from runner.es import ESOptimizer, block_seed, fill_noise, tensor_noise

SMALL = {"noise_block": 256, "chunk_size": 512}


def perturbation(opt: ESOptimizer, seed: int, sign: int = 1) -> dict[str, torch.Tensor]:
    with opt.perturbed(seed, sign):
        return {n: p.detach().clone() for n, p in opt.model.named_parameters()}


def test_stream_matches_the_documented_definition(ref_noise):
    for numel, block in [(1, 256), (255, 256), (256, 256), (1000, 256), (5000, 2**18)]:
        got = tensor_noise(12345, "layer.0.weight", numel, block=block)
        assert torch.equal(got, ref_noise(12345, "layer.0.weight", numel, block))


def test_fill_noise_from_any_block_start_equals_the_whole_stream():
    whole = tensor_noise(7, "w", 2000, block=256)
    out = torch.empty(512)
    fill_noise(out, 7, "w", 768, block=256)
    assert torch.equal(out, whole[768:1280])
    with pytest.raises(ValueError, match="multiple of the noise block"):
        fill_noise(out, 7, "w", 100, block=256)
    # A partial block is only allowed at the tensor's end: its draw is not a prefix.
    tail = torch.empty(2000 - 1792)
    fill_noise(tail, 7, "w", 1792, block=256, numel=2000)
    assert torch.equal(tail, whole[1792:])
    assert not torch.equal(tensor_noise(7, "w", 100, block=256), whole[:100])
    with pytest.raises(ValueError, match="only the tensor's last block"):
        fill_noise(torch.empty(100), 7, "w", 0, block=256, numel=2000)


def test_block_seeds_are_not_python_hash_and_differ_by_every_input():
    seeds = {block_seed(s, n, b) for s in (0, 1) for n in ("a", "b") for b in (0, 1)}
    assert len(seeds) == 8
    assert all(0 <= s < 2**63 for s in seeds)


def test_same_shape_tensors_get_distinct_uncorrelated_noise(two_tensors):
    model = two_tensors()
    opt = ESOptimizer(model, sigma=1.0, **SMALL)
    base = {n: m.clone() for n, m in opt.master_parameters()}
    pert = perturbation(opt, seed=42)
    ea, eb = (pert["a"] - base["a"]).flatten(), (pert["b"] - base["b"]).flatten()
    assert not torch.equal(ea, eb)
    corr = torch.corrcoef(torch.stack([ea, eb]))[0, 1].item()
    # Independent N(0,1) vectors of n=2000: corr ~ N(0, 1/n); 5 standard errors.
    assert abs(corr) < 5 / math.sqrt(ea.numel())
    for e in (ea, eb):
        assert abs(e.mean().item()) < 5 / math.sqrt(e.numel())
        assert abs(e.std().item() - 1) < 5 / math.sqrt(2 * e.numel())


def test_same_seed_same_perturbation_across_instances_chunkings_and_threads(two_tensors):
    a = perturbation(ESOptimizer(two_tensors(torch.bfloat16), **SMALL), seed=9)
    b = perturbation(ESOptimizer(two_tensors(torch.bfloat16), **SMALL), seed=9)
    c = perturbation(
        ESOptimizer(two_tensors(torch.bfloat16), noise_block=256, chunk_size=2048, threads=2),
        seed=9,
    )
    for name in a:
        assert torch.equal(a[name], b[name])
        assert torch.equal(a[name], c[name])
    d = perturbation(ESOptimizer(two_tensors(torch.bfloat16), **SMALL), seed=10)
    assert not torch.equal(a["a"], d["a"])


def test_perturbation_is_cast_of_master_plus_sigma_eps(two_tensors, ref_noise):
    sigma = 0.0015
    for dtype in (torch.float32, torch.bfloat16):
        opt = ESOptimizer(two_tensors(dtype), sigma=sigma, **SMALL)
        masters = {n: m.clone() for n, m in opt.master_parameters()}
        for sign in (1, -1):
            pert = perturbation(opt, seed=3, sign=sign)
            for name, m in masters.items():
                eps = ref_noise(3, name, m.numel(), 256).view(m.shape)
                expected = (eps * (sign * sigma) + m).to(dtype)
                assert torch.equal(pert[name], expected), (dtype, sign, name)
