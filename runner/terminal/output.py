"""Collect a command's output as it streams: decode, strip ANSI, keep a bounded head.

A flood (``yes``) can produce hundreds of MB in a 10 s timeout, so nothing beyond the
limit is stored; characters are still counted so the truncation note is exact.
"""

from __future__ import annotations

import codecs
import re

OUTPUT_LIMIT = 50_000
# CSI sequences (colours, cursor moves), OSC sequences (titles), and single-char escapes.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_PARTIAL = re.compile(r"\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*\x1b?)?$")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


class OutputCollector:
    def __init__(self, limit: int = OUTPUT_LIMIT) -> None:
        self.limit = limit
        self.total_chars = 0
        self._head: list[str] = []
        self._head_len = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._carry = ""  # an escape sequence split across chunks

    def feed(self, data: bytes, final: bool = False) -> None:
        text = self._carry + self._decoder.decode(data, final=final)
        self._carry = ""
        if not final:
            partial = _PARTIAL.search(text[-64:])
            if partial:
                cut = len(text) - (len(text[-64:]) - partial.start())
                text, self._carry = text[:cut], text[cut:]
        text = strip_ansi(text).replace("\r\n", "\n")
        self.total_chars += len(text)
        room = self.limit - self._head_len
        if room > 0:
            piece = text[:room]
            self._head.append(piece)
            self._head_len += len(piece)

    def finish(self) -> str:
        """The output, trailing newlines removed, with a note when it was cut."""
        self.feed(b"", final=True)
        if self._carry:
            self.total_chars += len(self._carry)
        text = "".join(self._head)
        if self.total_chars > self.limit:
            return (
                text + f"\n[output truncated: showing the first {self.limit:,} of "
                f"{self.total_chars:,} characters]"
            )
        return text.rstrip("\n")

    @property
    def truncated(self) -> bool:
        return self.total_chars > self.limit
