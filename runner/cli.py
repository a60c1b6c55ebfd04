"""The ``es-runner`` command line.

Subcommand groups live in :mod:`runner.commands`, one module each; every module's
``register`` function adds its parsers to the shared subparsers object (see
:data:`COMMAND_GROUPS`).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable

from runner.commands import model, terminal, train
from runner.errors import UserError

Registrar = Callable[[argparse._SubParsersAction], None]

COMMAND_GROUPS: list[Registrar] = [
    terminal.register_tasks,
    terminal.register_env,
    model.register,
    train.register,
]

__all__ = ["COMMAND_GROUPS", "UserError", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="es-runner", description="Run asynchronous ES on terminal tasks"
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    for register in COMMAND_GROUPS:
        register(sub)
    return parser


def _terminate(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    # SIGTERM unwinds like Ctrl-C so sandboxes are removed on the way out, and ends the same
    # way (exit 130, a resumable run) wherever it lands, start-up included.
    signal.signal(signal.SIGTERM, _terminate)
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
