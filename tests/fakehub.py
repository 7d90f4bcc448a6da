"""A local, offline stand-in for the Hugging Face Hub, for tests.

`FakeHub` is a threaded HTTP server on 127.0.0.1 that serves local directories as model repositories the way
huggingface.co does, so that the *real* ``huggingface_hub`` client (``hf_hub_download``, ``snapshot_download``,
``HfApi.model_info``, ``get_safetensors_metadata``, ...) can pull from it through ``HF_ENDPOINT``.

Routes served (``{repo_id}`` may contain a ``/``, ``{revision}`` is a branch/tag name or a commit sha, URL-quoted)::

    HEAD|GET /{repo_id}/resolve/{revision}/{path}           file metadata / content (Range => 206)
    HEAD|GET /cdn/{sha256}/{path}                           LFS content, on a second origin (see `lfs_redirect`)
    GET      /api/models/{repo_id}[/revision/{revision}]    model_info / repo_info (``siblings``, ``sha``, ...)
    GET      /api/models/{repo_id}/tree/{revision}[/{dir}]  list_repo_tree (``recursive``, Link-header pagination)
    POST     /api/models/{repo_id}/paths-info/{revision}    get_paths_info
    GET      /api/models/{repo_id}/refs                     list_repo_refs

Headers the client relies on, and what this server sends:

* ``X-Repo-Commit``: the resolved 40-hex commit sha, on every ``/resolve`` answer (404 EntryNotFound included: the
  client uses it to cache the non-existence of the file). Without it ``hf_hub_download`` raises.
* ``ETag``: git blob sha1 (``sha1(b"blob <size>\\0" + data)``) for regular files, sha256 of the content for LFS files
  (also in ``X-Linked-Etag``, which the client prefers). The etag names the blob in the client's cache.
* ``X-Linked-Size`` (LFS) / ``Content-Length``: the file size; the client checks the downloaded size against it.
* ``Accept-Ranges: bytes`` and ``206 Partial Content`` + ``Content-Range`` for ``Range: bytes=a-b`` / ``a-`` /
  ``-n``; ``416`` + ``Content-Range: bytes */size`` for unsatisfiable ranges.
* Errors: ``404`` with ``X-Error-Code: RepoNotFound`` (-> ``RepositoryNotFoundError``), ``RevisionNotFound``
  (-> ``RevisionNotFoundError``) or ``EntryNotFound`` (-> ``EntryNotFoundError``), plus ``X-Error-Message`` and a
  JSON ``{"error": ...}`` body.
* Xet: no ``X-Xet-Hash`` / ``X-Xet-Refresh-Route`` / ``Link: <...>; rel="xet-auth"`` header and no ``xetHash`` in
  tree entries, ever. That alone makes any client version fall back to plain HTTP downloads; ``configure_hf_client``
  additionally sets ``HF_HUB_DISABLE_XET=1``.

With ``lfs_redirect=True`` (the default, as on huggingface.co) ``/resolve`` answers ``302 Found`` for LFS files, with the
metadata headers above and ``Location`` pointing to a second listener (``http://localhost:<other port>``: another host,
hence another origin, like a CDN). The client stops at that 302 for the HEAD (it only follows same-origin redirects there), and downloads from
the ``Location`` directly, without the ``Authorization`` header.

Fault injection (for tests of resume / timeout logic):

* ``fail_next(path, after_bytes=N, times=1)``: the next GET(s) that serve the content of ``path`` (status 200/206, on
  the hub or the CDN origin) send the headers and ``N`` bytes of *that response's* body, then close the connection
  (``mode="close"``: orderly FIN, the client sees an incomplete body; ``mode="reset"``: TCP RST).
* ``delay(path, seconds, ...)`` / ``delay_api(seconds, ...)``: stall a response, to exercise client timeouts.
* ``hub.requests``: ``[(method, path, range_header_or_None), ...]`` in arrival order; ``hub.log`` holds richer
  `LoggedRequest` records (status, repo_id, filename, body bytes sent, whether a fault was applied).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qs, quote, unquote, urlsplit

__all__ = [
    "DEFAULT_LFS_PATTERNS",
    "FakeHub",
    "LoggedRequest",
    "RequestTuple",
    "configure_hf_client",
    "git_blob_sha1",
    "skip_client_backoff",
]

# Files the Hub's default .gitattributes stores with LFS (subset that matters for model repos).
DEFAULT_LFS_PATTERNS: tuple[str, ...] = (
    "*.safetensors",
    "*.bin",
    "*.pt",
    "*.pth",
    "*.ckpt",
    "*.gguf",
    "*.onnx",
    "*.h5",
    "*.msgpack",
    "*.npy",
    "*.npz",
    "*.pkl",
    "*.zst",
    "*.tar",
    "*.gz",
    "*.zip",
)
# Anything this large is also treated as LFS (the Hub rejects regular git files over 10 MB).
LFS_SIZE_THRESHOLD = 10 * 1024 * 1024

_CHUNK = 64 * 1024
_MISSING = object()
_DATE = "2024-01-01T00:00:00.000Z"
_SHA40 = re.compile(r"[0-9a-f]{40}")


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob (what the Hub uses as ETag for non-LFS files)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


@dataclass
class _File:
    path: str
    data: bytes
    lfs: bool
    sha256: str
    git_oid: str  # oid of the git blob: the file itself, or its LFS pointer

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_oid

    def tree_entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "file", "oid": self.git_oid, "size": self.size, "path": self.path}
        if self.lfs:
            entry["lfs"] = {
                "oid": self.sha256,
                "size": self.size,
                "pointerSize": len(_lfs_pointer(self.sha256, self.size)),
            }
        return entry


@dataclass
class _Snapshot:
    commit: str
    files: dict[str, _File]


@dataclass
class _Repo:
    repo_id: str
    refs: dict[str, str] = field(default_factory=dict)  # revision name -> commit sha
    snapshots: dict[str, _Snapshot] = field(default_factory=dict)  # commit sha -> snapshot
    default_branch: str = "main"

    def resolve(self, revision: str) -> _Snapshot | None:
        if revision in self.refs:
            return self.snapshots[self.refs[revision]]
        if revision in self.snapshots:
            return self.snapshots[revision]
        if re.fullmatch(r"[0-9a-f]{7,40}", revision):  # abbreviated commit sha
            matches = [s for c, s in self.snapshots.items() if c.startswith(revision)]
            if len(matches) == 1:
                return matches[0]
        return None


class RequestTuple(NamedTuple):
    """One entry of `FakeHub.requests`."""

    method: str
    path: str  # unquoted path, without the query string
    range: str | None  # the Range request header, verbatim


@dataclass
class LoggedRequest:
    """One entry of `FakeHub.log` (filled in as the request is answered)."""

    method: str
    path: str
    range: str | None
    origin: str  # "hub" or "cdn"
    query: str = ""
    repo_id: str | None = None
    filename: str | None = None
    status: int | None = None
    body_bytes: int = 0  # bytes of body actually written
    fault: str | None = None  # "dropped", "reset", "delayed" when a fault was injected


@dataclass
class _Fault:
    kind: str  # "fail" | "delay" | "delay_api"
    filename: str | None
    repo_id: str | None
    methods: tuple[str, ...]
    remaining: int | None  # None = forever
    after_bytes: int = 0
    seconds: float = 0.0
    mode: str = "close"


class _DropConnection(Exception):
    pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, hub: FakeHub, origin: str):
        self.hub = hub
        self.origin = origin
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:  # quiet on client disconnects
        if isinstance(sys.exc_info()[1], (OSError, _DropConnection)):  # ConnectionError, TimeoutError, ...
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeHub/1.0"
    timeout = 60  # idle keep-alive connections are closed eventually
    server: _Server

    # ------------------------------------------------------------------ plumbing
    def log_message(self, format: str, *args: Any) -> None:  # silence the per-request stderr log
        pass

    def setup(self) -> None:
        super().setup()
        self.server.hub._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        finally:
            self.server.hub._track(self.connection, add=False)

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        hub = self.server.hub
        split = urlsplit(self.path)
        path = unquote(split.path)
        self.rec = LoggedRequest(
            method=method,
            path=path,
            range=self.headers.get("Range"),
            origin=self.server.origin,
            query=split.query,
        )
        hub._record(self.rec)
        length = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(length) if length else b""
        self.query = parse_qs(split.query, keep_blank_values=True)
        try:
            if self.server.origin == "cdn":
                self._serve_cdn(method, split.path)
            elif split.path.startswith("/api/"):
                self._serve_api(method, split.path)
            elif "/resolve/" in split.path:
                self._serve_resolve(method, split.path)
            else:
                self._error(404, None, "Not Found")
        except _DropConnection:
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):  # client went away (e.g. it timed out)
            self.close_connection = True

    def _send(self, status: int, headers: dict[str, str], body: bytes = b"", *, head: bool = False) -> None:
        self.rec.status = status
        self.send_response(status)
        headers = {"Content-Length": str(len(body)), **headers}
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if not head and body:
            self.wfile.write(body)
            self.rec.body_bytes = len(body)

    def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode()
        self._send(status, {"Content-Type": "application/json; charset=utf-8", **(headers or {})}, body)

    def _error(
        self, status: int, code: str | None, message: str, extra: dict[str, str] | None = None
    ) -> None:
        headers = {"X-Error-Message": message, **(extra or {})}
        if code is not None:
            headers["X-Error-Code"] = code
        body = json.dumps({"error": message}).encode()
        self._send(
            status,
            {"Content-Type": "application/json; charset=utf-8", **headers},
            body,
            head=self.command == "HEAD",
        )

    # ------------------------------------------------------------------ /resolve and CDN
    def _serve_resolve(self, method: str, raw_path: str) -> None:
        hub = self.server.hub
        if method not in ("GET", "HEAD"):
            return self._error(405, None, "Method not allowed")
        repo_part, _, rest = raw_path.lstrip("/").partition("/resolve/")
        repo_id = unquote(repo_part)
        revision, _, filename = rest.partition("/")
        revision, filename = unquote(revision), unquote(filename)
        self.rec.repo_id, self.rec.filename = repo_id, filename
        hub._apply_delay(self, method, repo_id, filename, api=False)

        repo = hub._repos.get(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", "Repository not found")
        snapshot = repo.resolve(revision)
        if snapshot is None:
            return self._error(404, "RevisionNotFound", "Invalid rev id: " + revision)
        file = snapshot.files.get(filename)
        if file is None:
            return self._error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": snapshot.commit})
        name = Path(filename).name
        headers = {
            "X-Repo-Commit": snapshot.commit,
            "Accept-Ranges": "bytes",
            "Content-Disposition": f"inline; filename*=UTF-8''{quote(name)}; "
            f'filename="{name if name.isascii() else quote(name)}";',
        }
        if file.lfs:
            headers["X-Linked-Etag"] = f'"{file.sha256}"'
            headers["X-Linked-Size"] = str(file.size)
        if file.lfs and hub.lfs_redirect:
            location = f"{hub.cdn_endpoint}/cdn/{file.sha256}/{quote(filename)}"
            headers.update({"ETag": f'"{file.git_oid}"', "Location": location, "Content-Type": "text/plain"})
            body = f"Found. Redirecting to {location}".encode()
            return self._send(302, headers, body, head=method == "HEAD")
        headers["ETag"] = f'"{file.etag}"'
        self._serve_content(method, repo_id, filename, file, headers)

    def _serve_cdn(self, method: str, raw_path: str) -> None:
        hub = self.server.hub
        parts = raw_path.lstrip("/").split("/", 2)
        if method not in ("GET", "HEAD") or len(parts) != 3 or parts[0] != "cdn":
            return self._error(404, None, "Not Found")
        sha256, filename = parts[1], unquote(parts[2])
        found = hub._find_blob(sha256, filename)
        self.rec.filename = filename
        if found is None:
            return self._error(404, None, "Not Found")
        repo_id, file = found
        self.rec.repo_id = repo_id
        hub._apply_delay(self, method, repo_id, filename, api=False)
        headers = {"ETag": f'"{file.sha256}"', "Accept-Ranges": "bytes"}
        self._serve_content(method, repo_id, filename, file, headers)

    def _serve_content(
        self, method: str, repo_id: str, filename: str, file: _File, headers: dict[str, str]
    ) -> None:
        hub = self.server.hub
        size = file.size
        start, end, status = 0, size - 1, 200
        range_header = self.headers.get("Range")
        if range_header:
            parsed = _parse_range(range_header, size)
            if parsed == "unsatisfiable":
                return self._send(416, {"Content-Range": f"bytes */{size}"}, head=method == "HEAD")
            if parsed is not None:
                start, end = parsed
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        body = file.data[start : end + 1]
        headers.setdefault("Content-Type", "application/octet-stream")
        if method == "HEAD":
            return self._send(status, headers, body, head=True)

        fail = hub._take_fault("fail", "GET", repo_id, filename)
        stall = hub._take_fault("delay", "GET", repo_id, filename, mid_body=True)
        self.rec.status = status
        self.send_response(status)
        for key, value in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.flush()
        limit = len(body) if fail is None else min(fail.after_bytes, len(body))
        sent = 0

        def write_until(target: int) -> None:
            nonlocal sent
            while sent < target:
                stop = min(target, sent + _CHUNK)
                self.wfile.write(body[sent:stop])
                sent = stop
                self.rec.body_bytes = sent

        if stall is not None and stall.after_bytes < limit:
            write_until(stall.after_bytes)
            self.wfile.flush()
            self.rec.fault = "delayed"
            hub._sleep(stall.seconds)
        write_until(limit)
        self.wfile.flush()
        if fail is not None:
            self.rec.fault = "reset" if fail.mode == "reset" else "dropped"
            _drop(self.connection, reset=fail.mode == "reset")
            raise _DropConnection

    # ------------------------------------------------------------------ /api
    def _serve_api(self, method: str, raw_path: str) -> None:
        hub = self.server.hub
        parts = [unquote(p) for p in raw_path.split("/")[2:]]  # after "/api/"
        if not parts or parts[0] != "models":
            return self._error(404, None, "Not Found")
        parts = parts[1:]
        repo_id, tail = hub._split_repo(parts)
        self.rec.repo_id = repo_id
        hub._apply_delay(self, method, repo_id, None, api=True)
        repo = hub._repos.get(repo_id) if repo_id else None
        if repo is None:
            return self._error(404, "RepoNotFound", "Repository not found")

        if not tail and method == "GET":
            return self._model_info(repo, repo.default_branch)
        if len(tail) >= 2 and tail[0] == "revision" and method == "GET":
            return self._model_info(repo, "/".join(tail[1:]))
        if len(tail) >= 2 and tail[0] == "tree" and method == "GET":
            return self._tree(repo, tail[1], "/".join(tail[2:]))
        if len(tail) >= 2 and tail[0] == "paths-info" and method == "POST":
            return self._paths_info(repo, "/".join(tail[1:]))
        if tail == ["refs"] and method == "GET":
            return self._refs(repo)
        return self._error(404, None, "Not Found")

    def _snapshot_or_404(self, repo: _Repo, revision: str) -> _Snapshot | None:
        snapshot = repo.resolve(revision)
        if snapshot is None:
            self._error(404, "RevisionNotFound", "Invalid rev id: " + revision)
        return snapshot

    def _model_info(self, repo: _Repo, revision: str) -> None:
        snapshot = self._snapshot_or_404(repo, revision)
        if snapshot is None:
            return
        blobs = _truthy(self.query.get("blobs"))
        siblings = []
        for f in sorted(snapshot.files.values(), key=lambda f: f.path):
            sibling: dict[str, Any] = {"rfilename": f.path}
            if blobs:
                sibling.update(size=f.size, blobId=f.git_oid)
                if f.lfs:
                    sibling["lfs"] = {
                        "size": f.size,
                        "sha256": f.sha256,
                        "pointerSize": len(_lfs_pointer(f.sha256, f.size)),
                    }
            siblings.append(sibling)
        author = repo.repo_id.split("/")[0] if "/" in repo.repo_id else None
        info: dict[str, Any] = {
            "_id": snapshot.commit[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": author,
            "sha": snapshot.commit,
            "lastModified": _DATE,
            "createdAt": _DATE,
            "private": False,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "library_name": None,
            "siblings": siblings,
            "usedStorage": sum(f.size for f in snapshot.files.values()),
        }
        params = _safetensors_parameters(snapshot)
        if params:
            info["safetensors"] = {"parameters": params, "total": sum(params.values())}
        config = snapshot.files.get("config.json")
        if config is not None:
            try:
                cfg = json.loads(config.data)
                info["config"] = {k: cfg[k] for k in ("architectures", "model_type") if k in cfg}
            except ValueError:
                pass
        self._json(200, info)

    def _tree(self, repo: _Repo, revision: str, directory: str) -> None:
        hub = self.server.hub
        snapshot = self._snapshot_or_404(repo, revision)
        if snapshot is None:
            return
        recursive = _truthy(self.query.get("recursive"))
        directory = directory.strip("/")
        entries = _tree_entries(snapshot, directory, recursive)
        if entries is None:
            return self._error(404, "EntryNotFound", f"{directory} does not exist on {revision}")
        cursor = int((self.query.get("cursor") or ["0"])[0] or 0)
        page = entries[cursor : cursor + hub.tree_page_size]
        headers = {}
        if cursor + hub.tree_page_size < len(entries):
            query = {k: v[0] for k, v in self.query.items() if k != "cursor"}
            query["cursor"] = str(cursor + hub.tree_page_size)
            qs = "&".join(f"{k}={quote(v)}" for k, v in query.items())
            path = f"/api/models/{repo.repo_id}/tree/{quote(revision, safe='')}"
            if directory:
                path += "/" + quote(directory)
            headers["Link"] = f'<{hub.endpoint}{path}?{qs}>; rel="next"'
        self._json(200, page, headers)

    def _paths_info(self, repo: _Repo, revision: str) -> None:
        snapshot = self._snapshot_or_404(repo, revision)
        if snapshot is None:
            return
        ctype = self.headers.get("Content-Type", "")
        if "json" in ctype:
            payload = json.loads(self.body or b"{}")
            paths = payload.get("paths", [])
        else:
            paths = parse_qs(self.body.decode(), keep_blank_values=True).get("paths", [])
        dirs = _directories(snapshot)
        result = []
        for p in paths:
            p = p.strip("/")
            if p in snapshot.files:
                result.append(snapshot.files[p].tree_entry())
            elif p in dirs:
                result.append(_dir_entry(snapshot, p))
        self._json(200, result)

    def _refs(self, repo: _Repo) -> None:
        def ref(name: str, kind: str) -> dict[str, str]:
            return {"name": name, "ref": f"refs/{kind}/{name}", "targetCommit": repo.refs[name]}

        branches = [ref(n, "heads") for n in repo.refs]  # every revision is served as a branch
        tags: list[dict[str, str]] = []
        payload: dict[str, Any] = {"branches": branches, "tags": tags, "converts": []}
        if _truthy(self.query.get("include_prs")):
            payload["pullRequests"] = []
        self._json(200, payload)


def _cdn_host() -> str:
    """``localhost`` where it names 127.0.0.1 (a host other than the hub's), else 127.0.0.1."""
    global _CDN_HOST
    if _CDN_HOST is None:
        try:
            addresses = {info[4][0] for info in socket.getaddrinfo("localhost", None, socket.AF_INET)}
        except OSError:
            addresses = set()
        _CDN_HOST = "localhost" if "127.0.0.1" in addresses else "127.0.0.1"
    return _CDN_HOST


_CDN_HOST: str | None = None


def _truthy(values: list[str] | None) -> bool:
    return bool(values) and values[0].lower() in ("1", "true", "yes", "on")


def _parse_range(header: str, size: int) -> tuple[int, int] | str | None:
    """(start, end) inclusive, "unsatisfiable", or None to ignore the header (serve the whole file)."""
    m = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", header, re.IGNORECASE)
    if not m or (not m.group(1) and not m.group(2)):
        return None  # malformed or multi-range: a server may ignore it
    first, last = m.groups()
    if not first:  # suffix range: last N bytes
        n = int(last)
        if n == 0 or size == 0:
            return "unsatisfiable"
        return max(size - n, 0), size - 1
    start = int(first)
    end = int(last) if last else size - 1
    if start >= size or end < start:
        return "unsatisfiable"
    return start, min(end, size - 1)


def _drop(conn: socket.socket, *, reset: bool) -> None:
    try:
        if reset:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
        else:
            conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _directories(snapshot: _Snapshot) -> set[str]:
    dirs = set()
    for path in snapshot.files:
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    return dirs


def _dir_entry(snapshot: _Snapshot, path: str) -> dict[str, Any]:
    oid = hashlib.sha1(
        "".join(
            f"{p}\0{f.git_oid}\n" for p, f in sorted(snapshot.files.items()) if p.startswith(path + "/")
        ).encode()
    ).hexdigest()
    return {"type": "directory", "oid": oid, "size": 0, "path": path}


def _tree_entries(snapshot: _Snapshot, directory: str, recursive: bool) -> list[dict[str, Any]] | None:
    dirs = _directories(snapshot)
    if directory and directory not in dirs:
        return None
    prefix = directory + "/" if directory else ""
    out: list[dict[str, Any]] = []
    for d in sorted(dirs):
        if d.startswith(prefix) and (recursive or "/" not in d[len(prefix) :]):
            out.append(_dir_entry(snapshot, d))
    for p in sorted(snapshot.files):
        if p.startswith(prefix) and (recursive or "/" not in p[len(prefix) :]):
            out.append(snapshot.files[p].tree_entry())
    # the Hub lists directories first, then files, each group in path order
    return out


def _safetensors_parameters(snapshot: _Snapshot) -> dict[str, int]:
    params: dict[str, int] = {}
    for f in snapshot.files.values():
        if not f.path.endswith(".safetensors") or f.size < 8:
            continue
        (n,) = struct.unpack("<Q", f.data[:8])
        try:
            header = json.loads(f.data[8 : 8 + n])
        except ValueError:
            continue
        for name, info in header.items():
            if name == "__metadata__":
                continue
            count = 1
            for dim in info.get("shape", []):
                count *= dim
            params[info["dtype"]] = params.get(info["dtype"], 0) + count
    return params


class FakeHub:
    """A fake Hugging Face Hub on 127.0.0.1 (ephemeral ports). Use as a context manager, or start()/stop().

    Args:
        lfs_redirect: answer ``/resolve`` of LFS files with a 302 to a second origin (like the real Hub's CDN).
        lfs_patterns: fnmatch patterns (on the file's name and path) of files stored as LFS; files larger than
            `LFS_SIZE_THRESHOLD` are LFS too.
        tree_page_size: entries per page of ``/api/models/{repo}/tree`` (the Hub uses 1000).
    """

    def __init__(
        self,
        *,
        lfs_redirect: bool = True,
        lfs_patterns: Iterable[str] = DEFAULT_LFS_PATTERNS,
        tree_page_size: int = 1000,
    ) -> None:
        self.lfs_redirect = lfs_redirect
        self.lfs_patterns = tuple(lfs_patterns)
        self.tree_page_size = tree_page_size
        self.log: list[LoggedRequest] = []
        self._repos: dict[str, _Repo] = {}
        self._faults: list[_Fault] = []
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._servers: list[_Server] = []
        self._threads: list[threading.Thread] = []
        self.hf_home: Path | None = None  # set by the `fake_hub` fixture (see configure_hf_client)

    @property
    def cache_dir(self) -> Path:
        """The huggingface_hub cache the `fake_hub` fixture points the client at (``$HF_HOME/hub``)."""
        if self.hf_home is None:
            raise RuntimeError("hf_home is only set by the fake_hub fixture / configure_hf_client(hub=...)")
        return self.hf_home / "hub"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> FakeHub:
        if self._servers:
            return self
        self._stopping.clear()
        for origin in ("hub", "cdn"):
            server = _Server(self, origin)
            thread = threading.Thread(
                target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
            )
            thread.start()
            self._servers.append(server)
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes up delayed responses
        for server in self._servers:
            server.shutdown()
            server.server_close()
        with self._lock:
            conns = list(self._connections)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in self._threads:
            thread.join(timeout=5)
        self._servers.clear()
        self._threads.clear()

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        """Base URL to use as ``HF_ENDPOINT`` (no trailing slash)."""
        if not self._servers:
            raise RuntimeError("FakeHub is not started")
        return f"http://127.0.0.1:{self._servers[0].server_address[1]}"

    @property
    def cdn_endpoint(self) -> str:
        """Base URL of the second origin LFS downloads are redirected to.

        Its host is ``localhost`` (the hub's is ``127.0.0.1``): some client versions compare hosts only, not ports,
        when they decide whether a redirect stays on the Hub (then they follow it in the HEAD and miss the
        metadata headers of the 302, as they would for a real CDN).
        """
        if not self._servers:
            raise RuntimeError("FakeHub is not started")
        return f"http://{_cdn_host()}:{self._servers[1].server_address[1]}"

    # ------------------------------------------------------------------ repos
    def add_repo(self, repo_id: str, directory: str | os.PathLike[str], revision: str = "main") -> str:
        """Serve the files under `directory` as model repo `repo_id` at `revision`. Returns the commit sha.

        The commit sha is a deterministic function of the files (paths and contents). The same repo can be added
        several times under different revisions (branches/tags); the repo is also reachable by commit sha.
        Files are read once, now: later changes to `directory` are not seen (call add_repo again).
        """
        root = Path(directory)
        if not root.is_dir():
            raise NotADirectoryError(root)
        files: dict[str, _File] = {}
        for p in sorted(root.rglob("*")):
            if not p.is_file():
                continue
            rel = p.relative_to(root).as_posix()
            if rel.startswith(".git/") or rel == ".git":
                continue
            data = p.read_bytes()
            sha256 = hashlib.sha256(data).hexdigest()
            lfs = self._is_lfs(rel, len(data))
            oid = git_blob_sha1(_lfs_pointer(sha256, len(data)) if lfs else data)
            files[rel] = _File(path=rel, data=data, lfs=lfs, sha256=sha256, git_oid=oid)
        listing = "".join(f"{path}\0{f.git_oid}\n" for path, f in sorted(files.items()))
        commit = hashlib.sha1(f"fakehub commit\n{listing}".encode()).hexdigest()
        with self._lock:
            repo = self._repos.get(repo_id)
            if repo is None:
                repo = self._repos[repo_id] = _Repo(repo_id=repo_id, default_branch=revision)
            if revision == "main":
                repo.default_branch = "main"
            repo.refs[revision] = commit
            repo.snapshots[commit] = _Snapshot(commit=commit, files=files)
        return commit

    def commit_sha(self, repo_id: str, revision: str = "main") -> str:
        snapshot = self._repos[repo_id].resolve(revision)
        if snapshot is None:
            raise KeyError(revision)
        return snapshot.commit

    def file_etag(self, repo_id: str, filename: str, revision: str = "main") -> str:
        """The etag the client will name the cached blob after (sha256 for LFS files, git sha1 otherwise)."""
        snapshot = self._repos[repo_id].resolve(revision)
        assert snapshot is not None
        return snapshot.files[filename].etag

    def is_lfs(self, repo_id: str, filename: str, revision: str = "main") -> bool:
        snapshot = self._repos[repo_id].resolve(revision)
        assert snapshot is not None
        return snapshot.files[filename].lfs

    def _is_lfs(self, rel: str, size: int) -> bool:
        name = rel.rsplit("/", 1)[-1]
        return size >= LFS_SIZE_THRESHOLD or any(
            fnmatch.fnmatch(name, pat) or fnmatch.fnmatch(rel, pat) for pat in self.lfs_patterns
        )

    def _split_repo(self, parts: list[str]) -> tuple[str | None, list[str]]:
        if len(parts) >= 2 and "/".join(parts[:2]) in self._repos:
            return "/".join(parts[:2]), parts[2:]
        if parts and parts[0] in self._repos:
            return parts[0], parts[1:]
        if len(parts) >= 2 and parts[1] not in ("revision", "tree", "paths-info", "refs", "resolve"):
            return "/".join(parts[:2]), parts[2:]
        return (parts[0] if parts else None), parts[1:]

    def _find_blob(self, sha256: str, filename: str) -> tuple[str, _File] | None:
        """The file with this content (the one at `filename` first: identical files share a CDN blob)."""
        found = None
        with self._lock:
            for repo in self._repos.values():
                for snapshot in repo.snapshots.values():
                    for f in snapshot.files.values():
                        if f.sha256 == sha256:
                            if f.path == filename:
                                return repo.repo_id, f
                            found = found or (repo.repo_id, f)
        return found

    # ------------------------------------------------------------------ fault injection
    def fail_next(
        self,
        filename: str,
        after_bytes: int = 0,
        times: int = 1,
        *,
        repo_id: str | None = None,
        mode: str = "close",
    ) -> None:
        """Make the next `times` GETs serving `filename`'s content send `after_bytes` body bytes, then drop.

        Counts only responses that carry the file's bytes (200/206, on the hub or the CDN origin), not 302s or
        HEADs; `after_bytes` counts bytes of each response's own body (a ranged retry gets `after_bytes` more).
        ``mode="close"`` shuts the socket down (FIN: the client sees a truncated body, an httpx
        ``RemoteProtocolError``); ``mode="reset"`` sends a TCP RST (an httpx ``ReadError``). Calls queue up:
        ``fail_next(f, 100); fail_next(f, 0, times=5)`` drops the first GET after 100 bytes and the next five at once.
        """
        if mode not in ("close", "reset"):
            raise ValueError(mode)
        with self._lock:
            self._faults.append(
                _Fault("fail", filename, repo_id, ("GET",), times, after_bytes=after_bytes, mode=mode)
            )

    def delay(
        self,
        filename: str,
        seconds: float,
        *,
        times: int | None = None,
        methods: Iterable[str] = ("GET",),
        after_bytes: int = 0,
        repo_id: str | None = None,
    ) -> None:
        """Stall requests for `filename` by `seconds` (`times` requests, or all of them when None).

        With ``after_bytes=0`` the whole response (headers included) is held back, for any matching request
        (HEAD/GET, hub or CDN origin, 302s included). With ``after_bytes=N > 0`` only GETs that carry the file's
        bytes are affected: headers and N body bytes are sent, then the body stalls (a read timeout mid-download).
        Stalls end early when the hub stops.
        """
        with self._lock:
            self._faults.append(
                _Fault(
                    "delay",
                    filename,
                    repo_id,
                    tuple(m.upper() for m in methods),
                    times,
                    after_bytes=after_bytes,
                    seconds=seconds,
                )
            )

    def delay_api(self, seconds: float, *, times: int | None = None, repo_id: str | None = None) -> None:
        """Hold back answers of ``/api/...`` routes (model_info, tree listing, ...) by `seconds`."""
        with self._lock:
            self._faults.append(
                _Fault("delay_api", None, repo_id, ("GET", "HEAD", "POST"), times, seconds=seconds)
            )

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _take_fault(
        self,
        kind: str,
        method: str,
        repo_id: str | None,
        filename: str | None,
        *,
        mid_body: bool | None = None,
    ) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.kind != kind or method not in fault.methods:
                    continue
                if fault.filename is not None and fault.filename != filename:
                    continue
                if fault.repo_id is not None and fault.repo_id != repo_id:
                    continue
                if kind == "delay" and mid_body is not None and (fault.after_bytes > 0) != mid_body:
                    continue
                if fault.remaining is not None:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self._faults.remove(fault)
                return fault
        return None

    def _apply_delay(
        self, handler: _Handler, method: str, repo_id: str | None, filename: str | None, *, api: bool
    ) -> None:
        if api:
            fault = self._take_fault("delay_api", method, repo_id, None)
        else:
            fault = self._take_fault("delay", method, repo_id, filename, mid_body=False)
        if fault is not None:
            handler.rec.fault = "delayed"
            self._sleep(fault.seconds)

    def _sleep(self, seconds: float) -> None:
        self._stopping.wait(seconds)

    # ------------------------------------------------------------------ request log
    @property
    def requests(self) -> list[RequestTuple]:
        """``[(method, path, range_header), ...]`` for every request received so far (both origins)."""
        with self._lock:
            return [RequestTuple(r.method, r.path, r.range) for r in self.log]

    def requests_for(
        self, filename: str, method: str | None = "GET", *, content_only: bool = True
    ) -> list[LoggedRequest]:
        """Logged requests for `filename` (any repo). With `content_only`, only answers carrying its bytes (200/206)."""
        with self._lock:
            return [
                r
                for r in self.log
                if r.filename == filename
                and (method is None or r.method == method)
                and (not content_only or r.status in (200, 206))
            ]

    def downloaded_files(self) -> set[str]:
        """Filenames whose content was sent by at least one GET (200/206)."""
        with self._lock:
            return {
                r.filename for r in self.log if r.method == "GET" and r.status in (200, 206) and r.filename
            }

    def clear_log(self) -> None:
        with self._lock:
            self.log.clear()

    def _record(self, rec: LoggedRequest) -> None:
        with self._lock:
            self.log.append(rec)

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)


