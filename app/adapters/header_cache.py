"""Remote GGUF headers kept on disk, so a second estimate of the same file is offline and instant,
and ``fitscope models --remote`` can list what was looked at.

One file per header under ``cache_dir()/gguf-headers``, named by a hash of its key (source,
repository, revision, file): a first line naming the format, one line of JSON (the key, the file's
real size, what it holds: label, architecture, quantization, when it was fetched), then the header's
bytes exactly as the server sent them. A revision is a Hub commit or an Ollama blob digest, so an
entry never goes stale. Listings (a repository's files at its newest commit, an Ollama tag's
manifest) are kept beside them for when the network is not there.

The folder is bounded (``max_bytes``, the least recently used entries go first). Entries are
written to a temporary file and renamed, so two processes (the window and its estimate worker)
never see half of one. A corrupt entry is moved aside (``*.corrupt``) and fetched again: never fatal.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.adapters.paths import cache_dir

_log = logging.getLogger(__name__)

MAGIC = b"FitScope GGUF header cache 1\n"
SUFFIX, LISTING_SUFFIX, CORRUPT_SUFFIX = ".ghdr", ".json", ".corrupt"
DEFAULT_MAX_BYTES = 512 * 1024 * 1024  # about 80 headers of 262k-token vocabularies
MAX_META_BYTES = 64 * 1024


@dataclass(frozen=True)
class CacheKey:
    source: str  # "hf" or "ollama"
    repo: str
    revision: str
    file: str

    def digest(self) -> str:
        text = "\n".join((self.source, self.repo, self.revision, self.file))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:40]


@dataclass(frozen=True)
class CachedHeader:
    key: CacheKey
    file_size_bytes: int
    header: bytes
    meta: dict[str, Any]


@dataclass(frozen=True)
class CacheEntry:
    """What ``fitscope models --remote`` shows of one entry."""

    key: CacheKey
    file_size_bytes: int
    header_bytes: int
    label: str
    arch: str
    quant: str
    fetched_at: float


class HeaderCache:
    def __init__(self, root: Path | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.root = root if root is not None else cache_dir() / "gguf-headers"
        self.max_bytes = max_bytes

    def _path(self, key: CacheKey) -> Path:
        return self.root / (key.digest() + SUFFIX)

    # -- headers ----------------------------------------------------------------------------------

    def get(self, key: CacheKey) -> CachedHeader | None:
        """The entry for ``key``, or None (absent, unreadable, or corrupt: then moved aside)."""
        path = self._path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            _log.warning("header cache: cannot read %s: %s", path, exc)
            return None
        try:
            entry = _decode(data)
        except ValueError as exc:
            self._move_aside(path, str(exc))
            return None
        if entry.key != key:
            self._move_aside(path, "it holds another file's header")
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: evicted last
        return entry

    def put(self, key: CacheKey, header: bytes, file_size_bytes: int, **meta: Any) -> None:
        """Keep ``header`` (the bytes the header was read from). A disk that refuses is logged, not raised."""
        record = {
            "source": key.source,
            "repo": key.repo,
            "revision": key.revision,
            "file": key.file,
            "file_size_bytes": file_size_bytes,
            "header_bytes": len(header),
            "fetched_at": time.time(),
            **meta,
        }
        line = json.dumps(record, separators=(",", ":")).encode("utf-8") + b"\n"
        if _write_atomically(self._path(key), MAGIC + line + header):
            self._trim(keep=self._path(key))

    def discard(self, key: CacheKey, reason: str) -> None:
        """Move ``key``'s entry aside (its bytes did not parse)."""
        path = self._path(key)
        if path.exists():
            self._move_aside(path, reason)

    def entries(self) -> list[CacheEntry]:
        """Every readable entry, most recently fetched first (corrupt ones are moved aside)."""
        out = []
        for path in sorted(self.root.glob("*" + SUFFIX)) if self.root.is_dir() else []:
            try:
                with path.open("rb") as f:
                    head = f.read(len(MAGIC) + MAX_META_BYTES)
                meta = _meta(head)
            except (OSError, ValueError) as exc:
                self._move_aside(path, str(exc))
                continue
            out.append(
                CacheEntry(
                    key=CacheKey(meta["source"], meta["repo"], meta["revision"], meta["file"]),
                    file_size_bytes=int(meta["file_size_bytes"]),
                    header_bytes=int(meta["header_bytes"]),
                    label=str(meta.get("label", "")),
                    arch=str(meta.get("arch", "")),
                    quant=str(meta.get("quant", "")),
                    fetched_at=float(meta.get("fetched_at", 0.0)),
                )
            )
        out.sort(key=lambda e: e.fetched_at, reverse=True)
        return out

    # -- listings ---------------------------------------------------------------------------------

    def _listing_path(self, source: str, ref: str) -> Path:
        name = hashlib.sha256(f"{source}\n{ref}".encode()).hexdigest()[:40]
        return self.root / "listings" / (name + LISTING_SUFFIX)

    def get_listing(self, source: str, ref: str) -> dict[str, Any] | None:
        """The listing last fetched for ``ref`` (a repository at a revision, an Ollama tag), or None."""
        path = self._listing_path(source, ref)
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            self._move_aside(path, str(exc))
            return None
        if not isinstance(value, dict):
            self._move_aside(path, "it is not a JSON object")
            return None
        return value

    def put_listing(self, source: str, ref: str, listing: dict[str, Any]) -> None:
        _write_atomically(self._listing_path(source, ref), json.dumps(listing).encode("utf-8"))

    # -- inside -----------------------------------------------------------------------------------

    def _move_aside(self, path: Path, reason: str) -> None:
        _log.warning("header cache: %s is corrupt (%s); moved aside, it will be fetched again", path.name, reason)
        try:
            os.replace(path, path.with_name(path.name + CORRUPT_SUFFIX))
        except OSError:
            with contextlib.suppress(OSError):
                path.unlink()

    def _trim(self, keep: Path) -> None:
        """Remove the least recently used entries (corrupt ones first) while over ``max_bytes``."""
        try:
            files = [(p, p.stat()) for p in self.root.iterdir() if p.is_file()]
        except OSError:
            return
        total = sum(st.st_size for _, st in files)
        order = sorted(files, key=lambda f: (not f[0].name.endswith(CORRUPT_SUFFIX), f[1].st_mtime))
        for path, st in order:
            if total <= self.max_bytes:
                break
            if path == keep:
                continue
            with contextlib.suppress(OSError):
                path.unlink()
                total -= st.st_size


