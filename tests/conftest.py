"""Shared pytest fixtures."""

from __future__ import annotations

import os

import pytest
import torch

# Triton picks interpreted or compiled helpers when it is first imported: without a GPU every
# kernel test needs the interpreter, so choose it before any module imports triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tests.fakehub import FakeHub, _close_client_session, configure_hf_client


@pytest.fixture
def fake_hub(request, monkeypatch, tmp_path_factory):
    """A started `tests.fakehub.FakeHub`, with huggingface_hub pointed at it and isolated from the real Hub.

    Add repos with ``fake_hub.add_repo("org/name", some_dir)``; the client's cache is ``fake_hub.cache_dir``
    (``$HF_HOME/hub``, a fresh temp dir). FakeHub keyword arguments can be passed by indirect parametrization:
    ``@pytest.mark.parametrize("fake_hub", [{"lfs_redirect": False}], indirect=True)``.

    Environment (monkeypatched): HF_ENDPOINT=<server>, HF_HUB_OFFLINE=0, HF_HUB_DISABLE_TELEMETRY=1,
    HF_HUB_DISABLE_XET=1, HF_HUB_DISABLE_IMPLICIT_TOKEN=1, HF_HOME/HF_HUB_CACHE/HF_ASSETS_CACHE/HF_XET_CACHE/
    HF_TOKEN_PATH under a temp dir; HF_TOKEN, HF_HUB_ETAG_TIMEOUT, HF_HUB_DOWNLOAD_TIMEOUT, ... removed.

    huggingface_hub copies those variables into ``huggingface_hub.constants`` when it is imported, so the env alone
    does not reach an already-imported client. Also patched, each only if the installed version has it:
    ``constants.ENDPOINT``, ``constants.HUGGINGFACE_CO_URL_TEMPLATE`` (every ``/resolve`` URL is built from it),
    ``constants.HF_URL_HOSTS``, ``constants.HF_HUB_OFFLINE``, ``constants.HF_HUB_DISABLE_TELEMETRY``,
    ``constants.HF_HUB_DISABLE_XET``, ``constants.HF_HUB_DISABLE_IMPLICIT_TOKEN``, ``constants.HF_HOME``,
    ``constants.HF_HUB_CACHE`` / ``HUGGINGFACE_HUB_CACHE`` / ``HF_ASSETS_CACHE`` / ``HUGGINGFACE_ASSETS_CACHE`` /
    ``HF_XET_CACHE``, ``constants.HF_TOKEN_PATH`` / ``HF_STORED_TOKENS_PATH``, the update-check / agent registry
    paths, and ``constants.HF_HUB_ETAG_TIMEOUT`` / ``HF_HUB_DOWNLOAD_TIMEOUT`` (reset to the defaults; lower them in
    a test with ``monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 0.5)``: the env vars are read only at
    import). Plus ``huggingface_hub.hf_api.api.endpoint`` (the module-level HfApi behind ``huggingface_hub.model_info``
    and friends) and ``huggingface_hub.utils._http._HUB_ORIGINS``. See `tests.fakehub.configure_hf_client`.
    """
    hf_home = tmp_path_factory.mktemp("hf_home")
    with FakeHub(**getattr(request, "param", {})) as hub:
        configure_hf_client(monkeypatch, hub, hf_home)
        try:
            yield hub
        finally:
            # close the client's pooled keep-alive connections before the server goes away
            _close_client_session()
