"""Talking to the Hugging Face Hub: metadata before the download, then the files, resumably.

Everything goes through the real `huggingface_hub` client. The endpoint is read from
`HF_ENDPOINT` at call time (the client reads it once, at import). Every network step has a
timeout and transient failures are retried with backoff; an interrupted download leaves the
client's `.incomplete` file in the download directory, which the next attempt resumes.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from huggingface_hub import HfApi, hf_hub_download, hf_hub_url
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    NotASafetensorsRepoError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
    SafetensorsParsingError,
)
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status
from tqdm.auto import tqdm

from ftw.config_file import load_config
from ftw.errors import SourceError
from ftw.safetensors_source import SAFETENSORS_DTYPES

log = logging.getLogger(__name__)

T = TypeVar("T")
METADATA_TIMEOUT_S = float(os.environ.get("FT_HUB_TIMEOUT", "30"))
# Files a checkpoint needs besides its weights. Pickled weights (*.bin, *.pt) are never fetched.
AUX_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "LICENSE",
)


class HubError(Exception):
    """A Hub request failed for good; the message says what and what to try."""


class HubUnreachable(HubError):
    """The Hub could not be reached (offline, DNS, network errors through every retry): no answer
    about the repository, unlike a HubError that is one (not found, gated, malformed)."""


@dataclass(frozen=True)
class RemoteFile:
    name: str
    size: int


@dataclass(frozen=True)
class RemoteCheckpoint:
    """What the Hub says about a repository, before any weights are downloaded."""

    repo_id: str
    revision: str  # the commit sha the branch or tag resolved to
    config: dict[str, Any]
    files: tuple[RemoteFile, ...]  # the ones a pull downloads
    tensors: dict[str, tuple[str, int]]  # name -> (FTW dtype, nbytes)

    @property
    def download_bytes(self) -> int:
        return sum(f.size for f in self.files)


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


PARTIAL_SUFFIX = ".part"  # a download in progress, kept across runs to resume from


def _permanent(e: BaseException) -> bool:
    if isinstance(e, (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError, GatedRepoError)):
        return True
    if isinstance(e, HfHubHTTPError) and e.response is not None:
        return 400 <= e.response.status_code < 500 and e.response.status_code not in (408, 429)
    return False


def _local_write_error(e: BaseException) -> str | None:
    """What is wrong where a failure is this machine's own disk (full, read-only, not ours)."""
    if not isinstance(e, OSError) or isinstance(e, ConnectionError) or e.errno is None:
        return None
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"the disk is full ({e.strerror}): free space on the disk that holds FT_HOME"
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"cannot write the download ({e.strerror}{': ' + str(e.filename) if e.filename else ''}); check FT_HOME"
    return None


def _causes(e: BaseException | None) -> list[BaseException]:
    """`e` and what caused it, outermost first (each once)."""
    chain: list[BaseException] = []
    while e is not None and all(e is not seen for seen in chain):
        chain.append(e)
        e = e.__cause__ or e.__context__
    return chain


def _unreachable_reason(e: BaseException) -> str | None:
    """Why the host could not be reached where `e` (or what caused it) says it never answered: a
    failed name lookup (offline, or a DNS that does not answer) or a refused connection (nothing
    listens there). Neither is retried: it fails again within seconds, and five attempts with
    backoff kept an offline user waiting 15-20 s for the same answer."""
    for cause in _causes(e):
        text = str(cause)
        if isinstance(cause, socket.gaierror) or any(m in text for m in (
                "Name or service not known", "Temporary failure in name resolution",
                "nodename nor servname provided", "getaddrinfo failed", "No address associated")):
            return "resolve"
        if isinstance(cause, ConnectionRefusedError) or getattr(cause, "errno", None) == errno.ECONNREFUSED \
                or "Connection refused" in text:
            return "refused"
    return None


def _host_of(e: BaseException) -> str:
    """The host a failed request went to (an httpx error's request; a download may be redirected
    off the endpoint), else the endpoint's."""
    for cause in _causes(e):
        try:
            host = cause.request.url.host  # type: ignore[attr-defined]  # (httpx raises without a request)
        except (AttributeError, RuntimeError):
            continue
        if host:
            return str(host)
    return endpoint().split("://", 1)[-1].split("/", 1)[0]


OFFLINE_WAYS = ("to work offline: models already pulled run (`ft list`), `ft pull ./checkpoint-dir` or "
                "`ft pull ./model.gguf` converts files on this machine, HF_ENDPOINT=URL names another hub")


