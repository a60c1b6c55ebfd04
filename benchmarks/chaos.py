"""Chaos: a CPU training run of configs/runner/cpu_tiny.yaml with faults injected at seeded
random moments, then one table of what the run survived and what it lost.

Faults (kinds):

- ``sigkill``: SIGKILL of the training process at a random moment;
- ``sigkill-commit``: SIGKILL with a commit's journal line half written (a torn line);
- ``sigkill-after-commit``: SIGKILL once a commit is durable, before its checkpoint;
- ``sigkill-checkpoint``: SIGKILL during a checkpoint write (temporary file written, not renamed);
- ``sigkill-eval``: SIGKILL during a held-out evaluation;
- ``sigkill-resume``: SIGKILL in the first second after a ``--resume``;
- ``sigint``, ``sigterm``: Ctrl-C and SIGTERM (the run stops cleanly, exit 130);
- ``docker-kill-episode``: ``docker kill`` of a running episode's container;
- ``docker-kill-verifier``: ``docker kill`` of the container while its verifier runs;
- ``torn-journal``: a torn last line appended to journal.jsonl after a kill;
- ``truncated-trace``: jobs.parquet cut to half and transcripts.jsonl cut mid-line after a kill;
- ``engine-restart`` (``--engine-restart`` only: the engine is shared by everything on the
  machine): the Docker engine stopped and started again while jobs run;
- ``ray-kill``, ``ray-worker-sigkill`` (``--ray``: ``placement: ray``): a worker's Ray actor
  killed with ``ray.kill`` while its job runs, and an actor's process SIGKILLed;
- ``disk-full`` (``--disk-full``, as root): the run directory lives on a small tmpfs, which a
  filler file fills while jobs run; once the run has stopped (or a minute on) the filler is
  removed and the run resumed.

Every kill is followed by ``es-runner train --resume``. In-process moments (a commit, a
checkpoint write, an evaluation, a verifier) are reached by running the trainer through this
file (``--child``), which wraps the function concerned and kills the process from inside at
that moment; nothing of the runner is changed. Losses are counted from the run's files,
independently of the runner's bookkeeping: committed updates lost or applied twice (each
kill's journal commits against the final journal's), versions skipped or repeated, jobs
without a verdict, containers and processes left behind, and the final weights' hash (the
last process's worker, synced to the whole log) against ``es-runner model export`` (a fresh
process rebuilding the weights from the update log).

This file holds the plan's table and the command line; ``chaos_faults.py`` the driver (the
faults, the resumes, the counting) and ``chaos_child.py`` the trainer with its fault points.

    python benchmarks/chaos.py --seed 1                # the long form (>= 10 SIGKILLs)
    python benchmarks/chaos.py --short --seed 0        # a few faults, about two minutes
    python benchmarks/chaos.py --seed 1 --engine-restart   # also stops the Docker engine

"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from chaos_faults import REPO, Chaos


def format_table(v: dict) -> str:
    kinds = sorted(set(v["injected"]) | set(v["not_reached"]))
    rows = [
        f"{'fault':<22} {'injected':>8} {'survived':>8} {'--resume':>8} {'lost':>5} {'not reached':>11}"
    ]
    for k in kinds:
        rows.append(
            f"{k:<22} {v['injected'].get(k, 0):>8} {v['survived'].get(k, 0):>8} "
            f"{v['needed_resume'].get(k, 0):>8} {v['lost_by_fault'].get(k, 0):>5} "
            f"{v['not_reached'].get(k, 0):>11}"
        )
    sigkills = sum(n for k, n in v["injected"].items() if k.startswith("sigkill"))
    rows += [
        "",
        f"SIGKILLs: {sigkills}; resumes: {v['restarts']}; seed {v['seed']}, {v['updates']} updates "
        f"({v['nonzero_updates']} nonzero)",
        f"committed updates lost: {v['updates_lost']}   applied twice: {v['updates_applied_twice']}",
        f"versions skipped: {v['versions_skipped']}   repeated: {v['versions_repeated']}",
        f"jobs without a verdict: {v['jobs_without_verdict']}",
        f"checkpoint log == journal commits: {v['checkpoint_log_equals_journal']}",
        f"damaged transcript lines: {v['transcript_lines_damaged']}",
        f"containers left behind: {v['containers_left']}   processes left behind: "
        f"{v['processes_left']}   temporary files left: {len(v['temporary_files_left'])}",
        f"processes that ended in a traceback: {len(v['tracebacks'])}",
        f"final weights {str(v['final_weights_hash'])[:16]} vs rebuilt from the update log "
        f"{str(v['rebuilt_weights_hash'])[:16]}: {'equal' if v['hashes_equal'] else 'DIFFERENT'}",
        f"SIGINT/SIGTERM exit codes: {v['sigint_sigterm_exit_codes']}; the last process: "
        f"{v['final_exit_code']}; disk full: {v['disk_full_exit_codes']}",
    ]
    return "\n".join(rows)


def write_config(args: argparse.Namespace, work: Path) -> Path:
    import yaml

    base = yaml.safe_load((REPO / "configs/runner/cpu_tiny.yaml").read_text())
    base["updates"] = args.updates
    base["model"]["path"] = str(args.model)
    base["eval_every"] = args.eval_every
    # graded fitness: a random model passes some of a task's checks now and then, so the
    # updates are not all zero and the weights-hash check compares real weights
    base["es"]["reward"] = "graded"
    base["tasks"] = {"generate": {"n": args.tasks, "seed": 0}, "split": "train"}
    if args.ray:
        base["placement"] = "ray"
    if args.short:
        base.update(cohort=2, episodes_per_job=2, concurrency=2, max_turns=2)
        base["sampling"]["max_new_tokens"] = 12
        base["eval"] = {"split": "test", "seeds": [42], "max_tasks": 2}
    path = work / "chaos.yaml"
    path.write_text(yaml.safe_dump(base))
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        from chaos_child import child

        return child(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--short", action="store_true", help="a few faults, for the tests")
    p.add_argument("--updates", type=int, help="updates of the run (long 12, short 2)")
    p.add_argument("--tasks", type=int, default=16, help="generated tasks")
    p.add_argument("--eval-every", type=int, help="evaluate every k versions (long 3, short 0)")
    p.add_argument("--model", type=Path, help="model folder (default: a tiny one, made here)")
    p.add_argument("--out", type=Path, help="work folder (default: a temporary one)")
    p.add_argument("--engine-restart", action="store_true", help="also stop and restart dockerd")
    p.add_argument("--engine-stop-s", type=float, default=5.0)
    p.add_argument("--disk-full", action="store_true", help="run on a small tmpfs (root)")
    p.add_argument("--ray", action="store_true", help="placement: ray, with its faults")
    p.add_argument("--disk-mb", type=int, default=64, help="the tmpfs's size")
    p.add_argument("--max-delay", type=float, default=8.0, help="seconds a fault may wait")
    p.add_argument("--hook-timeout", type=float, default=180.0)
    p.add_argument("--finish-timeout", type=float, default=1800.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    args.updates = args.updates or (2 if args.short else 12)
    args.eval_every = args.eval_every if args.eval_every is not None else (0 if args.short else 3)
    work = args.out or Path(tempfile.mkdtemp(prefix="chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.model is None:
        args.model = work / "tiny"
        if not args.model.exists():
            subprocess.run(
                [sys.executable, "-m", "runner.cli", "model", "make-tiny", str(args.model)],
                cwd=REPO,
                check=True,
                capture_output=True,
                env={**os.environ, "PYTHONPATH": str(REPO)},
            )
    args.config_path = write_config(args, work)
    chaos = Chaos(args, work)
    if args.disk_full:  # the run directory on a filesystem of its own that can fill up
        chaos.run = work / "disk" / "run"
        chaos.run.parent.mkdir(exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={args.disk_mb}m", "tmpfs", str(chaos.run.parent)],
            check=True,
        )
    try:
        verdict = chaos.go()
    finally:
        if args.disk_full:
            subprocess.run(["umount", "-l", str(chaos.run.parent)], check=False)
    print(json.dumps(verdict) if args.json else format_table(verdict))
    return 0


if __name__ == "__main__":
    sys.exit(main())
