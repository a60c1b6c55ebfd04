"""Device-independent noise (scheme philox-v2): an independent reference, statistics,
bit-exact perturb/restore/replay, and checkpoints that record their scheme.

The reference below is written from the published algorithm (Salmon et al., "Parallel
random numbers: as easy as 1, 2, 3", SC'11; Random123) and the stream definition in the
docstring of runner/es/noise.py, as plain scalar Python: it calls nothing from runner.es.
Its Philox is checked against Random123's known-answer vectors (tests/kat_vectors of
github.com/DEShawResearch/random123, the three ``philox4x32 10`` lines), so no expected
number here comes from the code under test.
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
import torch

from runner.es import (
    ESOptimizer,
    UpdateRecord,
    fill_noise,
    load_checkpoint,
    philox4x32_10,
    philox_uniforms,
    philox_words,
    read_checkpoint,
    save_checkpoint,
    tensor_noise,
)
from runner.es.noise import PhiloxScratch

V2 = "philox-v2"
V1 = "blockseed-v1"
SMALL = {"noise_block": 256, "chunk_size": 512}
M32 = 0xFFFFFFFF

# counter[4], key[2] -> result[4]; Random123 tests/kat_vectors, "philox4x32 10" lines.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((M32, M32, M32, M32), (M32, M32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


# ---------------------------------------------------------------------- the reference
def ref_philox(ctr: tuple[int, ...], key: tuple[int, int]) -> list[int]:
    """Philox4x32-10 on Python ints, straight from the paper."""
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for _ in range(10):
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & M32, (p0 >> 32) ^ c3 ^ k1, p0 & M32
        k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
    return [c0, c1, c2, c3]


def ref_key(seed: int, name: str) -> tuple[int, int]:
    msg = b"runner.es.noise/v2\0" + seed.to_bytes(8, "little") + name.encode() + b"\0"
    k = int.from_bytes(hashlib.blake2b(msg, digest_size=8).digest(), "little")
    return k & M32, k >> 32


def ref_stream(seed: int, name: str, start: int, count: int, key: tuple[int, int] | None = None):
    """(words, float32 uniforms, float64 normals) of elements [start, start + count) of the
    stream of (seed, name), or of the stream under ``key``."""
    key = ref_key(seed, name) if key is None else key
    two_pi = np.float32(2 * math.pi)
    words, unis, normals = [], [], []
    cache: dict[int, list[int]] = {}
    for j in range(start, start + count):
        q, lane = divmod(j, 4)
        if q not in cache:
            cache[q] = ref_philox((q & M32, q >> 32, 0, 0), key)
        x = cache[q]
        u = [np.float32(2 * w + 1) * np.float32(2.0**-33) for w in x]  # one rounding each
        a = lane - lane % 2  # the pair (a, a + 1): log from lane a, angle from lane a + 1
        r = math.sqrt(-2.0 * math.log(float(u[a])))
        t = float(two_pi * u[a + 1])  # a float32 product
        words.append(x[lane])
        unis.append(u[lane])
        normals.append(r * (math.cos(t) if lane % 2 == 0 else math.sin(t)))
    return (
        np.array(words, dtype=np.int64),
        np.array(unis, dtype=np.float32),
        np.array(normals, dtype=np.float64),
    )


def assert_normals_close(got: torch.Tensor, ref: np.ndarray, rel: float = 1e-6) -> None:
    g = got.double().numpy()
    err = np.abs(g - ref)
    assert bool(np.all(err <= rel * np.abs(ref) + 1e-30)), float(np.max(err / np.abs(ref)))


# ---------------------------------------------------------------------- (a) reference
@pytest.mark.parametrize(("ctr", "key", "expected"), KAT)
def test_philox_matches_random123_known_answers(ctr, key, expected):
    assert tuple(ref_philox(ctr, key)) == expected  # the reference is right ...
    got = philox4x32_10(tuple(torch.tensor([w]) for w in ctr), key)
    assert tuple(int(x.item()) for x in got) == expected  # ... and so are the int64 ops


@pytest.mark.parametrize(
    ("seed", "name", "start", "count"),
    [
        (0, "w", 0, 1),
        (12345, "layer.0.weight", 0, 1001),
        (2**63 - 1, "model.embed_tokens.weight", 3, 257),  # unaligned start, odd length
        (7, "b", 4 * (2**32 - 3), 30),  # the counter's second word turns over
        (99, "c", 2**31 + 2, 9),  # unaligned start and end, large index
    ],
)
def test_words_and_uniforms_equal_the_reference_bitwise(seed, name, start, count):
    words, unis, _ = ref_stream(seed, name, start, count)
    got_w = philox_words(seed, name, start, count)
    got_u = philox_uniforms(seed, name, start, count)
    assert got_w.dtype == torch.int64 and got_u.dtype == torch.float32
    np.testing.assert_array_equal(got_w.numpy(), words)
    assert got_u.numpy().view(np.uint32).tolist() == unis.view(np.uint32).tolist()
    assert bool(((unis > 0) & (unis <= 1)).all())


@pytest.mark.parametrize(
    ("seed", "name", "numel"),
    [(1, "w", 1), (2, "w", 3), (3, "layer.1.mlp", 1000), (4, "x", 20001)],
)
def test_normals_equal_the_reference_within_1e_6(seed, name, numel):
    _, _, ref = ref_stream(seed, name, 0, numel)
    got = tensor_noise(seed, name, numel, scheme=V2)
    assert got.dtype == torch.float32 and got.shape == (numel,)
    assert_normals_close(got, ref)


def test_sub_chunks_do_not_change_the_values():
    # A scratch of 27 quads cuts a fill into many sub-chunks, the first starting mid-quad.
    numel, start = 3000, 1001
    scratch = PhiloxScratch("cpu", 100)
    assert scratch.quads == 27
    got = fill_noise(torch.empty(numel), 8, "w", start, scheme=V2, scratch=scratch)
    assert torch.equal(got, tensor_noise(8, "w", start + numel, scheme=V2)[start:])
    assert_normals_close(got, ref_stream(8, "w", start, numel)[2])


def test_chunked_fills_equal_the_whole_stream_bitwise_at_any_start():
    numel = 2**17 + 1300  # more than one CPU sub-chunk, not a multiple of the chunk
    whole = tensor_noise(5, "w", numel, scheme=V2)
    assert_normals_close(whole[-3000:], ref_stream(5, "w", numel - 3000, 3000)[2])
    # The stream does not depend on the block size, nor on where a fill starts or ends.
    assert torch.equal(whole, tensor_noise(5, "w", numel, block=256, scheme=V2))
    for chunk in (512, 1000, 4099):
        parts = [
            fill_noise(torch.empty(min(chunk, numel - s)), 5, "w", s, block=256, scheme=V2)
            for s in range(0, numel, chunk)
        ]
        assert torch.equal(torch.cat(parts), whole), chunk
    # A shorter draw is a prefix of a longer one (unlike blockseed-v1's last block).
    assert torch.equal(tensor_noise(5, "w", 100, scheme=V2), whole[:100])


def test_optimizer_perturbation_is_the_reference_stream(two_tensors):
    # Zero weights and sigma = 1: the perturbed fp32 weights are eps itself, made chunk by
    # chunk (chunk 512, blocks of 256) over tensors of 2000, 2000, 777 and 3 elements.
    for threads in (1, 2):
        model = two_tensors(torch.float32)
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        opt = ESOptimizer(model, sigma=1.0, noise=V2, threads=threads, **SMALL)
        with opt.perturbed(31):
            for name, p in model.named_parameters():
                flat = p.detach().flatten()
                assert torch.equal(flat, tensor_noise(31, name, p.numel(), scheme=V2)), name
                assert_normals_close(flat, ref_stream(31, name, 0, p.numel())[2])
        opt.close()


# ---------------------------------------------------------------------- (b) statistics
N_STAT = 2**20


def _corr(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.corrcoef(torch.stack([a.double(), b.double()]))[0, 1].item()


def test_normals_have_mean_0_std_1_and_normal_quantiles():
    z = tensor_noise(2024, "stats", N_STAT, scheme=V2).double()
    n = z.numel()
    assert abs(z.mean().item()) < 5 / math.sqrt(n)
    assert abs(z.std().item() - 1) < 5 / math.sqrt(2 * n)
    # The fraction below a few normal quantiles, each within 5 binomial standard errors.
    for x in (-2.5, -1.0, 0.0, 0.5, 2.0):
        p = 0.5 * math.erfc(-x / math.sqrt(2))
        frac = (z < x).double().mean().item()
        assert abs(frac - p) < 5 * math.sqrt(p * (1 - p) / n), x
    # Fourth moment 3 (the standard error of the mean of z**4 is sqrt(96 / n)).
    assert abs((z**4).mean().item() - 3) < 5 * math.sqrt(96 / n)
    assert z.abs().max().item() <= math.sqrt(-2 * math.log(2.0**-33)) + 1e-5


def test_uniforms_and_words_are_uniform():
    n = 2**18
    u = philox_uniforms(11, "u", 0, n).double()
    assert abs(u.mean().item() - 0.5) < 5 * math.sqrt(1 / 12 / n)
    w = philox_words(11, "u", 0, n)
    for bit in range(32):  # every bit of the words is set half of the time
        frac = ((w >> bit) & 1).double().mean().item()
        assert abs(frac - 0.5) < 5 * 0.5 / math.sqrt(n), bit


def test_no_correlation_between_neighbours_seeds_or_names():
    z = tensor_noise(3, "w", N_STAT, scheme=V2)
    se = 5 / math.sqrt(N_STAT)  # corr of independent vectors ~ N(0, 1/n)
    for lag in (1, 2, 3, 4, 5, 8):  # within a pair, across lanes and across counters
        assert abs(_corr(z[:-lag], z[lag:])) < se, lag
    # The two normals of one Box-Muller pair share r: their squares must not correlate.
    even, odd = z[0::2], z[1::2]
    assert abs(_corr(even**2, odd**2)) < 5 / math.sqrt(even.numel())
    others = {
        "seed": tensor_noise(4, "w", N_STAT, scheme=V2),
        "name": tensor_noise(3, "w2", N_STAT, scheme=V2),
        "seed+1": tensor_noise(2**62 + 3, "w", N_STAT, scheme=V2),
    }
    for label, other in others.items():
        assert abs(_corr(z, other)) < se, label
    # Two same-shape tensors of one model get distinct noise for one seed.
    assert not torch.equal(others["name"], z)


# ---------------------------------------------------------------------- (c) exactness
def masters(opt: ESOptimizer) -> dict[str, torch.Tensor]:
    return {n: m.clone() for n, m in opt.master_parameters()}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8)), name


def run_updates(opt: ESOptimizer, updates: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(updates):
        seeds = rng.choice(2**62, size=6, replace=False)
        rewards = rng.normal(size=6)
        opt.step([(int(s), float(r), opt.version) for s, r in zip(seeds, rewards, strict=True)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_perturb_and_restore_are_bit_exact(two_tensors, dtype):
    model = two_tensors(dtype)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = ESOptimizer(model, sigma=0.0015, noise=V2, **SMALL)
    for seed in range(6):
        with opt.perturbed(seed, sign=1 if seed % 2 else -1):
            pert = {n: p.detach().clone() for n, p in model.named_parameters()}
        for name, m in opt.master_parameters():
            # eps * (sign * sigma) in fp32, then added to the master (fp32, or fp64 for fp64)
            eps = tensor_noise(seed, name, m.numel(), scheme=V2).view(m.shape)
            expected = ((eps * ((1 if seed % 2 else -1) * 0.0015)).to(m.dtype) + m).to(dtype)
            assert torch.equal(pert[name], expected), (seed, name)
    assert_same({n: p.detach() for n, p in model.named_parameters()}, before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_update_log_replays_bit_exactly(two_tensors, dtype):
    opt = ESOptimizer(two_tensors(dtype), noise=V2, **SMALL)
    run_updates(opt, 4)
    assert all(r.noise == V2 for r in opt.log)
    log = json.loads(json.dumps([r.to_dict() for r in opt.log]))
    fresh = ESOptimizer(two_tensors(dtype), noise=V2, noise_block=128, chunk_size=1024, threads=2)
    assert fresh.replay(log) == 4
    assert_same(masters(fresh), masters(opt))
    for (n, p), (_, q) in zip(
        fresh.model.named_parameters(), opt.model.named_parameters(), strict=True
    ):
        assert torch.equal(p, q), n
    assert fresh.log == opt.log
    fresh.close()


def test_workspace_is_one_chunk_plus_a_fixed_scratch(two_tensors):
    opt = ESOptimizer(two_tensors(), noise=V2, noise_block=256, chunk_size=512, threads=2)
    with opt.perturbed(0):
        pass
    # A noise chunk plus six int64 rows of Philox counters for one chunk (+ 2 quads of slack
    # for a chunk that starts mid-quad): 48 bytes per 4 elements.
    per_thread = 512 * 4 + -(-(512 + 6) // 4) * 6 * 8
    assert opt.workspace_bytes == 2 * per_thread
    opt.close()


# ---------------------------------------------------------------------- (d) checkpoints
def test_old_checkpoint_without_a_scheme_replays_the_old_stream(two_tensors, tmp_path, ref_noise):
    opt = ESOptimizer(two_tensors(), **SMALL)  # the default scheme is still blockseed-v1
    assert opt.noise_scheme == V1
    base = masters(opt)
    opt.apply(UpdateRecord(1, ((77, 0.25),), 0.0015, 0.00075))
    run_updates(opt, 2)
    save_checkpoint(opt, tmp_path)
    doc = read_checkpoint(tmp_path)
    assert doc["config"]["noise"]["scheme"] == V1
    # An old checkpoint: no scheme in the config, no scheme in the records.
    del doc["config"]["noise"]["scheme"]
    for r in doc["log"]:
        r.pop("noise", None)
    (tmp_path / "es_checkpoint.json").write_text(json.dumps(doc))
    loaded = load_checkpoint(two_tensors(), tmp_path, version=1, **SMALL)
    assert loaded.noise_scheme == V1
    # Version 1 = base + fl(0.25 * eps) with eps from the independent blockseed-v1 reference.
    for name, m in masters(loaded).items():
        eps = ref_noise(77, name, m.numel(), 256).view(m.shape)
        assert torch.equal(m, base[name] + eps * 0.25), name
    assert_same(masters(load_checkpoint(two_tensors(), tmp_path, **SMALL)), masters(opt))
    with pytest.raises(ValueError, match="'philox-v2'.*'blockseed-v1'"):
        load_checkpoint(two_tensors(), tmp_path, noise=V2, **SMALL)


def test_new_checkpoint_records_its_scheme_and_a_mismatch_is_an_error(two_tensors, tmp_path):
    opt = ESOptimizer(two_tensors(torch.bfloat16), noise=V2, **SMALL)
    run_updates(opt, 3)
    save_checkpoint(opt, tmp_path)
    doc = read_checkpoint(tmp_path)
    assert doc["config"]["noise"]["scheme"] == V2
    assert all(r["noise"] == V2 for r in doc["log"])
    loaded = load_checkpoint(two_tensors(torch.bfloat16), tmp_path, **SMALL)
    assert loaded.noise_scheme == V2
    assert_same(masters(loaded), masters(opt))
    with pytest.raises(ValueError, match="'blockseed-v1'.*'philox-v2'"):
        load_checkpoint(two_tensors(torch.bfloat16), tmp_path, noise=V1, **SMALL)
    # philox-v2 does not depend on the block size, nor on the device type it was made on.
    other = load_checkpoint(two_tensors(torch.bfloat16), tmp_path, noise_block=128)
    assert_same(masters(other), masters(opt))
    doc["config"]["noise"]["device_type"] = "cuda"
    (tmp_path / "es_checkpoint.json").write_text(json.dumps(doc))
    assert_same(masters(load_checkpoint(two_tensors(torch.bfloat16), tmp_path)), masters(opt))


def test_replaying_records_of_another_scheme_is_an_error(two_tensors):
    new = ESOptimizer(two_tensors(), noise=V2, **SMALL)
    run_updates(new, 1)
    old = ESOptimizer(two_tensors(), **SMALL)
    with pytest.raises(ValueError, match="'philox-v2'.*'blockseed-v1'"):
        old.replay(new.log)
    run_updates(old, 1)
    with pytest.raises(ValueError, match="'blockseed-v1'.*'philox-v2'"):
        ESOptimizer(two_tensors(), noise=V2, **SMALL).replay(old.log)
    # Records that name no scheme (a coordinator's UpdateRule) replay on either.
    stamped = old.log[0].to_dict()
    assert stamped["noise"] == V1
    bare = [UpdateRecord.from_dict({k: v for k, v in stamped.items() if k != "noise"})]
    assert bare[0].noise is None and "noise" not in bare[0].to_dict()
    assert ESOptimizer(two_tensors(), noise=V2, **SMALL).replay(bare) == 1


def test_a_coordinators_rule_stamps_the_run_scheme(two_tensors):
    # the orchestrator's UpdateRule is built with the run's es.noise, so its records are
    # refused by a worker whose optimizer draws another scheme
    from runner.es import UpdateRule

    record = UpdateRule(sigma=0.01, alpha=0.01, noise=V2).make([(5, 1.0, 0), (6, 0.0, 0)], 0)
    assert record.noise == V2 and record.to_dict()["noise"] == V2
    assert ESOptimizer(two_tensors(), noise=V2, **SMALL).replay([record]) == 1
    with pytest.raises(ValueError, match="'philox-v2'.*'blockseed-v1'"):
        ESOptimizer(two_tensors(), **SMALL).replay([record])
    assert UpdateRule(sigma=0.01, alpha=0.01).make([(5, 1.0, 0)], 0).noise is None


def test_unknown_scheme_is_rejected(two_tensors):
    with pytest.raises(ValueError, match="noise must be one of blockseed-v1, philox-v2"):
        ESOptimizer(two_tensors(), noise="philox", **SMALL)
    with pytest.raises(ValueError, match="noise must be one of"):
        tensor_noise(0, "w", 4, scheme="randn")


# ---------------------------------------------------------------------- (e) CUDA
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device to compare CPU and CUDA draws"
)
def test_cpu_and_cuda_draws_agree(two_tensors):
    for seed, name, start, count in [(1, "w", 0, 3001), (2**40, "layer.3.q", 5, 2**20 + 7)]:
        w_cpu = philox_words(seed, name, start, count)
        w_gpu = philox_words(seed, name, start, count, device="cuda").cpu()
        assert torch.equal(w_cpu, w_gpu)
        u_cpu = philox_uniforms(seed, name, start, count)
        u_gpu = philox_uniforms(seed, name, start, count, device="cuda").cpu()
        assert torch.equal(u_cpu.view(torch.int32), u_gpu.view(torch.int32))
        z_cpu = torch.empty(count)
        fill_noise(z_cpu, seed, name, start, scheme=V2)
        z_gpu = torch.empty(count, device="cuda")
        fill_noise(z_gpu, seed, name, start, scheme=V2)
        torch.testing.assert_close(z_gpu.cpu(), z_cpu, rtol=1e-6, atol=1e-30)
    # A log made on the GPU replays on the CPU to within the normals' tolerance.
    gpu = ESOptimizer(two_tensors().cuda(), noise=V2, **SMALL)
    run_updates(gpu, 3)
    cpu = ESOptimizer(two_tensors(), noise=V2, **SMALL)
    cpu.replay(gpu.log)
    for (name, a), (_, b) in zip(cpu.master_parameters(), gpu.master_parameters(), strict=True):
        torch.testing.assert_close(a, b.cpu(), rtol=1e-6, atol=1e-7, msg=name)
