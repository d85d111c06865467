"""A real HTTP server on 127.0.0.1, in a thread, that speaks the Hugging Face Hub's and Ollama's
registry's APIs over files the tests wrote, with range requests, and counts what it sends.

- Hub: ``GET /api/models/ORG/REPO[/revision/REV]`` (``?blobs=true``) answers the listing
  ``HfApi.model_info(files_metadata=True)`` reads: the commit and every file with its size (LFS
  files with their sha256); ``GET /ORG/REPO/resolve/REV/PATH`` redirects (302, as the Hub does to
  its CDN) to ``/cdn/...`` on another host name (``localhost``), which serves the bytes. A
  missing repository answers 404 with ``X-Error-Code: RepoNotFound``; a gated one 401 with
  ``X-Error-Code: GatedRepo`` unless the request carries the right token.
- Ollama: ``GET /v2/NS/MODEL/manifests/TAG`` answers the manifest (the model layer, and a
  projector layer when given); ``GET /v2/NS/MODEL/blobs/DIGEST`` redirects (307, as the registry
  does to its storage) to ``/storage/DIGEST``.
- Misbehaviour for the failure tests (``FakeRemote.mode``): ``ignore-range`` (200 and the whole
  file), ``oversend`` (206 claiming the asked range, with more bytes), ``redirect-loop``, ``hang``
  (no answer for ``hang_s``), ``status`` (every file request answers ``status_code``).

Every body byte written is counted (``sent_bytes``, ``file_bytes`` for file bodies alone) and
every request kept (``requests``: method, path, headers with lower-case names).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

CHUNK = 256 * 1024


@dataclass
class HubRepo:
    files: dict[str, Path]  # repository path -> local file
    sha: str = "0123456789abcdef0123456789abcdef01234567"
    gated_token: str | None = None  # a token that may read it; None: public


@dataclass
class OllamaModel:
    model: Path
    projector: Path | None = None
    extra_layers: list[dict] = field(default_factory=list)
    with_model_layer: bool = True


def digest_of(path: Path) -> str:
    """A blob digest for a file (of its name and size: the tests' files are sparse and large)."""
    return "sha256:" + hashlib.sha256(f"{path.name}:{path.stat().st_size}".encode()).hexdigest()


class FakeRemote:
    """Start with ``with FakeRemote() as server``; ``server.url`` is the Hub endpoint and the
    Ollama registry (both on one port)."""

    def __init__(self) -> None:
        self.hub: dict[str, HubRepo] = {}
        self.ollama: dict[str, OllamaModel] = {}  # "NS/MODEL:TAG"
        self.mode = ""
        self.status_code = 500
        self.hang_s = 5.0
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.sent_bytes = 0
        self.file_bytes = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FakeRemote:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def reset_counts(self) -> None:
        with self._lock:
            self.requests.clear()
            self.sent_bytes = self.file_bytes = 0

    def count(self, n: int, file_body: bool) -> None:
        with self._lock:
            self.sent_bytes += n
            if file_body:
                self.file_bytes += n

    def blobs(self) -> dict[str, Path]:
        out = {}
        for m in self.ollama.values():
            out[digest_of(m.model)] = m.model
            if m.projector is not None:
                out[digest_of(m.projector)] = m.projector
        return out


def _handler(server: FakeRemote) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        # -- answers ----------------------------------------------------------------------
        def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            server.count(len(body), False)

        def _json(self, value: object, status: int = 200, headers: dict[str, str] | None = None) -> None:
            self._send(status, json.dumps(value).encode(), {"Content-Type": "application/json", **(headers or {})})

        def _redirect(self, status: int, location: str) -> None:
            self._send(status, b"", {"Location": location})

        def _file(self, path: Path) -> None:
            if server.mode == "hang":
                time.sleep(server.hang_s)
            if server.mode == "status":
                self._send(server.status_code, b"error")
                return
            size = path.stat().st_size
            wanted = self.headers.get("Range", "")
            start, end = 0, size - 1
            ranged = wanted.startswith("bytes=") and server.mode != "ignore-range"
            if ranged:
                first, _, last = wanted[6:].partition("-")
                start, end = int(first), min(int(last) if last else size - 1, size - 1)
                if start >= size:
                    self._send(416, b"", {"Content-Range": f"bytes */{size}"})
                    return
            length = end - start + 1
            claimed = length
            if server.mode == "oversend":
                end, length = min(size - 1, end + 4096), min(size - 1, end + 4096) - start + 1
            self.send_response(206 if ranged else 200)
            if ranged:
                self.send_header("Content-Range", f"bytes {start}-{start + claimed - 1}/{size}")
            self.send_header("Content-Length", str(length))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            try:
                with path.open("rb") as f:
                    f.seek(start)
                    left = length
                    while left > 0:
                        block = f.read(min(CHUNK, left))
                        if not block:
                            break
                        self.wfile.write(block)
                        server.count(len(block), True)
                        left -= len(block)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        # -- routes -----------------------------------------------------------------------
        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            path = unquote(parts.path)
            server.requests.append(("GET", path, {k.lower(): v for k, v in self.headers.items()}))
            if server.mode == "redirect-loop" and not path.startswith("/api/"):
                self._redirect(302, path)
                return
            if path.startswith("/api/models/"):
                return self._hub_listing(path[len("/api/models/") :])
            if path.startswith("/v2/"):
                return self._ollama(path[len("/v2/") :])
            if path.startswith("/cdn/"):
                _, repo_a, repo_b, file = path.split("/", 4)[1:]
                return self._file(server.hub[f"{repo_a}/{repo_b}"].files[file])
            if path.startswith("/storage/"):
                blob = server.blobs().get(path[len("/storage/") :])
                return self._file(blob) if blob else self._send(404)
            pieces = path.strip("/").split("/", 4)
            if len(pieces) == 5 and pieces[2] == "resolve":
                repo = server.hub.get(f"{pieces[0]}/{pieces[1]}")
                if repo is None or pieces[4] not in repo.files:
                    return self._send(404, b"Entry not found", {"X-Error-Code": "EntryNotFound"})
                if not self._allowed(repo):
                    return self._send(401, b"gated", {"X-Error-Code": "GatedRepo"})
                # The Hub sends file bytes from another host: a token must not follow.
                return self._redirect(302, f"http://localhost:{server.port}/cdn/{pieces[0]}/{pieces[1]}/{pieces[4]}")
            self._send(404)

        def _allowed(self, repo: HubRepo) -> bool:
            return repo.gated_token is None or self.headers.get("Authorization") == f"Bearer {repo.gated_token}"

        def _hub_listing(self, rest: str) -> None:
            pieces = rest.split("/")
            repo_id = "/".join(pieces[:2])
            repo = server.hub.get(repo_id)
            if repo is None:
                return self._json({"error": "Repository not found"}, 401, {"X-Error-Code": "RepoNotFound"})
            if not self._allowed(repo):
                return self._json({"error": "gated"}, 403, {"X-Error-Code": "GatedRepo"})
            siblings = []
            for name, local in sorted(repo.files.items()):
                size = local.stat().st_size
                lfs = {"sha256": hashlib.sha256(name.encode()).hexdigest(), "size": size, "pointerSize": 134}
                siblings.append({"rfilename": name, "size": size, "blobId": "0" * 40, "lfs": lfs})
            siblings.append({"rfilename": "README.md", "size": 1234, "blobId": "1" * 40})
            self._json({"_id": "x", "id": repo_id, "modelId": repo_id, "sha": repo.sha, "siblings": siblings})

        def _ollama(self, rest: str) -> None:
            if "/manifests/" in rest:
                name, tag = rest.split("/manifests/")
                model = server.ollama.get(f"{name}:{tag}")
                if model is None:
                    return self._json({"errors": [{"code": "MANIFEST_UNKNOWN"}]}, 404)
                layers = []
                if model.with_model_layer:
                    m = model.model
                    layers.append(
                        {
                            "mediaType": "application/vnd.ollama.image.model",
                            "digest": digest_of(m),
                            "size": m.stat().st_size,
                        }
                    )
                if model.projector is not None:
                    p = model.projector
                    layers.append(
                        {
                            "mediaType": "application/vnd.ollama.image.projector",
                            "digest": digest_of(p),
                            "size": p.stat().st_size,
                        }
                    )
                layers += model.extra_layers
                layers.append(
                    {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "a" * 64, "size": 10}
                )
                manifest = {
                    "schemaVersion": 2,
                    "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                    "config": {
                        "mediaType": "application/vnd.docker.container.image.v1+json",
                        "digest": "sha256:" + "b" * 64,
                        "size": 5,
                    },
                    "layers": layers,
                }
                return self._json(
                    manifest, headers={"Content-Type": "application/vnd.docker.distribution.manifest.v2+json"}
                )
            if "/blobs/" in rest:
                digest = rest.split("/blobs/")[1]
                if digest not in server.blobs():
                    return self._send(404)
                return self._redirect(307, f"http://localhost:{server.port}/storage/{digest}")
            self._send(404)

    return Handler
