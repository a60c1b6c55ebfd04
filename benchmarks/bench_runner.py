"""Speed of the real runner, as ratios measured in one run on the CPU configuration.

1. generation: tokens per second with all C sessions in one batched decode, against one
   session at a time (same requests, same seeds, so the same tokens), and through the
   session batcher with C concurrent threads (the path a job takes);
2. replay: a worker catching up k missed updates, per update, against one ES step of the
   same size, and against the job it precedes;
3. a real run (configs/runner/cpu_tiny.yaml, shortened): the orchestrator's own time
   (policy calls, journal, trace writes, dispatch gaps) as a fraction of worker time;
   episodes per minute against a scripted agent (reference solutions, no model) running
   the same number of episodes at the same number of live sessions (G x C): the container
   ceiling that bench_terminal.py measures.

Usage: python benchmarks/bench_runner.py [--sessions 8 32] [--updates 3] [--skip-run]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from harness import SYSTEM, run_figures, run_sessions, short_run_config

from runner.backends import GenerationRequest, make_backend
from runner.es import ESOptimizer
from runner.models import build_tiny_model


def requests(n: int, turns: int = 2) -> list[GenerationRequest]:
    out = []
    for i in range(n):
        msgs = [SYSTEM, {"role": "user", "content": f"Task {i}: count the lines of data{i}.txt."}]
        for t in range(turns):
            msgs += [
                {"role": "assistant", "content": f"<command>wc -l data{i}_{t}.txt</command>"},
                {"role": "user", "content": f"Command executed successfully. Output: {t} lines"},
            ]
        out.append(GenerationRequest(msgs, seed=1000 + i))
    return out


def bench_generation(model_dir: Path, sessions: list[int], tokens: int) -> list[dict]:
    backend = make_backend(
        "hf", path=str(model_dir), max_new_tokens=tokens, context_tokens=2048, stop=()
    )
    rows = []
    for n in sessions:
        reqs = requests(n)
        backend.generate(reqs[:2])  # warm-up
        t0 = time.perf_counter()
        batched = backend.generate(reqs)
        t_batched = time.perf_counter() - t0
        t0 = time.perf_counter()
        single = [backend.generate([r])[0] for r in reqs]
        t_single = time.perf_counter() - t0
        assert [g.text for g in batched] == [g.text for g in single]  # same tokens either way
        through = run_sessions(backend, reqs)  # C threads through the session batcher
        t_batcher = through.wall_s
        total = sum(g.tokens_out for g in batched)
        rows.append(
            {
                "sessions": n,
                "tokens": total,
                "batched_tok_s": round(total / t_batched, 1),
                "one_at_a_time_tok_s": round(total / t_single, 1),
                "batcher_tok_s": round(total / t_batcher, 1),
                "speedup_batched": round(t_single / t_batched, 2),
                "speedup_batcher": round(t_single / t_batcher, 2),
                "batcher_batches": through.batch_sizes,
            }
        )
    backend.close()
    return rows


def bench_replay(model_dir: Path, cohort: int, missed: int) -> dict:
    from transformers import AutoModelForCausalLM

    worker = make_backend("hf", path=str(model_dir), max_new_tokens=8, context_tokens=512)
    coordinator = ESOptimizer(AutoModelForCausalLM.from_pretrained(model_dir))
    steps = []
    for v in range(missed):
        cohort_results = [(10_000 * v + k, float(k % 3), v) for k in range(cohort)]
        t0 = time.perf_counter()
        coordinator.step(cohort_results)
        steps.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    applied = worker.sync(coordinator.log)
    replay = (time.perf_counter() - t0) / applied
    assert worker.weights_hash() == coordinator.weights_hash()
    worker.close()
    step = statistics.median(steps)
    return {
        "parameters": coordinator.num_parameters,
        "cohort": cohort,
        "missed_updates": applied,
        "replay_s_per_update": round(replay, 5),
        "step_s": round(step, 5),
        "replay_over_step": round(replay / step, 3),
    }


def bench_run(model_dir: Path, updates: int, out: Path) -> dict:
    import yaml

    from runner import cli
    from runner.terminal.episode import make_client, run_episodes
    from runner.terminal.images import ImageBuilder
    from runner.terminal.loaders import load_task
    from runner.terminal.protocol import ScriptedAgent

    path = short_run_config(out, model_dir, updates)
    config = yaml.safe_load(path.read_text())
    run = out / "run"
    t0 = time.perf_counter()
    assert cli.main(["train", str(path), "--out", str(run), "--no-progress"]) == 0
    total_s = time.perf_counter() - t0
    fig = run_figures(run)
    wall, G = fig["wall_s"], config["workers"]
    runner_epm = 60 * fig["episodes"] / wall

    # the scripted-agent ceiling at the same number of live sessions
    client = make_client(pool=64)
    builder = ImageBuilder(client)
    loaded = [load_task(out / "tasks" / t) for t in fig["task_ids"]]
    jobs_ = [(t, ScriptedAgent.from_file(t.solution)) for t in loaded]
    t0 = time.perf_counter()
    records = run_episodes(
        jobs_, concurrency=G * config["concurrency"], client=client, builder=builder
    )
    scripted_s = time.perf_counter() - t0
    scripted_epm = 60 * len(records) / scripted_s
    return {
        "workers": G,
        "sessions_per_worker": config["concurrency"],
        "updates": updates,
        "wall_s": round(wall, 1),
        "process_s": round(total_s, 1),
        **{
            k: fig[k]
            for k in ("orchestrator_own_s", "orchestrator_fraction", "dispatch_gap_s_mean")
        },
        "dispatch_gap_fraction": round(fig["dispatch_gap_s_total"] / (G * wall), 5),
        **{
            k: fig[k]
            for k in ("generation_s_per_episode", "container_s_per_episode", "turns_per_episode")
        },
        "runner_episodes_per_min": round(runner_epm, 1),
        "scripted_episodes_per_min": round(scripted_epm, 1),
        "scripted_turns_per_episode": round(statistics.mean(r.turns for r in records), 2),
        "runner_over_scripted": round(runner_epm / scripted_epm, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--tokens", type=int, default=32, help="new tokens per turn")
    ap.add_argument("--cohort", type=int, default=30)
    ap.add_argument("--missed", type=int, default=5)
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--skip-run", action="store_true", help="skip the Docker run (3.)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "tiny", seed=0, max_position_embeddings=4096)
        for row in bench_generation(model, args.sessions, args.tokens):
            print(json.dumps({"generation": row}))
        print(json.dumps({"replay": bench_replay(model, args.cohort, args.missed)}))
        if not args.skip_run:
            print(json.dumps({"run": bench_run(model, args.updates, Path(tmp))}))


if __name__ == "__main__":
    main()
