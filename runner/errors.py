"""Errors of the runner that a user can act on."""

from __future__ import annotations


class UserError(Exception):
    """Printed by ``es-runner`` as one line, exit code 2, no traceback."""


class RunFailed(RuntimeError):
    """The run cannot go on (a worker keeps crashing, the disk is full); state is saved."""
