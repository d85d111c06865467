"""GGUF models on the Hugging Face Hub and in Ollama's library, estimated from their headers: the one
service the CLI (``fitscope estimate --hf / --ollama``, ``fitscope models --remote``) and the
window ("Open from Hugging Face…", "Open from Ollama…", and its estimate worker) call.

- :func:`list_remote`: a repository's GGUF files (or an Ollama tag's model and projector), pinned to
  a revision; when no server answers, the listing remembered from the last look, said so.
- :func:`load_remote_model`: the seam ``app.core.report.choices.load_model`` takes: a remote
  :class:`ModelChoice` to a :class:`ModelSource`, reading each part's header from the cache or,
  once, over the network (``app.adapters.remote_gguf``), and summing a split model's parts.
- :func:`load_remote_projector`: a projector file's header, as a :class:`ProjectorSpec`.

Nothing here holds state between calls but the on-disk cache (``app.adapters.header_cache``), so
the functions are safe in the window's worker process and in a thread. Progress (``report``) and
cancellation (``cancelled``) come in through :class:`Fetch`, the shape the window's ``JobRunner``
hands a job.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.adapters import hf_hub, ollama_registry
from app.adapters.header_cache import CacheKey, HeaderCache
from app.adapters.remote_gguf import (
    DEFAULT_LIMITS,
    HttpLimits,
    RangeSource,
    Report,
    Transfer,
    UnreachableError,
    read_remote_header,
)
from app.core.common.errors import FitScopeError, ModelFileError
from app.core.model.gguf_model import model_from_header as gguf_model_from_header
from app.core.model.gguf_reader import GgufHeader, HeaderIncompleteError, header_from_buffer
from app.core.model.gguf_split import check_first_part, merge_split_headers, split_part_names
from app.core.model.projector import ProjectorSpec
from app.core.model.projector_file import projector_from_header
from app.core.model.quant import preset_for_ftype
from app.core.model.remote import (
    RemoteFile,
    RemoteListing,
    Source,
    choose_file,
    choose_projector,
    parse_hf_ref,
    parse_ollama_ref,
    quant_label,
)
from app.core.model.source import ModelSource, model_from_header
from app.core.report.choices import ModelChoice

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass
class Fetch:
    """How one fetch runs: its limits, the cache, progress and cancellation, and what it cost."""

    limits: HttpLimits = DEFAULT_LIMITS
    cache: HeaderCache = field(default_factory=HeaderCache)
    report: Report | None = None
    cancelled: Callable[[], bool] | None = None
    transfer: Transfer = field(default_factory=Transfer)
    from_cache: int = 0  # headers read from the cache

    def say(self, kind: str, payload: Any) -> None:
        if self.report is not None:
            self.report(kind, payload)


# -- listings ------------------------------------------------------------------------------------


def list_remote(source: Source, ref: str, fetch: Fetch | None = None, revision: str | None = None) -> RemoteListing:
    """The GGUF models and projectors ``ref`` offers: ``ORG/REPO`` (optionally ``/path/file.gguf``
    or a Hub address with a revision; ``revision`` overrides it) on the Hub, ``MODEL[:TAG]`` in
    Ollama's library. Raises FitScopeError with one sentence."""
    fetch = fetch or Fetch()
    if source == "hf":
        repo, _path, named = parse_hf_ref(ref)
        return _listing_at(repo, revision or named, fetch)
    name, tag = parse_ollama_ref(ref)
    fetch.say("status", f"Reading the manifest of {name.removeprefix('library/')}:{tag}…")

    def manifest() -> RemoteListing:
        with ollama_registry.ollama_client() as client:
            return ollama_registry.fetch_listing(client, name, tag, fetch.limits, fetch.cancelled, fetch.transfer)

    return _remembered(fetch, source, f"{name}:{tag}", manifest)