def configure_hf_client(
    monkeypatch: Any, hub: FakeHub | str, hf_home: str | os.PathLike[str]
) -> dict[str, Any]:
    """Point ``huggingface_hub`` at `hub` (a started FakeHub, or any endpoint URL), with an isolated HF_HOME.

    Everything goes through `monkeypatch` (a pytest ``MonkeyPatch``), so it is undone after the test.

    ``huggingface_hub`` reads most environment variables once, at import time, into ``huggingface_hub.constants``;
    setting the env vars alone only helps code that imports huggingface_hub later (or a subprocess). So this sets
    both the environment and the import-time copies:

    env vars: HF_ENDPOINT, HF_HOME, HF_HUB_CACHE, HF_ASSETS_CACHE, HF_XET_CACHE, HF_TOKEN_PATH, HF_HUB_OFFLINE=0,
        HF_HUB_DISABLE_TELEMETRY=1, HF_HUB_DISABLE_XET=1, HF_HUB_DISABLE_IMPLICIT_TOKEN=1,
        HF_HUB_DISABLE_UPDATE_CHECK=1; removed: HF_TOKEN, HUGGING_FACE_HUB_TOKEN, HF_OIDC_RESOURCE,
        TRANSFORMERS_OFFLINE, HUGGINGFACE_CO_STAGING, HF_HUB_ETAG_TIMEOUT, HF_HUB_DOWNLOAD_TIMEOUT,
        HUGGINGFACE_HUB_CACHE, HUGGINGFACE_ASSETS_CACHE.
    constants (each only if the installed version has it): ENDPOINT, HUGGINGFACE_CO_URL_TEMPLATE (hf_hub_url builds
        every /resolve URL from it), HF_URL_HOSTS, HF_HUB_OFFLINE, HF_HUB_DISABLE_TELEMETRY, HF_HUB_DISABLE_XET,
        HF_HUB_DISABLE_IMPLICIT_TOKEN, HF_HUB_DISABLE_UPDATE_CHECK, HF_HOME, HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE,
        HF_ASSETS_CACHE, HUGGINGFACE_ASSETS_CACHE, HF_XET_CACHE, HF_TOKEN_PATH, HF_STORED_TOKENS_PATH,
        CHECK_FOR_UPDATE_DONE_PATH, CHECK_FOR_SKILL_UPDATE_DONE_PATH, AGENT_HARNESSES_PATH, and HF_HUB_ETAG_TIMEOUT /
        HF_HUB_DOWNLOAD_TIMEOUT reset to their defaults (tests lower them with ``monkeypatch.setattr``).
        Module-level copies of those constants in other ``huggingface_hub.*`` modules (older versions have some,
        e.g. ``file_download.HUGGINGFACE_CO_URL_TEMPLATE`` in 0.x) are patched the same way.
    others: ``huggingface_hub.hf_api.api.endpoint`` (the module-level HfApi behind ``huggingface_hub.model_info``,
        ``get_safetensors_metadata``, ... captured the endpoint when it was built), and
        ``huggingface_hub.utils._http._HUB_ORIGINS`` (import-time set of origins whose redirects are followed).
        The shared HTTP client is closed so that no pooled connection outlives a test's server.

    Returns the values patched into ``constants``.
    """
    import huggingface_hub
    from huggingface_hub import constants

    home = Path(hf_home)
    if isinstance(hub, FakeHub):
        hub.hf_home = home
        endpoint = hub.endpoint
    else:
        endpoint = hub.rstrip("/")
    hub_cache = home / "hub"
    env = {
        "HF_ENDPOINT": endpoint,
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(hub_cache),
        "HF_ASSETS_CACHE": str(home / "assets"),
        "HF_XET_CACHE": str(home / "xet"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",
        "HF_HUB_DISABLE_UPDATE_CHECK": "1",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for key in (
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_OIDC_RESOURCE",
        "TRANSFORMERS_OFFLINE",
        "HUGGINGFACE_CO_STAGING",
        "HF_HUB_ETAG_TIMEOUT",
        "HF_HUB_DOWNLOAD_TIMEOUT",
        "HUGGINGFACE_HUB_CACHE",
        "HUGGINGFACE_ASSETS_CACHE",
    ):
        monkeypatch.delenv(key, raising=False)

    host = urlsplit(endpoint).hostname or "127.0.0.1"
    values: dict[str, Any] = {
        "ENDPOINT": endpoint,
        "HUGGINGFACE_CO_URL_TEMPLATE": endpoint + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_URL_HOSTS": frozenset(getattr(constants, "HF_URL_HOSTS", frozenset()) | {host}),
        "HF_HUB_OFFLINE": False,
        "HF_HUB_DISABLE_TELEMETRY": True,
        "HF_HUB_DISABLE_XET": True,
        "HF_HUB_DISABLE_IMPLICIT_TOKEN": True,
        "HF_HUB_DISABLE_UPDATE_CHECK": True,
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(hub_cache),
        "HUGGINGFACE_HUB_CACHE": str(hub_cache),
        "HF_ASSETS_CACHE": str(home / "assets"),
        "HUGGINGFACE_ASSETS_CACHE": str(home / "assets"),
        "HF_XET_CACHE": str(home / "xet"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
        "CHECK_FOR_UPDATE_DONE_PATH": str(home / ".check_for_update_done"),
        "CHECK_FOR_SKILL_UPDATE_DONE_PATH": str(home / ".check_for_skill_update_done"),
        "AGENT_HARNESSES_PATH": str(home / ".agent_harnesses.json"),
        "HF_HUB_ETAG_TIMEOUT": getattr(constants, "DEFAULT_ETAG_TIMEOUT", 10),
        "HF_HUB_DOWNLOAD_TIMEOUT": getattr(constants, "DEFAULT_DOWNLOAD_TIMEOUT", 10),
    }
    patched = {}
    originals = {name: getattr(constants, name) for name in values if hasattr(constants, name)}
    for name in originals:
        monkeypatch.setattr(constants, name, values[name])
        patched[name] = values[name]
    # Older versions also copy some constants into other modules (``from .constants import ...``, e.g.
    # file_download.HUGGINGFACE_CO_URL_TEMPLATE in 0.x): patch such copies too.
    for module_name, module in list(sys.modules.items()):
        if module is None or module is constants or not module_name.startswith("huggingface_hub."):
            continue
        for name, original in originals.items():
            current = getattr(module, name, _MISSING)
            if (
                current is not _MISSING
                and isinstance(current, (str, bool, int, float, frozenset))
                and current == original
            ):
                monkeypatch.setattr(module, name, values[name])

    hf_api = getattr(huggingface_hub, "hf_api", None)
    if hf_api is not None and hasattr(getattr(hf_api, "api", None), "endpoint"):
        monkeypatch.setattr(hf_api.api, "endpoint", endpoint)
    try:
        from huggingface_hub.utils import _http
    except ImportError:  # pragma: no cover - very old versions
        _http = None
    if _http is not None and hasattr(_http, "_HUB_ORIGINS") and hasattr(_http, "_url_origin"):
        monkeypatch.setattr(
            _http, "_HUB_ORIGINS", frozenset(_http._HUB_ORIGINS | {_http._url_origin(endpoint)})
        )
    _close_client_session()
    return patched


def _close_client_session() -> None:
    """Drop huggingface_hub's shared HTTP client (and its pooled keep-alive connections)."""
    try:
        from huggingface_hub.utils import close_session
    except ImportError:  # pragma: no cover - older versions
        try:
            from huggingface_hub.utils import reset_sessions as close_session  # type: ignore[no-redef]
        except ImportError:
            return
    close_session()


class _NoSleepTime:
    """Stands in for the `time` module inside huggingface_hub: everything but `sleep` is the real thing."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        pass


def skip_client_backoff(monkeypatch: Any) -> list[str]:
    """Make huggingface_hub's retry back-off sleeps (1 s before each resume in ``http_get``, 1-8 s in
    ``http_backoff``) instant, so tests of retries stay fast. Nothing else changes: the client makes the same
    requests, in the same order. Patches the ``time`` name of the modules that sleep; returns those patched
    (an empty list if a future version sleeps elsewhere: the tests are then only slower)."""
    import importlib

    patched = []
    for name in ("huggingface_hub.file_download", "huggingface_hub.utils._http"):
        try:
            module = importlib.import_module(name)
        except ImportError:  # pragma: no cover
            continue
        if getattr(module, "time", None) is time:
            monkeypatch.setattr(module, "time", _NoSleepTime())
            patched.append(name)
    return patched


def wait_until(predicate: Any, timeout: float = 5.0, interval: float = 0.01) -> bool:
    """Poll `predicate` until it is true or `timeout` elapses (handy for checking the log of a server thread)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
