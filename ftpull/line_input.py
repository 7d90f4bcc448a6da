"""The REPL's input lines: on a terminal, GNU readline's editing (arrows, Ctrl-A/E, Ctrl-R) and a
history kept across runs, as Ollama's REPL has; piped, plain lines with the prompts written out.

Either way the reader is an iterator of lines (end of input ends it), with `prompt(text)` to
name the prompt the next line is read after (`ftpull.run.read_message` calls both).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

HISTORY_LINES = 1000  # kept in the history file (Ollama keeps its last entries in ~/.ollama/history too)


class PipedLines:
    """Lines of a stream that is not a terminal: each prompt written to `out` as it is asked."""

    def __init__(self, stream: TextIO, out: TextIO) -> None:
        self.stream, self.out = stream, out

    def prompt(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def __iter__(self) -> Iterator[str]:
        return iter(self.stream.readline, "")


class TerminalLines:
    """Lines typed at a terminal, read by `input()` with readline: the prompt is readline's to draw
    (so editing and history redraw it), each line entered goes into the history file."""

    def __init__(self, history: Path | None) -> None:
        import readline  # (POSIX; a Python without it takes PipedLines: `reader`)

        self._readline = readline
        self._prompt = ""
        self.history = history
        readline.set_history_length(HISTORY_LINES)
        if history is not None:
            try:
                readline.read_history_file(history)
            except (FileNotFoundError, PermissionError, OSError):  # a first run, or a history we may not read
                pass

    def prompt(self, text: str) -> None:
        self._prompt = text

    def __iter__(self) -> Iterator[str]:
        while True:
            try:
                line = input(self._prompt)
            except EOFError:  # Ctrl-D
                return
            self._remember(line)
            yield line + "\n"

    def _remember(self, line: str) -> None:
        if not line.strip() or self.history is None:
            return
        try:
            self.history.parent.mkdir(parents=True, exist_ok=True)
            self._readline.write_history_file(self.history)
        except OSError:  # a read-only home: the history of this run only
            self.history = None


def reader(history: Path | None, stream: TextIO | None = None, out: TextIO | None = None) -> PipedLines | TerminalLines:
    """TerminalLines where `stream` (stdin) is a terminal and readline is there, else PipedLines."""
    stream, out = stream or sys.stdin, out or sys.stdout
    if stream.isatty() and out.isatty():
        try:
            return TerminalLines(history)
        except ImportError:
            pass
    return PipedLines(stream, out)