def _remembered(fetch: Fetch, source: Source, key: str, look: Callable[[], RemoteListing]) -> RemoteListing:
    """``look()``, remembered; when no server answers, the remembered listing (with a note)."""
    try:
        listing = look()
    except UnreachableError as exc:
        kept = fetch.cache.get_listing(source, key)
        if kept is None:
            raise
        try:
            listing = RemoteListing.model_validate(kept)
        except ValueError:
            raise exc from None
        return listing.model_copy(update={"note": f"{exc} Showing the listing FitScope saw last time."})
    fetch.cache.put_listing(source, key, listing.model_dump(mode="json"))
    return listing


# -- headers -------------------------------------------------------------------------------------


def _header(fetch: Fetch, key: CacheKey, path: Path, source: Callable[[], RangeSource]) -> GgufHeader:
    """The header of one file: from the cache, else read over the network and kept."""
    cached = fetch.cache.get(key)
    if cached is not None:
        try:
            header = header_from_buffer(path, cached.header, len(cached.header), cached.file_size_bytes)
        except (ModelFileError, HeaderIncompleteError) as exc:
            fetch.cache.discard(key, str(exc))
        else:
            fetch.from_cache += 1
            fetch.say("cached", (key.file, len(cached.header)))
            return header
    target = source()
    fetch.say("status", f"Reading the header of {target.shown}…")
    if key.source == "hf":
        client = hf_hub.hub_client()
        header, raw = read_remote_header(
            client, target, path, fetch.limits, fetch.cancelled, fetch.report, fetch.transfer
        )
    else:
        with ollama_registry.ollama_client() as own:
            header, raw = read_remote_header(
                own, target, path, fetch.limits, fetch.cancelled, fetch.report, fetch.transfer
            )
    md = header.metadata
    ftype = md.get("general.file_type")
    preset = preset_for_ftype(ftype if isinstance(ftype, int) else None)
    fetch.cache.put(
        key,
        raw,
        header.file_size_bytes,
        label=str(md.get("general.name", "")),
        arch=str(md.get("general.architecture", "")),
        quant=quant_label(key.file) or (preset.name if preset else ""),
    )
    return header


def _split_headers(
    fetch: Fetch, parts: tuple[str, ...] | None, read: Callable[[str], GgufHeader], first: str
) -> GgufHeader:
    """A model's header: its one file's, or every part's merged (the parts from the listing, or,
    for a pinned choice, from the first part's split.count and llama.cpp's naming)."""
    header = read(first)
    count = check_first_part(header)
    if count == 1:
        return header
    names = parts if parts is not None and len(parts) == count else tuple(split_part_names(first, count))
    fetch.say("parts", count)
    return merge_split_headers([header, *(read(p) for p in names[1:])])


def _hf_choice_file(choice: ModelChoice, fetch: Fetch) -> tuple[str, str, str, RemoteFile | None]:
    """(repo, revision, file, its listing entry or None) for an ``hf`` choice; the listing is
    fetched only when the choice is not pinned to a commit and a file."""
    repo, path, rev = parse_hf_ref(choice.ref)
    revision = choice.revision or rev or ""
    if path is not None and _COMMIT.match(revision):
        return repo, revision, path, None
    listing = _listing_at(repo, revision or None, fetch)
    chosen = choose_file(listing, None if path else choice.quant, path)
    if chosen.missing_parts:
        raise FitScopeError(f"{repo} lacks part {chosen.missing_parts[0]} of {chosen.path}; the upload is incomplete.")
    return repo, listing.revision, chosen.path, chosen


def _listing_at(repo: str, revision: str | None, fetch: Fetch) -> RemoteListing:
    fetch.say("status", f"Listing {repo} on {hf_hub.hub_host()}…")
    key = f"{repo}@{revision or 'main'}"
    return _remembered(fetch, "hf", key, lambda: hf_hub.list_repo(repo, revision, fetch.limits))


