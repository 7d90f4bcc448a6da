"""How long `ft --help` and each command's --help take, in a fresh interpreter each time (the
issue: every command took over 2 s, --help included, for importing torch). A benchmark, not a
timed test: the machine decides the figures.

    python benchmarks/bench_cli_startup.py [--runs 5]

Prints each command's median wall time and whether torch was imported on the way.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = ["", "pull", "run", "serve", "list", "show", "rm", "cp", "verify", "create", "fit", "ps", "stop", "bench"]
PROBE = ("import runpy, sys; sys.argv = ['ft', *sys.argv[1:], '--help']\n"
         "try:\n    runpy.run_module('ftpull', run_name='__main__')\nexcept SystemExit:\n    pass\n"
         "print('torch imported' if 'torch' in sys.modules else 'no torch', file=sys.stderr)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"{'command':<10}{'median s':>10}  torch")
    for command in COMMANDS:
        seconds, said = [], ""
        for _ in range(args.runs):
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", PROBE, *([command] if command else [])],
                                  capture_output=True, text=True, check=False)
            seconds.append(time.perf_counter() - start)
            said = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "?"
        print(f"{command or '(ft)':<10}{statistics.median(seconds):>10.2f}  {said}")


if __name__ == "__main__":
    main()
