"""``es-runner tasks ...`` and ``es-runner env ...``: generated tasks and task environments."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from runner.errors import UserError


def register_tasks(sub: argparse._SubParsersAction) -> None:
    tasks = sub.add_parser("tasks", help="generated terminal tasks")
    tsub = tasks.add_subparsers(dest="tasks_command", required=True)
    gen = tsub.add_parser("generate", help="write N generated tasks (native layout) and splits")
    gen.add_argument("--n", type=int, required=True, help="number of tasks")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--out", required=True, help="output folder")
    gen.add_argument("--categories", default=None, help="comma-separated subset of categories")
    gen.set_defaults(func=_cmd_tasks_generate)
    chk = tsub.add_parser(
        "check", help="compatibility report: load, build and (--solutions) solve every task"
    )
    chk.add_argument("dir", help="a task folder or a folder of task folders (any depth)")
    chk.add_argument(
        "--solutions",
        action="store_true",
        help="also run each task's solution and replay its recorded rollouts",
    )
    chk.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    chk.add_argument("--concurrency", type=int, default=4, help="tasks checked at once")
    chk.add_argument(
        "--max-replays", type=int, default=None, help="recorded rollouts replayed per file"
    )
    _episode_args(chk)
    chk.set_defaults(func=_cmd_tasks_check)
    _register_score(tsub)


def _register_score(tsub: argparse._SubParsersAction) -> None:
    from runner.commands.train import MODEL_EVAL

    score = tsub.add_parser(
        "score",
        help="each task's predicted success: the probability of its reference episode",
        description="One forward pass per task over its reference solution (the "
        "demonstration, rendered as rollouts render it) gives the probability that a rollout "
        "at the given temperature replays it; nothing runs in a container. Prints a table per "
        "category; --out writes one row per task (task, category, log_p, p, tokens).",
    )
    score.add_argument("--model", type=Path, required=True, metavar="DIR", help="model folder")
    score.add_argument("--tasks", type=Path, required=True, metavar="DIR", help="task folder")
    score.add_argument("--split", default="validation", help="task split (default validation)")
    score.add_argument("--max-tasks", type=int, help="only the first K tasks of the split")
    score.add_argument("--temperature", type=float, default=0.6)
    score.add_argument("--top-p", type=float, default=1.0)
    score.add_argument("--max-new-tokens", type=int, default=MODEL_EVAL["max_new_tokens"])
    score.add_argument("--context-tokens", type=int, default=MODEL_EVAL["context_tokens"])
    score.add_argument(
        "--band", type=float, nargs=2, default=(0.1, 0.9), metavar=("MIN", "MAX"),
        help="the band whose share the table reports (default 0.1 0.9)",
    )  # fmt: skip
    score.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    score.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    score.add_argument("--out", type=Path, metavar="FILE", help="rows to FILE (.parquet, .csv)")
    score.add_argument("--no-progress", action="store_true", help="no progress bar")
    score.set_defaults(func=_cmd_tasks_score)


def _cmd_tasks_score(args: argparse.Namespace) -> int:
    from runner.models.task_scores import (
        Scoring,
        category_table,
        format_table,
        load_split,
        score_folder,
    )

    _check_score_args(args)
    tasks, failed = load_split(args.tasks, args.split, args.max_tasks)
    if failed:
        print(f"es-runner: {len(failed)} task(s) not loaded (first: {failed[0]})")
    if not tasks:
        raise UserError(f"--split {args.split}: no task of {args.tasks} loads")
    how = Scoring(args.temperature, args.top_p, args.context_tokens, args.max_new_tokens)
    scores = score_folder(
        args.model, tasks, how, dtype=args.dtype, device=args.device,
        show_progress=not args.no_progress,
    )  # fmt: skip
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if args.out.suffix == ".csv":
            scores.to_csv(args.out, index=False)
        else:
            scores.to_parquet(args.out, index=False)
    print(format_table(category_table(scores, tuple(args.band)), tuple(args.band)))
    print(
        f"{len(scores)} {args.split} tasks of {args.tasks}, {args.model}, temperature "
        f"{args.temperature:g}" + (f"; rows in {args.out}" if args.out else "")
    )
    return 0


def _check_score_args(args: argparse.Namespace) -> None:
    """Every argument of ``tasks score`` checked before the model loads (one line each)."""
    if not (args.model / "config.json").is_file():
        what = "no such folder" if not args.model.is_dir() else "no config.json in it"
        raise UserError(f"--model {args.model}: not a model folder ({what})")
    if not args.tasks.is_dir():
        raise UserError(f"--tasks {args.tasks}: no such folder")
    if args.split != "all" and not (args.tasks / f"{args.split}.txt").is_file():
        raise UserError(
            f"--split {args.split}: {args.tasks} has no {args.split}.txt (or --split all)"
        )
    if args.max_tasks is not None and args.max_tasks < 1:
        raise UserError(f"--max-tasks must be >= 1, got {args.max_tasks}")
    if args.temperature < 0:
        raise UserError(f"--temperature must be >= 0, got {args.temperature:g}")
    if not 0 < args.top_p <= 1:
        raise UserError(f"--top-p must be in (0, 1], got {args.top_p:g}")
    if args.max_new_tokens < 1 or args.context_tokens <= args.max_new_tokens:
        raise UserError(
            f"--context-tokens ({args.context_tokens}) must exceed --max-new-tokens "
            f"({args.max_new_tokens}) >= 1"
        )
    low, high = args.band
    if not 0 <= low < high <= 1:
        raise UserError(f"--band {low:g} {high:g}: need 0 <= MIN < MAX <= 1")
    if args.out is not None and args.out.suffix not in (".parquet", ".csv"):
        raise UserError(f"--out {args.out}: give a .parquet or .csv file")


def _episode_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--command-timeout", type=float, default=10.0)
    p.add_argument("--max-turns", type=int, default=16)
    net = p.add_mutually_exclusive_group()
    net.add_argument(
        "--verifier-network",
        dest="verifier_network",
        action="store_const",
        const=True,
        default=None,
        help="give the verifier a network (default: the task's allow_internet)",
    )
    net.add_argument(
        "--no-verifier-network", dest="verifier_network", action="store_const", const=False
    )
    p.add_argument(
        "--offline-verifier",
        action="store_true",
        help="when the verifier needs a network it cannot use, run the task's pytest files "
        "with the image's pytest instead",
    )


def _episode_config(args: argparse.Namespace):
    from runner.terminal.episode import EpisodeConfig

    return EpisodeConfig(
        max_turns=args.max_turns,
        command_timeout_s=args.command_timeout,
        verifier_network=args.verifier_network,
        offline_verifier=args.offline_verifier,
    )


def _client():
    import docker
    import docker.errors

    from runner.terminal.episode import make_client

    try:
        client = make_client()
        client.ping()
    except docker.errors.DockerException as exc:
        raise UserError(
            f"no Docker engine reachable ({exc}); run scripts/setup_docker.sh"
        ) from None
    return client


def _cmd_tasks_check(args: argparse.Namespace) -> int:
    from runner.terminal.check import check_dir, format_row, format_summary
    from runner.terminal.errors import TerminalError

    if args.concurrency < 1:
        raise UserError("--concurrency must be at least 1")
    client = _client()
    try:
        report = check_dir(
            args.dir,
            client,
            _episode_config(args),
            solutions=args.solutions,
            concurrency=args.concurrency,
            max_replays=args.max_replays,
        )
    except TerminalError as exc:
        raise UserError(str(exc)) from None
    if args.json:
        print(json.dumps(report))
    else:
        for row in report["tasks"]:
            print(format_row(row))
        print(format_summary(report["summary"]))
    return 0


def _cmd_tasks_generate(args: argparse.Namespace) -> int:
    from runner.terminal.generator.writer import write_tasks

    if args.n < 1:
        raise UserError("--n must be at least 1")
    cats = args.categories.split(",") if args.categories else None
    try:
        paths = write_tasks(args.out, args.n, args.seed, cats)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    print(json.dumps({"out": args.out, "tasks": len(paths), "seed": args.seed}))
    return 0


def register_env(sub: argparse._SubParsersAction) -> None:
    env = sub.add_parser("env", help="terminal task environments")
    esub = env.add_subparsers(dest="env_command", required=True)
    check = esub.add_parser("check", help="build a task, replay a solution, verify")
    check.add_argument("task_dir")
    check.add_argument(
        "--solution", default=None, help="a solution file, run as one script (see --solution-mode)"
    )
    check.add_argument(
        "--solution-mode",
        choices=("script", "lines"),
        default="script",
        help="script: upload and run it with bash (default); lines: one command per turn",
    )
    check.add_argument(
        "--replay", default=None, help="recorded rollouts (upstream solutions/<model>_summary.json)"
    )
    which = check.add_mutually_exclusive_group()
    which.add_argument("--index", type=int, default=None, help="the rollout to replay (default 0)")
    which.add_argument("--all", action="store_true", help="replay every rollout")
    check.add_argument("--concurrency", type=int, default=4, help="rollouts replayed at once")
    check.add_argument(
        "--json", action="store_true", help="accepted for symmetry: the report is always JSON"
    )
    _episode_args(check)
    check.set_defaults(func=_cmd_env_check)


def _cmd_env_check(args: argparse.Namespace) -> int:
    from runner.terminal.check import check_task, replay_task
    from runner.terminal.errors import TerminalError

    if (args.index is not None or args.all) and not args.replay:
        raise UserError("--index and --all select rollouts of --replay FILE")
    if args.replay and args.solution:
        raise UserError("--replay and --solution are separate checks; give one")
    client = _client()
    config = _episode_config(args)
    try:
        if args.replay:
            result = replay_task(
                args.task_dir,
                args.replay,
                client,
                config,
                index=args.index,
                replay_all=args.all,
                concurrency=max(1, args.concurrency),
            )
        else:
            result = check_task(
                args.task_dir, args.solution, client, config, solution_mode=args.solution_mode
            )
    except TerminalError as exc:
        raise UserError(str(exc)) from None
    print(json.dumps(result))
    return 0
