"""Is a llama.cpp RPC server there and answering? The hello every ggml-rpc client sends first,
with time limits.

llama.cpp's own client (``ggml_backend_rpc_add_server``) connects and waits without a timeout: an
endpoint that accepts and never answers, or trickles bytes, would hang a load with no message, and
anything listening on a port would look like a server. :func:`rpc_hello` speaks the protocol's first
exchange itself (ggml-rpc.cpp ``negotiate_hello`` / ``rpc_serve_client``) with a deadline on the
connection and on the whole answer, and says in one sentence, naming the endpoint, what went wrong.
"""

from __future__ import annotations

import socket
import struct
import time

from app.core.common.errors import FitScopeError


class RpcError(FitScopeError):
    """The RPC backend is missing, a server would not start, or a server is unreachable."""


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:50052`` for IPv6) → (host, port). Raises RpcError."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise RpcError(f"'{endpoint}' is not HOST:PORT (e.g. 127.0.0.1:50052).")
    return host.strip("[]"), int(port)


RPC_CMD_HELLO = 14  # enum rpc_cmd, ggml-rpc.cpp ("RPC_CMD_HELLO must be always 14")
RPC_CONN_CAPS_SIZE = 24  # ggml-rpc/transport.h
RPC_PROTO_MAJOR_VERSION = 7  # ggml-rpc.h of the llama.cpp in llama-cpp-python 0.3.36
_HELLO_REPLY_BYTES = 4 + RPC_CONN_CAPS_SIZE  # rpc_msg_hello_rsp: major, minor, patch, padding, caps
HELLO_TIMEOUT_S = 5.0


def _receive(sock: socket.socket, count: int, deadline: float, endpoint: str, timeout_s: float) -> bytes:
    """Exactly ``count`` bytes before ``deadline`` (a server that trickles bytes is held to the
    whole deadline, not to each byte). Raises RpcError naming the endpoint."""
    data = b""
    while len(data) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RpcError(f"The RPC server at {endpoint} did not answer llama.cpp's RPC hello within {timeout_s:g} s.")
        sock.settimeout(left)
        try:
            chunk = sock.recv(count - len(data))
        except TimeoutError:
            continue
        except OSError as exc:
            raise RpcError(f"The RPC server at {endpoint} broke the connection ({exc.strerror or exc}).") from None
        if not chunk:
            raise RpcError(f"The server at {endpoint} closed the connection without answering llama.cpp's RPC hello.")
        data += chunk
    return data


def rpc_hello(endpoint: str, timeout_s: float = HELLO_TIMEOUT_S) -> tuple[int, int, int]:
    """The RPC protocol version (major, minor, patch) a llama.cpp RPC server at ``endpoint``
    answers to the HELLO every client sends first (ggml-rpc.cpp ``negotiate_hello``: the command
    byte 14, the request's size as 8 bytes, 24 bytes of connection capabilities, none asked here;
    the reply: its size as 8 bytes, then major, minor, patch, padding and 24 bytes of
    capabilities). Connecting and the whole answer are held to ``timeout_s``. Raises RpcError,
    naming the endpoint, for no connection, no or a short answer in time, a server that is not a
    llama.cpp RPC server, or one of another protocol version."""
    host, port = split_endpoint(endpoint)
    deadline = time.monotonic() + timeout_s
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except TimeoutError:
        raise RpcError(f"The RPC server at {endpoint} accepted no connection within {timeout_s:g} s.") from None
    except OSError as exc:
        raise RpcError(f"No RPC server answers at {endpoint} ({exc.strerror or exc}).") from None
    with sock:
        try:
            sock.sendall(bytes([RPC_CMD_HELLO]) + struct.pack("<Q", RPC_CONN_CAPS_SIZE) + bytes(RPC_CONN_CAPS_SIZE))
        except OSError as exc:
            raise RpcError(f"The RPC server at {endpoint} broke the connection ({exc.strerror or exc}).") from None
        size = struct.unpack("<Q", _receive(sock, 8, deadline, endpoint, timeout_s))[0]
        if size != _HELLO_REPLY_BYTES:
            raise RpcError(
                f"The server at {endpoint} is not a llama.cpp RPC server this FitScope can use (its hello "
                f"answer is {size} bytes long, not {_HELLO_REPLY_BYTES})."
            )
        reply = _receive(sock, _HELLO_REPLY_BYTES, deadline, endpoint, timeout_s)
    major, minor, patch = reply[0], reply[1], reply[2]
    if major != RPC_PROTO_MAJOR_VERSION:
        raise RpcError(
            f"The RPC server at {endpoint} speaks RPC protocol {major}.{minor}.{patch}; this llama.cpp speaks "
            f"{RPC_PROTO_MAJOR_VERSION}.x. Run the same llama.cpp release on both ends."
        )
    return major, minor, patch
