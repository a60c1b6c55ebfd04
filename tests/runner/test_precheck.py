"""The pre-check figures on a hand-made cohort, computed by hand; and in updates.parquet."""

from __future__ import annotations

import math

from runner.config import validate_run
from runner.precheck import cohort_figures, summary_line
from runner.run_state import RunState

TASKS = ["t0", "t1", "t2", "t3"]


def member(rewards, graded=None):
    graded = graded or rewards
    return [
        {"index": i, "task_id": TASKS[i], "reward": float(r), "graded": float(g), "tokens_out": 1}
        for i, (r, g) in enumerate(zip(rewards, graded, strict=True))
    ]


# Two antithetic pairs (seeds 10 and 11), four shared task slots. By hand:
#   pair 10: + 1 0 1 0 / - 1 1 1 0 -> differ on slot 1            (1 of 4)
#   pair 11: + 0 0 1 0 / - 1 0 1 1 -> differ on slots 0 and 3     (2 of 4)
#   pair disagreement 3 / 8 = 0.375
#   slots: 0 (1 1 0 1), 1 (0 1 0 0), 2 (1 1 1 1), 3 (0 0 0 1): only slot 2 agrees -> 0.25
COHORT = [
    (10, 1, member([1, 0, 1, 0], graded=[1, 0.5, 1, 0])),
    (10, -1, member([1, 1, 1, 0], graded=[1, 1, 1, 0.5])),
    (11, 1, member([0, 0, 1, 0])),
    (11, -1, member([1, 0, 1, 1])),
]


def test_figures_of_a_hand_made_cohort():
    got = cohort_figures(COHORT, antithetic=True, graded=False)
    assert got == {"pair_disagreement": 0.375, "slots_all_agree": 0.25}
    # graded values: pair 10 now differs on slots 1 and 3 (0.5 vs 1, 0 vs 0.5) -> 4 / 8
    graded = cohort_figures(COHORT, antithetic=True, graded=True)
    assert graded == {"pair_disagreement": 0.5, "slots_all_agree": 0.25}


def test_no_pairs_no_pair_figure():
    got = cohort_figures(COHORT, antithetic=False, graded=False)
    assert math.isnan(got["pair_disagreement"]) and got["slots_all_agree"] == 0.25
    # a pair with one member in the cohort (the other stale or cancelled) is no pair
    lonely = cohort_figures(COHORT[:1] + COHORT[2:3], antithetic=True, graded=False)
    assert math.isnan(lonely["pair_disagreement"])
    # slots are (index, task): a member given other tasks shares no slot with pair 10,
    # whose own slots agree on 0 (1 1), 2 (1 1) and 3 (0 0), not on 1 (0 1) -> 3 / 4
    other = [(12, 1, [{**e, "task_id": "x"} for e in member([0, 0, 0, 0])])]
    assert cohort_figures(COHORT[:2] + other, True, False)["slots_all_agree"] == 0.75


def test_the_verdict_line():
    assert "worth a full run" in summary_line([0.2, 0.3], [0.5, 0.5])
    line = summary_line([0.1, 0.15], [0.7, 0.6])
    assert "pair disagreement 12.5 %" in line and "too little signal" in line
    assert "agree 65.0 %" in line
    assert "no antithetic pairs" in summary_line([math.nan], [0.5])


def test_recorded_in_every_update_row():
    cfg = validate_run(
        {
            "name": "t", "seed": 3, "workers": 4, "cohort": 4, "updates": 1,
            "policy": {"kind": "sync"}, "model": {"backend": "hf", "path": "m"},
            "tasks": {"dir": "t"}, "episodes_per_job": 4, "concurrency": 2,
            "es": {"antithetic": True},
        }
    )  # fmt: skip
    state = RunState(cfg, cfg.es.update_rule())
    state.segment(1, 0.0, 0.0, "start")
    jobs = [state.dispatch(w, 0.0)["job"] for w in range(4)]
    for job in jobs:
        state.job_started(job, 0.0, 0.0)
    # jobs 0/1 and 2/3 are the two antithetic pairs (seed of job // 2, sign - on odd jobs)
    for job, (_, _, episodes) in zip(jobs, COHORT, strict=True):
        reward = sum(e["reward"] for e in episodes) / 4
        outcome = {"reward": reward, "episodes": episodes, "perturb_s": 0.0}
        state.land(job, 1.0, {**outcome, "generation_s": 0.0, "container_s": 0.0})
    state.commit(1.0)
    updates = state.trace({"source": "measured"}).updates
    assert list(updates["pair_disagreement"]) == [0.375]
    assert list(updates["slots_all_agree"]) == [0.25]
