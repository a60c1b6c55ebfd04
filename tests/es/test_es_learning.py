"""ES learns: a noisy quadratic and a target token's log-probability in a tiny causal LM,
with synchronous updates and with every result one version stale.

The stale runs use a second optimizer as the worker: it catches up by replaying the
learner's log (seeds only) to version ``learner.version - 1`` and evaluates there, so the
results reach the learner with lag 1, as in the published Async-1 setting.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import pytest
import torch

from runner.es import ESOptimizer
from runner.models import load_tiny_model

Reward = Callable[[torch.nn.Module, np.random.Generator], float]


def train(
    make_model: Callable[[], torch.nn.Module],
    reward: Reward,
    *,
    steps: int,
    n: int,
    lag: int,
    shuffle_rewards: bool = False,
    **opt_kwargs,
) -> ESOptimizer:
    learner = ESOptimizer(make_model(), **opt_kwargs)
    worker = ESOptimizer(make_model(), **opt_kwargs)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        worker.replay(learner.log, upto=max(0, learner.version - lag))
        results = []
        for seed in rng.choice(2**62, size=n, replace=False):
            with worker.perturbed(int(seed)):
                results.append((int(seed), reward(worker.model, rng), worker.version))
        if shuffle_rewards:  # control: break the link between a seed and its reward
            rewards = rng.permutation([r for _, r, _ in results])
            results = [(s, float(r), v) for (s, _, v), r in zip(results, rewards, strict=True)]
        record = learner.step(results)
        assert set(record.lags) <= {min(lag, learner.version - 1)}
        assert record.n_accepted == n
    return learner


class Flat(torch.nn.Module):
    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.theta = torch.nn.Parameter(torch.zeros(dim))


TARGET = torch.randn(32, generator=torch.Generator().manual_seed(0))


def sq_dist(model: torch.nn.Module) -> float:
    return float(((model.theta.detach() - TARGET) ** 2).sum())


def noisy_quadratic(model: torch.nn.Module, rng: np.random.Generator) -> float:
    return -sq_dist(model) + float(rng.normal())  # noise sd 1


@pytest.mark.parametrize(("lag", "staleness"), [(0, "none"), (1, "none"), (1, "drop_over:1")])
def test_es_minimizes_a_noisy_quadratic(lag, staleness):
    start = sq_dist(Flat())
    opt = train(Flat, noisy_quadratic, steps=60, n=20, lag=lag, sigma=0.1, alpha=0.2,
                staleness=staleness)  # fmt: skip
    assert opt.version == 60
    assert sq_dist(opt.model) < 0.15 * start


def test_quadratic_control_with_shuffled_rewards_does_not_improve():
    start = sq_dist(Flat())
    opt = train(Flat, noisy_quadratic, steps=60, n=20, lag=0, sigma=0.1, alpha=0.2,
                shuffle_rewards=True)  # fmt: skip
    assert sq_dist(opt.model) > 0.5 * start


@pytest.mark.parametrize(("lag", "staleness"), [(0, "none"), (1, "drop_over:1")])
def test_es_raises_a_target_token_log_prob_in_a_tiny_causal_lm(tiny_model_dir, lag, staleness):
    base, tok = load_tiny_model(tiny_model_dir)
    ids = torch.tensor([tok("<command>ls -la</command>")["input_ids"]])
    target = tok.convert_tokens_to_ids("<|im_end|>")

    @torch.no_grad()
    def log_prob(model: torch.nn.Module, rng: np.random.Generator | None = None) -> float:
        return float(torch.log_softmax(model(ids).logits[0, -1].float(), -1)[target])

    start = log_prob(base)
    assert abs(start + np.log(len(tok))) < 1.5  # a random model is near uniform
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny forwards: threads only add overhead
    try:
        opt = train(lambda: copy.deepcopy(base), log_prob, steps=20, n=16, lag=lag, sigma=0.02,
                    alpha=0.02, staleness=staleness)  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    assert log_prob(opt.model) > start + 1.0  # probability up by a factor > e
