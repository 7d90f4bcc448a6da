"""Untrusted input on the command line never crashes ft or slips past it: a name outside the
grammar (a Unicode look-alike, a control character) is refused by every command with the
grammar's message, exit status 1 and no traceback, and nothing is written; a manifest writer
killed with SIGKILL leaves a temp file that the next `ft list`, `ft rm` or `ft pull` removes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from registry import Store
from tests import store_fixtures
from tests.clirun import ft

pulled, home = store_fixtures.pulled, store_fixtures.home  # the shared store fixtures

BAD_NAMES = [
    "\u212aelvin",  # KELVIN SIGN: lower() makes it an ASCII k ("kelvin:latest" was registered)
    "tiny\u200b",  # a zero-width space
    "\uff54\uff49\uff4e\uff59",  # fullwidth "tiny": NFKC would fold it into the model that exists
    "t\u0131ny",  # dotless i
    "tiny\x00",
    "../\x00x",
    "ti\x1bny",
    "tiny\x7f",
    "tiny\u0085",  # a C1 control (NEXT LINE), which str.strip() would drop
]


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / "manifests").rglob("*")) + \
        sorted(p.name for p in (root / "blobs").iterdir())


def _commands(name: str, modelfile: Path) -> list[tuple[str, ...]]:
    return [("pull", name), ("run", name, "hi"), ("cp", "tiny", name), ("cp", name, "copy"), ("rm", name),
            ("show", name), ("verify", name), ("create", name, "-f", str(modelfile)), ("fit", name), ("stop", name)]


@pytest.mark.parametrize("name", BAD_NAMES, ids=ascii)
def test_every_command_refuses_a_name_outside_the_grammar(home: Path, capsys: pytest.CaptureFixture[str],
                                                          tmp_path: Path, name: str) -> None:
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text("FROM tiny\nPARAMETER temperature 0.5\n")
    before = _tree(home)
    for args in _commands(name, modelfile):
        code, out, err = ft(capsys, *args)
        assert code == 1, (args, out, err)
        assert "invalid model name" in err and "expected [host/][namespace/]model[:tag]" in err, (args, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, (args, err)
    assert _tree(home) == before  # nothing written, nothing removed
    code, out, _ = ft(capsys, "list")
    assert code == 0 and [line.split()[0] for line in out.splitlines()[1:]] == ["tiny:latest"]


def test_the_message_names_the_character_and_the_fix(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = ft(capsys, "cp", "tiny", "\u212aelvin")
    assert code == 1 and "U+212A KELVIN SIGN" in err and "names are ASCII only" in err
    code, _, err = ft(capsys, "pull", "../\x00x")
    assert code == 1 and "contains a NUL byte" in err and "embedded null byte" not in err
    code, _, err = ft(capsys, "show", "ti\x1bny")
    assert code == 1 and "control character U+001B" in err


def test_a_non_ascii_checkpoint_path_is_still_a_path(home: Path, capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path) -> None:
    """Paths may be non-ASCII (a directory is named as its owner likes); only names are ASCII."""
    code, _, err = ft(capsys, "pull", str(tmp_path / "mod\u00e8le"))
    assert code == 1 and "does not exist: give a Hugging Face checkpoint directory" in err


KILLED_MANIFEST_WRITE = textwrap.dedent("""
    import os, signal, sys
    import registry.atomic as atomic
    real = atomic.AtomicWriter.commit
    def commit(self):
        if "manifests" in self.target.parts:
            self.file.flush()
            os.kill(os.getpid(), signal.SIGKILL)  # the manifest's bytes in its temp file, never renamed
        return real(self)
    atomic.AtomicWriter.commit = commit
    from ftpull.cli import _run
    _run(sys.argv[1:])
""")


@pytest.mark.parametrize("next_command", [("list",), ("rm", "spare"), ("pull", "tiny")])
def test_a_manifest_write_killed_is_cleaned_up_by_the_next_command(home: Path, capsys: pytest.CaptureFixture[str],
                                                                   next_command: tuple[str, ...]) -> None:
    assert ft(capsys, "cp", "tiny", "spare")[0] == 0
    proc = subprocess.Popen([sys.executable, "-c", KILLED_MANIFEST_WRITE, "cp", "tiny", "twin"], env=os.environ.copy(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, stderr
    store = Store(home)
    twin = store.manifest_path("twin")
    left = list(twin.parent.glob(".latest.tmp-*"))
    assert len(left) == 1 and f".tmp-{proc.pid}-" in left[0].name  # what the bug report found
    assert not twin.exists()

    code, _, err = ft(capsys, *next_command)
    assert code == 0, err
    assert not left[0].exists() and not twin.parent.exists()  # the temp file and the directory it made
    names = [e.name.display for e in store.list_models()]
    assert "twin:latest" not in names and "tiny:latest" in names
    assert store.verify("tiny") == []
