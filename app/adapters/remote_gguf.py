"""Read a GGUF file's header over HTTP with range requests: the first chunk, and only when the header
is longer (a 262k-token vocabulary is several MiB), more, doubling, up to the reader's
``MAX_HEADER_BYTES``. The parsing is the local reader's own (``header_from_buffer`` on the prefix
fetched so far, knowing the real file size from ``Content-Range``), so a remote header gets every
check and limit a local file does, and the same model.

The requests go through an ``httpx2`` client: the Hugging Face Hub's own session
(``huggingface_hub.get_session()``, which honours proxies and ``HF_HUB_OFFLINE``) or a plain client
for Ollama's registry. A server is not trusted: redirects are followed by hand, at most
``HttpLimits.max_redirects``, and the ``Authorization`` header never follows one to another host;
connecting and each read have a timeout; a body longer than the range asked for is refused (a
server that ignores ``Range`` would otherwise send the whole model); compressed bodies are not
asked for and not accepted.

Every failure is a :class:`RemoteError` (a FitScopeError): one sentence naming the server and what
to do. ``cancelled()`` is checked between chunks; a cancelled fetch raises :class:`FetchCancelledError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx2

from app.core.common.errors import FitScopeError, ModelFileError
from app.core.model.gguf_reader import MAX_HEADER_BYTES, GgufHeader, HeaderIncompleteError, header_from_buffer

MIB = 1024 * 1024
Report = Callable[[str, Any], None]


class RemoteError(FitScopeError):
    """A server could not be reached, or answered in a way FitScope cannot use."""


class UnreachableError(RemoteError):
    """No answer came: offline, a timeout, a refused connection (a remembered listing may stand in)."""


class FetchCancelledError(RemoteError):
    """The user cancelled the fetch."""

    def __init__(self) -> None:
        super().__init__("Cancelled: nothing more was fetched.")


@dataclass(frozen=True)
class HttpLimits:
    """How patient and how trusting a fetch is."""

    connect_timeout_s: float = 10.0
    read_timeout_s: float = 30.0  # the longest silence while a response is read
    max_redirects: int = 5  # the Hub: resolve -> CDN (one); Ollama: blob -> storage (one)
    first_chunk_bytes: int = 1 * MIB  # a 32k-vocabulary header fits; a 262k one needs three more
    max_document_bytes: int = 4 * MIB  # a manifest or an error page

    def timeout(self) -> httpx2.Timeout:
        return httpx2.Timeout(self.read_timeout_s, connect=self.connect_timeout_s)


DEFAULT_LIMITS = HttpLimits()


@dataclass
class Transfer:
    """What a fetch cost: requests sent and response body bytes received."""

    requests: int = 0
    body_bytes: int = 0


@dataclass
class RangeSource:
    """Where a file's bytes are: its address, the headers to send (a token), and how to name it.
    After the first request ``url`` moves to where the redirects ended (a CDN's signed address), so
    later ranges skip them."""

    url: str
    shown: str  # e.g. huggingface.co/ORG/REPO/file.gguf
    headers: Mapping[str, str] = field(default_factory=dict)
    expected_size: int | None = None  # from the listing, when the server does not say
    hint: str = ""  # said after a 401/403, e.g. how to set a token


def host_of(url: str) -> str:
    parts = urlsplit(url)
    return parts.netloc or url


@dataclass
class _Answer:
    status: int
    headers: httpx2.Headers
    body: bytes
    url: str
    sent_headers: dict[str, str]


@contextmanager
def network_errors(host: str, limits: HttpLimits) -> Iterator[None]:
    """Turns a transport failure into one sentence about ``host``."""
    try:
        yield
    except httpx2.ConnectTimeout:
        raise UnreachableError(
            f"{host} did not answer within {limits.connect_timeout_s:g} s; check the connection and try again."
        ) from None
    except (httpx2.ReadTimeout, httpx2.WriteTimeout, httpx2.PoolTimeout):
        raise UnreachableError(f"{host} stopped answering for {limits.read_timeout_s:g} s; try again later.") from None
    except (httpx2.ConnectError, httpx2.ProxyError) as exc:
        raise UnreachableError(
            f"FitScope cannot reach {host} ({_reason(exc)}): this machine looks offline, or a proxy or firewall "
            "blocks it."
        ) from None
    except httpx2.TransportError as exc:
        raise UnreachableError(f"The connection to {host} failed ({_reason(exc)}); try again.") from None
    except ConnectionError as exc:  # huggingface_hub's offline mode (HF_HUB_OFFLINE) among others
        raise UnreachableError(f"FitScope does not contact {host}: {_reason(exc)}") from None
    except httpx2.InvalidURL as exc:
        raise RemoteError(f"{host} is not a valid server address ({exc}).") from None


def _reason(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:160]


def status_sentence(status: int, what: str, host: str, hint: str = "") -> str:
    """What an HTTP error status means for fetching ``what`` from ``host``."""
    if status in (401, 403):
        return f"{host} refused access to {what} (HTTP {status})." + (f" {hint}" if hint else "")
    if status == 404:
        return f"{what} was not found on {host} (HTTP 404)."
    if status == 429:
        return f"{host} is limiting requests (HTTP 429); wait a minute and try again."
    if status >= 500:
        return f"{host} failed to answer for {what} (HTTP {status}); try again later."
    return f"{host} answered HTTP {status} for {what}, which FitScope cannot use."


def request(
    client: httpx2.Client,
    url: str,
    headers: Mapping[str, str],
    limits: HttpLimits,
    *,
    max_body: int,
    cancelled: Callable[[], bool] | None = None,
    transfer: Transfer | None = None,
) -> _Answer:
    """GET ``url`` following at most ``limits.max_redirects`` redirects. Reads at most
    ``max_body + 1`` bytes of the final body (the caller refuses more). Raises RemoteError."""
    sent = {"Accept-Encoding": "identity", **headers}
    current = url
    for _hop in range(limits.max_redirects + 1):
        if cancelled is not None and cancelled():
            raise FetchCancelledError
        host = host_of(current)
        with (
            network_errors(host, limits),
            client.stream("GET", current, headers=sent, follow_redirects=False, timeout=limits.timeout()) as response,
        ):
            if transfer is not None:
                transfer.requests += 1
            location = response.headers.get("location")
            if response.is_redirect and location:
                target = urljoin(current, location)
                if urlsplit(target).scheme not in ("http", "https"):
                    raise RemoteError(f"{host} redirected to an address FitScope does not follow ({target[:80]}).")
                if host_of(target) != host:
                    # A token is for the server it was given to, never for where it points.
                    sent = {k: v for k, v in sent.items() if k.lower() != "authorization"}
                current = target
                continue
            encoding = response.headers.get("content-encoding", "identity").lower()
            if encoding not in ("identity", ""):
                raise RemoteError(f"{host} sent a compressed ({encoding}) body that FitScope did not ask for.")
            body = bytearray()
            for chunk in response.iter_raw(64 * 1024):
                body += chunk
                if transfer is not None:
                    transfer.body_bytes += len(chunk)
                if len(body) > max_body:
                    break
                if cancelled is not None and cancelled():
                    raise FetchCancelledError
            return _Answer(response.status_code, response.headers, bytes(body), current, sent)
    raise RemoteError(f"{host_of(url)} redirected more than {limits.max_redirects} times; FitScope stopped following.")


def read_range(
    client: httpx2.Client,
    source: RangeSource,
    start: int,
    end: int,
    limits: HttpLimits,
    cancelled: Callable[[], bool] | None = None,
    transfer: Transfer | None = None,
) -> tuple[bytes, int]:
    """Bytes ``start``..``end`` (inclusive) of the file, and the file's size. Raises RemoteError."""
    asked = end - start + 1
    answer = request(
        client,
        source.url,
        {**source.headers, "Range": f"bytes={start}-{end}"},
        limits,
        max_body=asked,
        cancelled=cancelled,
        transfer=transfer,
    )
    host = host_of(answer.url)
    if answer.status == 206:
        first, last, total = _content_range(answer.headers.get("content-range", ""))
        if first != start or last is None or last > end or len(answer.body) != last - first + 1:
            got = answer.headers.get("content-range", "none")
            raise RemoteError(
                f"{host} answered bytes {got} with {len(answer.body):,} bytes to a request for bytes {start}-{end} "
                f"of {source.shown}; FitScope refuses a response other than the one it asked for."
            )
        size = total if total is not None else source.expected_size
        if size is None:
            raise RemoteError(f"{host} does not say how large {source.shown} is, so its header cannot be checked.")
        source.url, source.headers = answer.url, _without_range(answer.sent_headers)
        return answer.body, size
    if answer.status == 200:
        if start == 0 and len(answer.body) <= asked:
            source.url, source.headers = answer.url, _without_range(answer.sent_headers)
            return answer.body, len(answer.body)  # the whole file was smaller than the range
        raise RemoteError(
            f"{host} ignores range requests (it began sending all of {source.shown}), so FitScope cannot read "
            "the header alone; it stopped."
        )
    if answer.status == 416:
        raise RemoteError(f"{source.shown} on {host} is shorter than its header says (HTTP 416 at byte {start:,}).")
    raise RemoteError(status_sentence(answer.status, source.shown, host, source.hint))


def _without_range(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() != "range"}


def _content_range(value: str) -> tuple[int | None, int | None, int | None]:
    """(first, last, total) from ``bytes first-last/total`` (total may be ``*``)."""
    try:
        unit, _, spec = value.strip().partition(" ")
        span, _, total = spec.partition("/")
        first, _, last = span.partition("-")
        if unit.lower() != "bytes":
            return None, None, None
        return int(first), int(last), (None if total.strip() == "*" else int(total))
    except ValueError:
        return None, None, None


def read_remote_header(
    client: httpx2.Client,
    source: RangeSource,
    path: Path,
    limits: HttpLimits = DEFAULT_LIMITS,
    cancelled: Callable[[], bool] | None = None,
    report: Report | None = None,
    transfer: Transfer | None = None,
) -> tuple[GgufHeader, bytes]:
    """The header of the GGUF file at ``source`` (named ``path`` in messages), and the bytes it
    was read from (what a cache keeps). Reads the first ``limits.first_chunk_bytes``, then more,
    doubling, while the header runs on; never past ``MAX_HEADER_BYTES``.

    Raises RemoteError (the server), ModelFileError (the file: not a GGUF, corrupt, a header past
    the limit) or FetchCancelledError."""
    transfer = transfer if transfer is not None else Transfer()
    prefix = bytearray()
    file_size: int | None = None
    want = limits.first_chunk_bytes
    while True:
        chunk, size = read_range(client, source, len(prefix), want - 1, limits, cancelled, transfer)
        if file_size is not None and size != file_size:
            raise RemoteError(f"{source.shown} changed size while it was read ({file_size:,} then {size:,} bytes).")
        file_size = size
        prefix += chunk
        if report is not None:
            report("fetched", (source.shown, len(prefix)))
        try:
            header = header_from_buffer(path, prefix, len(prefix), file_size)
        except HeaderIncompleteError as more:
            if not chunk:
                raise RemoteError(f"{host_of(source.url)} sent no bytes of {source.shown}.") from None
            if more.needed_bytes > MAX_HEADER_BYTES or len(prefix) >= MAX_HEADER_BYTES:
                raise ModelFileError(
                    f"{source.shown} has a header longer than {MAX_HEADER_BYTES // MIB} MiB (no published model's "
                    "comes near); FitScope does not read it."
                ) from None
            want = min(file_size, MAX_HEADER_BYTES, max(2 * len(prefix), more.needed_bytes))
            continue
        return header, bytes(prefix[: min(header.data_offset, len(prefix))])
