"""One plausible mistake per generated task category: the ``mistake`` habit's table.

Each is a small edit of the category's reference commands that a real agent makes (a
forgotten flag, an off-by-one field, a glob too wide), the same for every task of the
category, chosen so that the mistaken solution still prints nothing and exits 0 (the
silent record of :mod:`runner.models.demonstrations` stays true) and fails the task's
checks, mostly with some of its partial checks still passing. ``tests/runner/
test_pretrain_mistake.py`` runs each, and the reference, in a real container.

``text_search`` has none: its lines hold whole lowercase words, each at most once, none
inside another, so the natural slips (no ``-w``, ``-i``, ``grep -o | wc -l``) count the
same lines; its tasks keep the correct demonstration.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Mistake:
    """``pattern`` replaced by ``replacement`` (:func:`re.sub`) in the reference commands."""

    what: str  # the mistake, in words
    pattern: str
    replacement: str


MISTAKES: dict[str, Mistake] = {
    "archive_create": Mistake("forgets `-z`: a plain tar, not gzip", r"\btar -czf ", "tar -cf "),
    "archive_extract": Mistake(
        "forgets `-C DEST`: extracts into the working directory",
        r"^(tar -xzf \S+) -C \S+$",
        r"\1",
    ),
    "csv_aggregate": Mistake(
        "forgets `NR>1`: sums the header too (a line `region,0`)",
        r"^(awk -F, ')NR>1 ",
        r"\1",
    ),
    "json_filter": Mistake(
        "collects the names in a JSON array instead of one per line",
        r"^jq -r '([^']*)'",
        r"jq -r '[\1]'",
    ),
    "log_analysis": Mistake(
        "off-by-one field: `$8` (the protocol) for `$9` (the status)",
        r"^awk '\{print \$9\}'",
        "awk '{print $8}'",
    ),
    "permissions": Mistake(
        "too wide a glob: the script mode on every file (`DIR/*`), README.md included",
        r"^(chmod \d+ \S+/)\*\.sh$",
        r"\1*",
    ),
    "find_files": Mistake(
        "looks only at the top level (`-maxdepth 1`)",
        r"^find (\S+) -type f ",
        r"find \1 -maxdepth 1 -type f ",
    ),
    "sed_config": Mistake("comments out with `#` and no space", r"(-e 's/\^[^/]*=/)# ", r"\1#"),
    "awk_columns": Mistake(
        "separates with awk's space (`print $3, $1`), not a tab",
        r'\{print \$3 "\\t" \$1\}',
        "{print $3, $1}",
    ),
    "script_writing": Mistake(
        "forgets the `#!/bin/bash` line (the script cannot be executed)",
        r"^(printf '%s\\n' )'#!/bin/bash' ",
        r"\1",
    ),
    "processes": Mistake(
        "writes the shell's process id (`$$`), not the background job's (`$!`)",
        r"echo \$! > ",
        "echo $$ > ",
    ),
    "symlinks": Mistake("a trailing `/` on the link's target", r"^(ln -sfn \S+) ", r"\1/ "),
    "dedupe_sort": Mistake("`sort` for `sort -u`: keeps the repeated lines", r"^sort -u ", "sort "),
}


def with_mistake(category: str | None, commands: Sequence[str]) -> list[str] | None:
    """``commands`` with the category's mistake; ``None`` where the category has none.

    Raises ``ValueError`` where the category's commands do not hold its pattern (the
    generator changed: the table must follow it)."""
    mistake = MISTAKES.get(category or "")
    if mistake is None:
        return None
    out, hits = [], 0
    for command in commands:
        changed, n = re.subn(mistake.pattern, mistake.replacement, command)
        out.append(changed)
        hits += n
    if hits != 1:
        raise ValueError(
            f"{category}: the pattern {mistake.pattern!r} of its mistake ({mistake.what}) "
            f"matched {hits} times in the reference commands, not once"
        )
    return out
