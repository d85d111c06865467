"""Ollama's model library, read as ``ollama pull`` reads it: the registry's OCI distribution API
(ollama/ollama server/images.go, types/model/name.go). A tag's manifest is
``GET {registry}/v2/{namespace}/{model}/manifests/{tag}`` (``Accept:
application/vnd.docker.distribution.manifest.v2+json``); its layers are blobs at
``/v2/{namespace}/{model}/blobs/{digest}``, which the registry redirects to storage that takes
range requests. The GGUF is the ``application/vnd.ollama.image.model`` layer and a vision model's
projector the ``application/vnd.ollama.image.projector`` one (``app.core.model.remote`` reads them).

The registry is ``https://registry.ollama.ai`` unless ``FITSCOPE_OLLAMA_REGISTRY`` names another
(a mirror; the tests' loopback server). No client library speaks this API, so the requests are
``app.adapters.remote_gguf``'s, over a plain ``httpx2`` client (the same library the Hub's client
uses): bounded redirects, timeouts, a manifest of at most ``HttpLimits.max_document_bytes``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import httpx2

from app.adapters.remote_gguf import (
    DEFAULT_LIMITS,
    HttpLimits,
    RangeSource,
    RemoteError,
    Transfer,
    host_of,
    request,
    status_sentence,
)
from app.core.common.errors import FitScopeError
from app.core.model.remote import OLLAMA_MANIFEST_ACCEPT, RemoteListing, ollama_listing

DEFAULT_REGISTRY = "https://registry.ollama.ai"
REGISTRY_ENV = "FITSCOPE_OLLAMA_REGISTRY"


def registry_url() -> str:
    return (os.environ.get(REGISTRY_ENV) or DEFAULT_REGISTRY).rstrip("/")


def registry_host() -> str:
    return host_of(registry_url())


def ollama_client() -> httpx2.Client:
    """A client for one fetch (close it after): proxies from the environment, no redirects of its own."""
    return httpx2.Client(follow_redirects=False, trust_env=True, headers={"User-Agent": "fitscope"})


def display_path(name: str, tag: str, role: str = "model") -> Path:
    """How a layer is named in messages and as the model's path: host/NAMESPACE/MODEL:TAG."""
    return Path(f"{registry_host()}/{name}:{tag}" + ("" if role == "model" else f" ({role})"))


def fetch_listing(
    client: httpx2.Client,
    name: str,
    tag: str,
    limits: HttpLimits = DEFAULT_LIMITS,
    cancelled: Callable[[], bool] | None = None,
    transfer: Transfer | None = None,
) -> RemoteListing:
    """The model layer (and projector) of ``name:tag``. Raises RemoteError (UnreachableError when no
    server answered) or FitScopeError for a manifest without a GGUF model."""
    url = f"{registry_url()}/v2/{name}/manifests/{tag}"
    answer = request(
        client,
        url,
        {"Accept": OLLAMA_MANIFEST_ACCEPT},
        limits,
        max_body=limits.max_document_bytes,
        cancelled=cancelled,
        transfer=transfer,
    )
    host, shown = registry_host(), f"{name.removeprefix('library/')}:{tag}"
    if answer.status == 404:
        raise RemoteError(
            f"Ollama's library on {host} has no {shown}; check the name and tag (as `ollama pull` takes them)."
        )
    if answer.status != 200:
        raise RemoteError(status_sentence(answer.status, f"the manifest of {shown}", host))
    if len(answer.body) > limits.max_document_bytes:
        raise RemoteError(
            f"{host} sent a manifest for {shown} larger than {limits.max_document_bytes:,} bytes; refused."
        )
    try:
        manifest = json.loads(answer.body)
    except ValueError:
        raise RemoteError(f"{host} sent a manifest for {shown} that is not JSON.") from None
    try:
        return ollama_listing(name, tag, host, manifest)
    except FitScopeError as exc:
        raise RemoteError(str(exc)) from None


def blob_source(name: str, digest: str, shown: str, expected_size: int | None = None) -> RangeSource:
    return RangeSource(
        url=f"{registry_url()}/v2/{name}/blobs/{digest}",
        shown=shown,
        expected_size=expected_size,
        hint="The registry asks for a login; FitScope reads public models only.",
    )
