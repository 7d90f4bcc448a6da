"""Running the `ft` command line inside a test: exit status, stdout and stderr."""

from __future__ import annotations

import pytest

from ftpull.cli import _run


def ft(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`ft ARGS...` in this process, as `main` would run it; returns (exit status, stdout, stderr)."""
    code = 0
    try:
        _run(list(args))
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
