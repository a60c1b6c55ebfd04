"""Perturb / restore: bit-exact restore in every dtype, on plain modules and a HF causal LM."""

from __future__ import annotations

import pytest
import torch

from runner.es import ESOptimizer
from runner.models import load_tiny_model

SMALL = {"noise_block": 256, "chunk_size": 512}


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def assert_bit_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype
        # Compare raw bits, so that -0.0 vs 0.0 or NaN payloads would also be caught.
        assert torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8)), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_restore_is_bit_exact_after_many_perturbations(two_tensors, dtype):
    model = two_tensors(dtype)
    before = snapshot(model)
    opt = ESOptimizer(model, sigma=0.0015, **SMALL)
    for seed in range(20):
        with opt.perturbed(seed, sign=1 if seed % 2 else -1):
            changed = sum((p != before[n]).sum().item() for n, p in model.named_parameters())
            assert changed > 0
    assert_bit_equal(snapshot(model), before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_naive_subtraction_would_not_restore(two_tensors, dtype):
    """The trap the master avoids: w + s*e - s*e != w in floating point (much worse in bf16)."""
    model = two_tensors(dtype)
    w = model.a.detach().clone()
    e = torch.randn(w.shape, generator=torch.Generator().manual_seed(0)).to(dtype) * 0.0015
    assert not torch.equal((w + e) - e, w)


def test_restore_happens_on_exception_and_perturbations_do_not_nest(two_tensors):
    model = two_tensors(torch.bfloat16)
    before = snapshot(model)
    opt = ESOptimizer(model, **SMALL)
    with pytest.raises(KeyError), opt.perturbed(1):
        raise KeyError("evaluation failed")
    assert_bit_equal(snapshot(model), before)
    with opt.perturbed(1), pytest.raises(RuntimeError, match="do not nest"), opt.perturbed(2):
        pass
    with opt.perturbed(1), pytest.raises(RuntimeError, match="perturbed"):
        opt.step([(1, 1.0, 0)])
    assert_bit_equal(snapshot(model), before)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_hf_causal_lm_perturb_and_restore(tiny_model_dir, dtype):
    model, tok = load_tiny_model(tiny_model_dir, dtype=dtype)
    ids = torch.tensor([tok("<command>ls -la</command>")["input_ids"]])
    before = snapshot(model)
    with torch.no_grad():
        logits0 = model(ids).logits
    opt = ESOptimizer(model, sigma=0.01)
    names = [n for n, _ in opt.master_parameters()]
    assert names == [n for n, _ in model.named_parameters()]  # tied lm_head counted once
    with opt.perturbed(5), torch.no_grad():
        assert not torch.equal(model(ids).logits, logits0)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, logits0)
    assert_bit_equal(snapshot(model), before)


def test_flat_parameter_vector_module():
    class Flat(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.theta = torch.nn.Parameter(torch.zeros(1000, dtype=torch.bfloat16))

    model = Flat()
    opt = ESOptimizer(model, sigma=0.5, **SMALL)
    with opt.perturbed(0):
        assert model.theta.abs().max() > 0
    assert torch.count_nonzero(model.theta) == 0


def test_extra_memory_is_one_chunk_per_thread(two_tensors):
    opt = ESOptimizer(two_tensors(), noise_block=256, chunk_size=512, threads=2)
    with opt.perturbed(0):
        pass
    assert opt.workspace_bytes == 2 * 512 * 4  # one noise chunk per thread
    opt.step([(1, 1.0, 0), (2, 0.0, 0)])
    assert opt.workspace_bytes == 2 * 2 * 512 * 4  # plus one accumulator chunk per thread
    opt.close()


def test_callers_torch_thread_count_is_untouched(two_tensors):
    before = torch.get_num_threads()
    opt = ESOptimizer(two_tensors(), **SMALL)
    with opt.perturbed(0):
        pass
    opt.step([(1, 1.0, 0)])
    assert torch.get_num_threads() == before
