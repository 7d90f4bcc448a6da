"""Store fixtures shared by the tests that damage a store: `pulled`, the tiny model pulled once a
module, and `home`, a copy of it for one test (FT_HOME pointing at it, FT_HOST where no server
answers). Import both names into a test module to use them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.test_server_util import free_port, pulled_home


@pytest.fixture(scope="module")
def pulled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding tiny, pulled once for the module; tests work on copies of it."""
    root = tmp_path_factory.mktemp("pulled")
    pulled_home(root)
    return root


@pytest.fixture
def home(pulled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the module's store for one test."""
    root = tmp_path / "ft_home"
    shutil.copytree(pulled, root)
    monkeypatch.setenv("FT_HOME", str(root))
    monkeypatch.setenv("FT_HOST", f"127.0.0.1:{free_port()}")  # no server answers there
    return root
