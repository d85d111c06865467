"""The Hugging Face Hub, through its own client library (``huggingface_hub``): a repository's files
with their sizes at its newest commit (``HfApi.model_info(files_metadata=True)``: one request gives
the commit and every file), and the address of a file at that commit for range reads
(``hf_hub_url``, read with the library's shared session, ``get_session()``).

The library brings the ecosystem's conventions: ``HF_ENDPOINT`` (a mirror, or the tests' loopback
server; read at each call here, so a change applies at once), ``HF_TOKEN`` and the saved login for
gated and private repositories (``build_hf_headers``), ``HF_HUB_OFFLINE``, proxies from the
environment. Range reads of one header over the library's session and over a bare client of the
same kind cost the same on loopback (``scripts/bench_remote.py``): the library adds nothing slow.
It is imported when first used (about 0.3 s), not when the window or the CLI starts.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2

from app.adapters.remote_gguf import (
    DEFAULT_LIMITS,
    HttpLimits,
    RangeSource,
    RemoteError,
    UnreachableError,
    host_of,
    network_errors,
    status_sentence,
)
from app.core.model.remote import RemoteListing, group_gguf_files

TOKEN_HINT = "It is gated or private: accept its terms on the Hub, then set HF_TOKEN to a token of that account."


def hub_endpoint() -> str:
    """The Hub's address: ``HF_ENDPOINT`` when set, else the library's default."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def hub_host() -> str:
    return host_of(hub_endpoint())


def hub_client() -> httpx2.Client:
    """The library's shared session (proxies, offline mode, its request ids)."""
    from huggingface_hub import get_session

    return get_session()


def display_path(repo_id: str, path: str) -> Path:
    """How a file on the Hub is named in messages and as the model's path: host/ORG/REPO/file."""
    return Path(f"{hub_host()}/{repo_id}/{path}")


@contextmanager
def _hub_errors(repo_id: str, revision: str | None, limits: HttpLimits) -> Iterator[None]:
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    host = hub_host()
    try:
        with network_errors(host, limits):
            yield
    except OfflineModeIsEnabled:
        raise UnreachableError(
            f"HF_HUB_OFFLINE is set, so FitScope does not contact {host} to look up {repo_id}."
        ) from None
    except GatedRepoError:
        raise RemoteError(
            f"{repo_id} on {host} is gated: accept its terms on its page, then set HF_TOKEN to a token of that account."
        ) from None
    except RevisionNotFoundError:
        raise RemoteError(f"{repo_id} on {host} has no revision '{revision}'.") from None
    except RepositoryNotFoundError:
        raise RemoteError(
            f"No model repository {repo_id} on {host} (or it is private: set HF_TOKEN to a token that can read it)."
        ) from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else 0
        raise RemoteError(status_sentence(status, repo_id, host, TOKEN_HINT)) from None
    except ValueError as exc:  # a listing that is not the Hub's JSON
        raise RemoteError(f"{host} sent a listing of {repo_id} that FitScope cannot read ({exc}).") from None


def list_repo(repo_id: str, revision: str | None = None, limits: HttpLimits = DEFAULT_LIMITS) -> RemoteListing:
    """The GGUF models and projectors of ``repo_id`` at ``revision`` (default: its main branch),
    pinned to the commit the Hub names. Raises RemoteError (UnreachableError when no server answered)."""
    from huggingface_hub import HfApi

    with _hub_errors(repo_id, revision, limits):
        info = HfApi(endpoint=hub_endpoint()).model_info(
            repo_id, revision=revision, files_metadata=True, timeout=limits.read_timeout_s
        )
    if not info.sha:
        raise RemoteError(f"{hub_host()} did not say which commit of {repo_id} it listed.")
    entries = [(s.rfilename, s.size) for s in info.siblings or []]
    models, projectors = group_gguf_files(entries)
    return RemoteListing(
        source="hf", repo=repo_id, revision=info.sha, host=hub_host(), models=models, projectors=projectors
    )


def file_source(repo_id: str, revision: str, path: str, expected_size: int | None = None) -> RangeSource:
    """Where ``path`` of ``repo_id`` at commit ``revision`` is read from, with the token if any."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    url = hf_hub_url(repo_id, path, revision=revision, endpoint=hub_endpoint())
    headers = build_hf_headers(library_name="fitscope")
    return RangeSource(
        url=url,
        shown=f"{repo_id}/{path}",
        headers=headers,
        expected_size=expected_size,
        hint=TOKEN_HINT,
    )
