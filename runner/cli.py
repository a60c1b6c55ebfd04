"""The ``es-runner`` command line.

Subcommands are registered by small functions in :data:`COMMAND_GROUPS`: each adds its
parsers to the shared subparsers object and sets ``func`` on them. Other parts of the
project add theirs by appending a registration function.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Callable

Registrar = Callable[[argparse._SubParsersAction], None]


def _register_tasks(sub: argparse._SubParsersAction) -> None:
    tasks = sub.add_parser("tasks", help="generated terminal tasks")
    tsub = tasks.add_subparsers(dest="tasks_command", required=True)
    gen = tsub.add_parser("generate", help="write N generated tasks (native layout) and splits")
    gen.add_argument("--n", type=int, required=True, help="number of tasks")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--out", required=True, help="output folder")
    gen.add_argument("--categories", default=None, help="comma-separated subset of categories")
    gen.set_defaults(func=_cmd_tasks_generate)


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


def _register_env(sub: argparse._SubParsersAction) -> None:
    env = sub.add_parser("env", help="terminal task environments")
    esub = env.add_subparsers(dest="env_command", required=True)
    check = esub.add_parser("check", help="build a task, replay a solution, verify")
    check.add_argument("task_dir")
    check.add_argument("--solution", default=None, help="file with one command per line")
    check.add_argument("--command-timeout", type=float, default=10.0)
    check.add_argument("--max-turns", type=int, default=16)
    check.set_defaults(func=_cmd_env_check)


def _cmd_env_check(args: argparse.Namespace) -> int:
    import docker
    import docker.errors

    from runner.terminal.check import check_task
    from runner.terminal.episode import EpisodeConfig, make_client
    from runner.terminal.errors import TerminalError

    try:
        client = make_client()
        client.ping()
    except docker.errors.DockerException as exc:
        raise UserError(
            f"no Docker engine reachable ({exc}); run scripts/setup_docker.sh"
        ) from None
    config = EpisodeConfig(max_turns=args.max_turns, command_timeout_s=args.command_timeout)
    try:
        result = check_task(args.task_dir, args.solution, client, config)
    except TerminalError as exc:
        raise UserError(str(exc)) from None
    print(json.dumps(result))
    return 0


COMMAND_GROUPS: list[Registrar] = [_register_tasks, _register_env]


class UserError(Exception):
    """Printed as one line, exit code 2, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="es-runner", description="Run asynchronous ES on terminal tasks"
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    for register in COMMAND_GROUPS:
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    # SIGTERM unwinds like Ctrl-C so sandboxes are removed on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"es-runner: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("es-runner: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