def load_remote_model(choice: ModelChoice, fetch: Fetch | None = None) -> ModelSource:
    """The model a remote choice names (``hf`` or ``ollama``), from its header(s). Raises
    FitScopeError (RemoteError for the server, ModelFileError for the file, FetchCancelledError)."""
    fetch = fetch or Fetch()
    try:
        if choice.kind == "hf":
            repo, revision, path, entry = _hf_choice_file(choice, fetch)

            def read_hf(part: str) -> GgufHeader:
                return _header(
                    fetch,
                    CacheKey("hf", repo, revision, part),
                    hf_hub.display_path(repo, part),
                    lambda: hf_hub.file_source(repo, revision, part),
                )

            header = _split_headers(fetch, entry.parts if entry else None, read_hf, path)
        elif choice.kind == "ollama":
            name, tag = parse_ollama_ref(choice.ref)
            digest, size = choice.revision, None
            if not digest:
                listing = list_remote("ollama", choice.ref, fetch)
                digest, size = listing.models[0].digest, listing.models[0].size_bytes
            shown = f"{name.removeprefix('library/')}:{tag}"
            header = _header(
                fetch,
                CacheKey("ollama", name, digest, "model"),
                ollama_registry.display_path(name, tag),
                lambda: ollama_registry.blob_source(name, digest, shown, size),
            )
            if check_first_part(header) > 1:
                raise ModelFileError(
                    f"{shown} is a split GGUF, which Ollama's library does not hold; FitScope cannot read it."
                )
        else:
            raise FitScopeError(f"A {choice.kind} model is not on a server.")
        return model_from_header(gguf_model_from_header(header), None)
    except (FitScopeError, KeyboardInterrupt):
        raise
    except Exception as exc:  # anything unforeseen still reaches the user as one sentence
        raise ModelFileError(f"{choice.ref} could not be read as a GGUF model ({type(exc).__name__}: {exc}).") from exc


def load_remote_projector(listing: RemoteListing, projector: RemoteFile, fetch: Fetch | None = None) -> ProjectorSpec:
    """The vision projector ``projector`` of ``listing``, from its header. Raises FitScopeError."""
    fetch = fetch or Fetch()
    if listing.source == "hf":
        repo, revision, path = listing.repo, listing.revision, projector.path
        header = _header(
            fetch,
            CacheKey("hf", repo, revision, path),
            hf_hub.display_path(repo, path),
            lambda: hf_hub.file_source(repo, revision, path, projector.size_bytes),
        )
    else:
        name, tag = parse_ollama_ref(listing.repo)
        shown = f"{name.removeprefix('library/')}:{tag} (projector)"
        header = _header(
            fetch,
            CacheKey("ollama", name, projector.digest, "projector"),
            ollama_registry.display_path(name, tag, "projector"),
            lambda: ollama_registry.blob_source(name, projector.digest, shown, projector.size_bytes),
        )
    return projector_from_header(header)


def choice_for(listing: RemoteListing, file: RemoteFile) -> ModelChoice:
    """The window's (and the preferences') choice for ``file`` of ``listing``, pinned to its revision."""
    if listing.source == "hf":
        return ModelChoice(kind="hf", ref=f"{listing.repo}/{file.path}", revision=listing.revision)
    return ModelChoice(kind="ollama", ref=listing.repo, revision=file.digest)


def resolve_remote(
    source: Source,
    ref: str,
    quant: str | None = None,
    projector: bool = False,
    fetch: Fetch | None = None,
    revision: str | None = None,
) -> tuple[ModelSource, ProjectorSpec | None, RemoteFile]:
    """What ``fitscope estimate --hf/--ollama`` estimates: the model ``ref`` and ``quant`` name, its
    projector when asked for, and the file chosen. Raises FitScopeError."""
    fetch = fetch or Fetch()
    if source == "hf":
        repo, path, named = parse_hf_ref(ref)
        listing = _listing_at(repo, revision or named, fetch)
        chosen = choose_file(listing, None if path else quant, path)
        if chosen.missing_parts:
            raise FitScopeError(
                f"{repo} lacks part {chosen.missing_parts[0]} of {chosen.path}; the upload is incomplete."
            )
    else:
        listing = list_remote("ollama", ref, fetch)
        chosen = listing.models[0]
    model = load_remote_model(choice_for(listing, chosen), fetch)
    spec = None
    if projector:
        spec = load_remote_projector(listing, choose_projector(listing), fetch)
    return model, spec, chosen