def with_retries(what: str, fn: Callable[[], T], *, resumes: bool = False) -> T:
    """Run `fn`, retrying transient failures (network, 5xx, 429) with exponential backoff.
    `resumes`: `fn` downloads a file that a later pull resumes (the message says so; a metadata
    step has nothing to resume). A host that does not resolve or refuses the connection is not
    retried.

    `FT_PULL_RETRIES` (default 5 attempts) and `FT_PULL_RETRY_DELAY_S` (first backoff, default 1 s)
    tune it.
    """
    try:
        attempts = max(1, int(os.environ.get("FT_PULL_RETRIES", "5")))
        delay = float(os.environ.get("FT_PULL_RETRY_DELAY_S", "1.0"))
    except ValueError:
        raise HubError(f"FT_PULL_RETRIES={os.environ.get('FT_PULL_RETRIES')!r} or FT_PULL_RETRY_DELAY_S="
                       f"{os.environ.get('FT_PULL_RETRY_DELAY_S')!r} is not a number; unset it or give one") from None
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except (RepositoryNotFoundError, GatedRepoError) as e:
            raise HubError(
                f"{what}: the repository does not exist or needs access ({type(e).__name__}); check the name, "
                "accept its license on huggingface.co and set HF_TOKEN if it is gated"
            ) from None
        except (RevisionNotFoundError, EntryNotFoundError) as e:
            raise HubError(f"{what}: {e}".splitlines()[0]) from None
        except NotASafetensorsRepoError:
            raise HubError(
                f"{what}: the repository has no safetensors weights (ft never loads pickled .bin/.pt files); "
                "look for a safetensors or GGUF variant of the model"
            ) from None
        except SafetensorsParsingError as e:
            raise HubError(f"{what}: a safetensors header on the Hub is malformed ({e})") from None
        except Exception as e:  # network errors come in many types across client versions
            local = _local_write_error(e)
            if local is not None:  # the disk, not the network: retrying downloads it all again
                raise HubError(f"{what}: {local}; the pull resumes from what is downloaded when run again") from e
            again = "run the pull again: it resumes" if resumes else "try again"
            unreachable = _unreachable_reason(e)
            if unreachable is not None:
                host = _host_of(e)
                why = (f"cannot resolve {host}: this machine is offline or its DNS does not answer; connect"
                       if unreachable == "resolve" else
                       f"{host} refused the connection: nothing answers there ({endpoint()}"
                       f"{', from HF_ENDPOINT' if 'HF_ENDPOINT' in os.environ else ''}); start it or fix the address")
                raise HubUnreachable(f"{what}: {why} and {again} ({OFFLINE_WAYS})") from None
            if _permanent(e) or attempt == attempts:
                raise (HubError if _permanent(e) else HubUnreachable)(
                    f"{what} failed after {attempt} attempt(s): {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; "
                    f"check the network (endpoint {endpoint()}) and {again}"
                ) from e
            log.warning("%s: %s (attempt %d of %d), retrying in %.1fs", what, type(e).__name__, attempt, attempts, delay)
            time.sleep(delay)
            delay = min(delay * 2, 30.0)
    raise AssertionError("unreachable")


def _api() -> HfApi:
    return HfApi(endpoint=endpoint())


def fetch_file_sizes(repo_id: str, revision: str | None) -> tuple[str, dict[str, int]]:
    """The commit `revision` resolves to, and the size of every file in the repository then."""
    info = with_retries(f"looking up {repo_id}", lambda: _api().model_info(
        repo_id, revision=revision, files_metadata=True, timeout=METADATA_TIMEOUT_S))
    return info.sha or revision or "main", {s.rfilename: int(s.size or 0) for s in (info.siblings or [])}


