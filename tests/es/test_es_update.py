"""Updates: a float64 reference computed here, shaping, staleness, antithetic pairs, bf16."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runner.es import DropOver, ESOptimizer, LagWeighted, Result

SMALL = {"noise_block": 256, "chunk_size": 512}
SIGMA, ALPHA, N = 0.0015, 0.00075, 30  # the published setting


def cohort(rng: np.random.Generator, n: int, version: int = 0) -> list[tuple[int, float, int]]:
    seeds = rng.choice(2**62, size=n, replace=False)
    return [(int(s), float(r), version) for s, r in zip(seeds, rng.normal(size=n), strict=True)]


def reference_zscore(rewards: list[float]) -> np.ndarray:
    r = np.array(rewards, dtype=np.float64)
    return (r - r.mean()) / (np.sqrt(((r - r.mean()) ** 2).mean()) + 1e-8)


def test_one_update_equals_an_independent_float64_reference(two_tensors, ref_noise):
    model = two_tensors(torch.float32)
    m0 = {n: p.detach().double().clone() for n, p in model.named_parameters()}
    opt = ESOptimizer(model, sigma=SIGMA, alpha=ALPHA, **SMALL)
    results = cohort(np.random.default_rng(1), N)
    record = opt.step(results)
    assert opt.version == 1 and record.version == 1 and opt.log == [record]

    z = reference_zscore([r for _, r, _ in results])
    got = dict(opt.master_parameters())
    for name, base in m0.items():
        terms = [
            ALPHA / N * zi * ref_noise(s, name, base.numel(), 256).double().view(base.shape)
            for (s, _, _), zi in zip(results, z, strict=True)
        ]
        delta = sum(terms)
        ref = base + delta
        m = got[name].double()
        assert ((m - ref).norm() / ref.norm()).item() < 1e-6, name
        # Stronger, elementwise: the classic bound for summing N terms in fp32 and adding
        # the sum to the weight, |err| <= N * u * sum|terms| + ulp(result), u = 2**-24.
        ref32 = ref.float()
        ulp = (torch.nextafter(ref32.abs(), torch.tensor(float("inf"))) - ref32.abs()).double()
        bound = N * 2.0**-24 * sum(t.abs() for t in terms) + ulp
        assert bool(((m - ref).abs() <= bound).all()), name
        if name in ("a", "b"):  # 0.02-scale weights: the update itself is kept to 1e-4
            assert (((m - base) - delta).norm() / delta.norm()).item() < 1e-4
        # Working weights are the re-cast master.
        assert torch.equal(model.get_parameter(name).detach(), got[name])


def test_record_coefficients_follow_the_published_formula():
    opt = ESOptimizer(torch.nn.Linear(4, 3), sigma=SIGMA, alpha=ALPHA)
    results = cohort(np.random.default_rng(2), N)
    record = opt.step(results)
    z = reference_zscore([r for _, r, _ in results])
    assert [s for s, _ in record.entries] == [s for s, _, _ in results]
    np.testing.assert_allclose([c for _, c in record.entries], ALPHA / N * z, rtol=1e-12)
    assert record.sigma == SIGMA and record.alpha == ALPHA and record.n_accepted == N


def test_centered_rank_and_raw_shaping():
    opt = ESOptimizer(torch.nn.Linear(2, 2), alpha=1.0, shaping="centered_rank")
    rec = opt.step([(1, 3.0, 0), (2, 1.0, 0), (3, 2.0, 0), (4, 2.0, 0)])
    # ranks 3, 0, 1.5, 1.5 over n-1=3, minus 1/2; times alpha/N = 1/4.
    np.testing.assert_allclose([c for _, c in rec.entries], [0.125, -0.125, 0.0, 0.0], atol=1e-15)
    opt = ESOptimizer(torch.nn.Linear(2, 2), alpha=2.0, shaping="raw")
    rec = opt.step([(1, 3.0, 0), (2, -1.0, 0)])
    assert [c for _, c in rec.entries] == [3.0, -1.0]


def test_drop_over_discards_stale_results_and_equals_the_fresh_only_update(two_tensors):
    rng = np.random.default_rng(3)
    opt = ESOptimizer(two_tensors(), staleness="drop_over:1", **SMALL)
    fresh_only = ESOptimizer(two_tensors(), staleness=DropOver(1), **SMALL)
    for o in (opt, fresh_only):  # advance both to version 2 identically
        o.step([(11, 1.0, 0), (12, 0.0, 0)])
        o.step([(13, 1.0, 1), (14, 0.0, 1)])
    fresh = [(s, r, 2) for s, r, _ in cohort(rng, 6)]
    one_stale = [(s, r, 1) for s, r, _ in cohort(rng, 3)]
    two_stale = [(s, r, 0) for s, r, _ in cohort(rng, 3)]
    rec = opt.step(fresh + one_stale + two_stale)
    assert rec.n_accepted == 9 and rec.lags == (0,) * 6 + (1,) * 3
    assert sorted(d["seed"] for d in rec.dropped) == sorted(s for s, _, _ in two_stale)
    assert all(d["lag"] == 2 for d in rec.dropped)
    fresh_only.step(fresh + one_stale)
    for (_, a), (_, b) in zip(opt.master_parameters(), fresh_only.master_parameters(), strict=True):
        assert torch.equal(a, b)


def test_lag_weighted_scales_coefficients_by_gamma_to_the_lag():
    opt = ESOptimizer(torch.nn.Linear(2, 2), alpha=1.0, staleness="lag_weighted:0.5")
    for _ in range(3):
        opt.step([(1, 0.0, opt.version)])
    results = [(10, 1.0, 3), (11, 2.0, 2), (12, 4.0, 0)]
    rec = opt.step(results)
    z = reference_zscore([1.0, 2.0, 4.0])
    np.testing.assert_allclose(
        [c for _, c in rec.entries], z * np.array([1.0, 0.5, 0.125]) / 3, rtol=1e-12
    )
    assert LagWeighted(0.5).spec() == "lag_weighted:0.5"


def test_antithetic_pairs_merge_and_unpaired_results_are_dropped():
    opt = ESOptimizer(torch.nn.Linear(2, 2), alpha=1.0, antithetic=True)
    rec = opt.step([Result(1, 3.0, 0, 1), Result(1, 1.0, 0, -1), (2, 2.0, 0, 1), (2, 2.0, 0, -1),
                    (3, 9.0, 0, 1)])  # fmt: skip
    z = reference_zscore([3.0, 1.0, 2.0, 2.0])
    np.testing.assert_allclose(
        [c for _, c in rec.entries], [(z[0] - z[1]) / 4, (z[2] - z[3]) / 4], atol=1e-15
    )
    assert rec.dropped[0]["seed"] == 3 and "antithetic" in rec.dropped[0]["reason"]


def test_antithetic_perturbation_is_the_mirror_image(two_tensors):
    opt = ESOptimizer(two_tensors(), sigma=0.1, antithetic=True, **SMALL)
    m = dict(opt.master_parameters())["c"].clone()
    with opt.perturbed(4, 1):
        plus = opt.model.c.detach() - m
    with opt.perturbed(4, -1):
        minus = opt.model.c.detach() - m
    torch.testing.assert_close(plus, -minus, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"shaping": "softmax"}, "shaping must be one of"),
        ({"sigma": -0.1}, "sigma must be > 0"),
        ({"sigma": float("nan")}, "sigma must be finite"),
        ({"alpha": -1.0}, "alpha must be >= 0"),
        ({"staleness": "drop_over:x"}, "staleness must be"),
        ({"staleness": "lag_weighted:2"}, "gamma must be"),
        ({"staleness": "sometimes"}, "staleness must be"),
        ({"chunk_size": 1000, "noise_block": 256}, "chunk_size must be"),
    ],
)
def test_bad_configuration_raises_a_value_error_naming_it(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ESOptimizer(torch.nn.Linear(2, 2), **kwargs)


def test_bad_results_raise_value_errors():
    opt = ESOptimizer(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="beyond the current version"):
        opt.step([(1, 1.0, 1)])
    with pytest.raises(ValueError, match="appears twice"):
        opt.step([(1, 1.0, 0), (1, 2.0, 0)])
    with pytest.raises(ValueError, match="not finite"):
        opt.step([(1, float("nan"), 0)])
    with pytest.raises(ValueError, match="seed must be"):
        opt.step([(-1, 1.0, 0)])
    with pytest.raises(ValueError, match="at least one"):
        opt.step([])
    assert opt.version == 0 and opt.log == []


def test_bf16_master_keeps_the_updates_a_naive_in_place_update_loses(ref_noise, capsys):
    """Ten published-size updates on bf16 weights of LLM scale (N(0, 0.02))."""
    g = torch.Generator().manual_seed(0)
    w0 = (0.02 * torch.randn(256, 256, generator=g)).to(torch.bfloat16)

    class Matrix(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(w0.clone())

    opt = ESOptimizer(Matrix(), sigma=SIGMA, alpha=ALPHA)
    rng = np.random.default_rng(4)
    exact = w0.double().flatten()  # float64 truth
    per_seed = w0.clone().flatten()  # naive: add every seed's term in place, in bf16
    per_update = w0.clone().flatten()  # naive: sum the update in fp32, one in-place bf16 add
    unchanged_per_seed_add, unchanged_per_update_add = [], []
    for v in range(10):
        rec = opt.step(cohort(rng, N, version=v))
        total = torch.zeros_like(exact)
        for seed, coef in rec.entries:
            term = coef * ref_noise(seed, "w", exact.numel(), 2**18).double()
            total += term
            before = per_seed.clone()
            per_seed.add_(term.float())
            unchanged_per_seed_add.append((per_seed == before).double().mean().item())
        exact += total
        before = per_update.clone()
        per_update.add_(total.float())
        unchanged_per_update_add.append((per_update == before).double().mean().item())

    intended = exact - w0.double().flatten()

    def lost(x: torch.Tensor) -> float:
        return ((x.double() - exact).norm() / intended.norm()).item()

    master = dict(opt.master_parameters())["w"].double().flatten()
    figures = {
        "master_rel_error": lost(master),
        "naive_per_seed_unchanged_per_add": float(np.mean(unchanged_per_seed_add)),
        "naive_per_seed_rel_error": lost(per_seed),
        "naive_per_seed_unchanged_after_10": (per_seed == w0.flatten()).double().mean().item(),
        "naive_per_update_unchanged_per_add": float(np.mean(unchanged_per_update_add)),
        "naive_per_update_rel_error": lost(per_update),
    }
    with capsys.disabled():
        print("\nbf16 contrast:", {k: round(v, 6) for k, v in figures.items()})
    assert figures["master_rel_error"] < 1e-4  # the fp32 master moved as intended
    # Working weights are exactly the rounded master (nothing else accumulates in bf16).
    assert torch.equal(opt.model.w.detach().flatten(), master.float().to(torch.bfloat16))
    # Naive, seed by seed: most weights do not move at each add, most of the update is lost.
    assert figures["naive_per_seed_unchanged_per_add"] > 0.5
    assert figures["naive_per_seed_rel_error"] > 0.5
    # Even summing the update first, rounding each update into bf16 loses a large part.
    assert figures["naive_per_update_unchanged_per_add"] > 0.1
    assert figures["naive_per_update_rel_error"] > 0.1


def test_numpy_scalars_are_accepted_as_seeds_rewards_and_versions():
    opt = ESOptimizer(torch.nn.Linear(2, 2), alpha=1.0)
    rec = opt.step(
        [(np.int64(5), np.float32(1.0), np.int64(0)), (np.uint32(6), np.float64(0.0), 0)]
    )
    z = 0.5 / (0.5 + 1e-8)  # rewards 1 and 0: mean 0.5, population std 0.5
    assert [s for s, _ in rec.entries] == [5, 6]
    assert [c for _, c in rec.entries] == pytest.approx([0.5 * z, -0.5 * z], rel=1e-15)
    assert all(type(s) is int and type(c) is float for s, c in rec.entries)
