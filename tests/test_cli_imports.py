"""Commands that need no model bring no torch: importing it cost every `ft` command over 2 s,
`--help` included. The times are benchmarks/bench_cli_startup.py's; this checks the cause."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.test_server_util import free_port

COMMANDS = ["", "pull", "run", "serve", "list", "show", "rm", "cp", "verify", "create", "fit", "ps", "stop", "vram",
            "launch", "bench"]


def test_help_and_the_server_client_commands_import_no_torch(tmp_path: Path) -> None:
    """Every command's --help, and `ft ps`, `ft stop`, `ft rm` (which ask a running server, and
    took 3 s importing the server's own half for its client), in one fresh interpreter."""
    probe = textwrap.dedent(f"""
        import sys
        from ftpull.cli import _run
        runs = [[c, "--help"] if c else ["--help"] for c in {COMMANDS!r}]
        for args in runs + [["ps"], ["stop", "tiny"], ["rm", "nothing-here"], ["vram", "tiny", "2"]]:
            try:
                _run(args)
            except SystemExit:
                pass
            assert "torch" not in sys.modules, f"ft {{' '.join(args)}} imported torch"
    """)
    env = {**os.environ, "FT_HOME": str(tmp_path), "FT_HOST": f"127.0.0.1:{free_port()}"}  # (no server there)
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