def fetch_checkpoint_info(repo_id: str, revision: str | None) -> RemoteCheckpoint:
    """Resolve the revision, list the files and read config + safetensors headers (no weights)."""
    api = _api()
    commit, sizes = fetch_file_sizes(repo_id, revision)
    if "config.json" not in sizes:
        raise HubError(f"{repo_id}@{commit[:12]} has no config.json: it is not a Transformers checkpoint")
    config_path = with_retries(f"downloading {repo_id}/config.json", lambda: hf_hub_download(
        repo_id, "config.json", revision=commit, endpoint=endpoint(), etag_timeout=METADATA_TIMEOUT_S))
    try:
        config = load_config(Path(config_path).parent)  # the same checks as a local checkpoint's
    except SourceError as e:
        raise HubError(f"{repo_id}: {e}") from None
    meta = with_retries(f"reading safetensors headers of {repo_id}", lambda: api.get_safetensors_metadata(
        repo_id, revision=commit, timeout=METADATA_TIMEOUT_S))
    tensors: dict[str, tuple[str, int]] = {}
    for file_meta in meta.files_metadata.values():
        for name, t in file_meta.tensors.items():
            begin, end = t.data_offsets
            tensors[name] = (SAFETENSORS_DTYPES.get(t.dtype, t.dtype.lower()), end - begin)
    weight_files = sorted(set(meta.weight_map.values()))
    wanted = [*weight_files, *(["model.safetensors.index.json"] if meta.sharded else []),
              *(f for f in AUX_FILES if f in sizes)]
    files = tuple(RemoteFile(f, sizes.get(f, 0)) for f in wanted)
    return RemoteCheckpoint(repo_id=repo_id, revision=commit, config=config, files=files, tensors=tensors)


def _forwarding_tqdm(on_position: Callable[[int], None]) -> type[tqdm]:
    """A silent tqdm class that reports the client's position in the file to `on_position`."""

    class Forward(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            self.position_bytes = int(kwargs.get("initial") or 0)  # > 0 when resuming
            on_position(self.position_bytes)

        def update(self, n: float | None = 1) -> bool | None:
            self.position_bytes += int(n or 0)
            on_position(self.position_bytes)
            return super().update(n)

    return Forward


def download_files(
    repo_id: str,
    revision: str,
    files: Iterable[RemoteFile],
    local_dir: Path,
    on_progress: Callable[[int], None] | None = None,
) -> None:
    """Download `files` into `local_dir` (one commit's: `revision` is a commit hash), skipping
    complete ones; interrupted ones resume.

    `on_progress(bytes)` gets the bytes present so far over all `files` as they arrive.
    """
    report = on_progress or (lambda n: None)
    finished = 0
    for f in files:
        target = local_dir / f.name
        if not (target.is_file() and f.size and target.stat().st_size == f.size):
            tqdm_class = _forwarding_tqdm(lambda pos, base=finished: report(base + pos))
            with_retries(f"downloading {repo_id}/{f.name}", resumes=True, fn=lambda f=f, target=target, tqdm_class=tqdm_class: (
                _download_resumable(repo_id, revision, f, target, tqdm_class)))
            size = target.stat().st_size
            if f.size and size != f.size:
                raise HubError(f"{repo_id}/{f.name}: downloaded {size} bytes, the Hub lists {f.size}; pull again")
        finished += f.size
        report(finished)


def read_prefix(repo_id: str, revision: str, name: str, nbytes: int) -> bytes:
    """The first `nbytes` of a file (one ranged GET through the client's session)."""
    url = hf_hub_url(repo_id, name, revision=revision, endpoint=endpoint())

    def get() -> bytes:
        headers = {**build_hf_headers(), "Range": f"bytes=0-{nbytes - 1}"}
        with get_session().stream("GET", url, headers=headers, follow_redirects=True,
                                  timeout=METADATA_TIMEOUT_S) as response:
            hf_raise_for_status(response)
            data = bytearray()
            for chunk in response.iter_bytes():  # a server that ignores Range sends the whole file: stop early
                data += chunk
                if len(data) >= nbytes:
                    break
        return bytes(data[:nbytes])

    return with_retries(f"reading the header of {repo_id}/{name}", get)


def _download_resumable(repo_id: str, revision: str, f: RemoteFile, target: Path, tqdm_class: type[tqdm]) -> None:
    """One file through the client's own HTTP GET (its session, auth headers and endpoint) into
    `<target>.part`, appending to what an earlier attempt or run left there, then renamed into
    place. (hf_hub_download writes each attempt to a new temporary file and deletes it when
    interrupted: a killed 100 GB download started again from its first byte.)"""
    part = target.with_name(target.name + PARTIAL_SUFFIX)
    part.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.is_file() else 0
    if f.size and have > f.size:  # not a prefix of this file
        have = 0
        part.unlink()
    url = hf_hub_url(repo_id, f.name, revision=revision, endpoint=endpoint())
    with open(part, "ab") as out:
        if have:
            log.info("%s/%s: resuming at byte %d of %d", repo_id, f.name, have, f.size)
        http_get(url, out, resume_size=have, headers=build_hf_headers(), expected_size=f.size or None,
                 displayed_filename=f.name, tqdm_class=tqdm_class)
        out.flush()
        os.fsync(out.fileno())
    os.replace(part, target)