def _meta(data: bytes) -> dict[str, Any]:
    if not data.startswith(MAGIC):
        raise ValueError("it does not start with the cache's format line")
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        raise ValueError("its description line is cut")
    try:
        meta = json.loads(data[len(MAGIC) : end])
    except ValueError as exc:
        raise ValueError(f"its description is not JSON ({exc})") from None
    needed = ("source", "repo", "revision", "file", "file_size_bytes", "header_bytes")
    if not isinstance(meta, dict) or any(k not in meta for k in needed):
        raise ValueError("its description lacks a field")
    if not isinstance(meta["header_bytes"], int) or not isinstance(meta["file_size_bytes"], int):
        raise ValueError("its sizes are not whole numbers")
    return meta


def _decode(data: bytes) -> CachedHeader:
    meta = _meta(data)
    start = data.index(b"\n", len(MAGIC)) + 1
    header = data[start:]
    if len(header) != meta["header_bytes"]:
        raise ValueError(f"it holds {len(header):,} header bytes, not {meta['header_bytes']:,}")
    key = CacheKey(str(meta["source"]), str(meta["repo"]), str(meta["revision"]), str(meta["file"]))
    return CachedHeader(key=key, file_size_bytes=meta["file_size_bytes"], header=header, meta=meta)


def _write_atomically(path: Path, data: bytes) -> bool:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".tmp-", delete=False) as f:
            f.write(data)
            tmp = Path(f.name)
        os.replace(tmp, path)
        return True
    except OSError as exc:
        _log.warning("header cache: cannot write %s: %s", path, exc)
        with contextlib.suppress(OSError, UnboundLocalError):
            tmp.unlink()
        return False
