"""llama.cpp's RPC backend as the client side uses it: whether llama-cpp-python was built with it,
endpoints, and registering servers with ``ggml_backend_rpc_add_server`` before a model loads (what
llama.cpp's ``--rpc`` does in common/arg.cpp); llama.cpp then puts their devices, named ``RPC<n>``,
at the front of its device list. The server processes and runs across them are
:mod:`app.adapters.rpc_servers`.

pip may reuse a wheel built without RPC: :func:`rpc_backend_problem` says so, with the command that
rebuilds it, instead of failing later inside llama.cpp.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.adapters.rpc_hello import RpcError, rpc_hello, split_endpoint

RPC_REBUILD_COMMAND = 'CMAKE_ARGS="-DGGML_RPC=ON" pip install --force-reinstall --no-cache-dir llama-cpp-python==0.3.36'


RPC_SYMBOLS = ("ggml_backend_rpc_start_server", "ggml_backend_rpc_add_server")


GGML_BACKEND_DEVICE_TYPE_CPU = 0  # enum ggml_backend_dev_type, ggml-backend.h


GGML_BACKEND_DEVICE_TYPE_GPU = 1


GGML_BACKEND_DEVICE_TYPE_IGPU = 2


def _llama_lib_dir() -> Path | None:
    spec = importlib.util.find_spec("llama_cpp")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def rpc_library_path() -> Path | None:
    """llama-cpp-python's ``libggml-rpc`` (``ggml-rpc.dll`` on Windows), or None."""
    lib_dir = _llama_lib_dir()
    if lib_dir is None or not lib_dir.is_dir():
        return None
    for pattern in ("libggml-rpc.so", "libggml-rpc.dylib", "ggml-rpc.dll", "libggml-rpc.so.*"):
        found = sorted(lib_dir.glob(pattern))
        if found:
            return found[0]
    return None


@functools.lru_cache(maxsize=1)
def rpc_backend_problem() -> str | None:
    """None when the installed llama.cpp has the RPC backend (``libggml-rpc`` present and its
    server and client functions loadable); otherwise a sentence saying what to run."""
    if _llama_lib_dir() is None:
        return "llama-cpp-python is not installed."
    path = rpc_library_path()
    if path is None:
        return f"this llama.cpp build has no RPC backend; rebuild with {RPC_REBUILD_COMMAND}"
    try:
        lib = ctypes.CDLL(str(path))
        missing = [name for name in RPC_SYMBOLS if not hasattr(lib, name)]
    except OSError as exc:
        return (
            f"this llama.cpp build's RPC backend ({path.name}) does not load ({exc}); "
            f"rebuild with {RPC_REBUILD_COMMAND}"
        )
    if missing:
        return f"this llama.cpp build's RPC backend lacks {', '.join(missing)}; rebuild with {RPC_REBUILD_COMMAND}"
    return None


def require_rpc_backend() -> None:
    """Raises :class:`RpcError` with :func:`rpc_backend_problem`'s sentence when the backend is missing."""
    problem = rpc_backend_problem()
    if problem:
        raise RpcError(problem[0].upper() + problem[1:])


def parse_endpoints(text: str) -> tuple[str, ...]:
    """``HOST:PORT[,HOST:PORT...]`` as llama.cpp's ``--rpc`` takes it. Raises RpcError."""
    endpoints = tuple(e.strip() for e in text.split(",") if e.strip())
    if not endpoints:
        raise RpcError("Name at least one RPC server as HOST:PORT.")
    for e in endpoints:
        split_endpoint(e)
    if len(set(endpoints)) != len(endpoints):
        raise RpcError("Each RPC server may be named once.")
    return endpoints


def answers(endpoint: str, timeout_s: float = 1.0) -> bool:
    """Whether something accepts TCP connections at ``endpoint`` (a busy server still does: the
    connection waits in its backlog)."""
    host, port = split_endpoint(endpoint)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def unreachable(endpoints: Sequence[str], timeout_s: float = 1.0) -> list[str]:
    """The endpoints that accept no connection."""
    return [e for e in endpoints if not answers(e, timeout_s)]


def stopped_during_run_message(endpoints: Sequence[str], timeout_s: float = 1.0) -> str | None:
    """ "the RPC server at HOST:PORT stopped during the run" for the first endpoint that no longer
    accepts connections, else None."""
    gone = unreachable(endpoints, timeout_s)
    if not gone:
        return None
    if len(gone) == 1:
        return f"the RPC server at {gone[0]} stopped during the run"
    return f"the RPC servers at {', '.join(gone)} stopped during the run"


def register_rpc_servers(endpoints: Sequence[str]) -> Any:
    """Make each server's devices llama.cpp devices of this process, in order (the first server's
    become RPC0...), as llama.cpp's ``--rpc`` does, and return the devices a model should use: the
    servers' first, then this machine's own GPUs, as a NULL-terminated ``ggml_backend_dev_t``
    array for ``llama_model_params.devices`` (keep it referenced while models load). Call it once
    per process, after ``import llama_cpp``.

    The list is passed explicitly because llama-cpp-python 0.3.36's library left registered RPC
    devices out of its default device selection here (every layer stayed on the CPU).

    Raises :class:`RpcError` when the backend is missing or a server does not answer (llama.cpp
    itself would abort).
    """
    require_rpc_backend()
    # An unreachable server or a dropped connection makes ggml-rpc abort; skip the gdb backtrace
    # ggml would otherwise attach, so that the process ends at once.
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    # llama.cpp's own connection has no timeout: a server that accepts and never answers (or
    # trickles bytes) would hang the load without a word. Each must answer the hello in time first.
    for endpoint in endpoints:
        rpc_hello(endpoint)
    from llama_cpp._ggml import libggml as g

    pointer, text = ctypes.c_void_p, ctypes.c_char_p
    for name, restype, argtypes in (
        ("ggml_backend_reg_by_name", pointer, [text]),
        ("ggml_backend_reg_get_proc_address", pointer, [pointer, text]),
        ("ggml_backend_register", None, [pointer]),
        ("ggml_backend_reg_dev_count", ctypes.c_size_t, [pointer]),
        ("ggml_backend_reg_dev_get", pointer, [pointer, ctypes.c_size_t]),
        ("ggml_backend_dev_count", ctypes.c_size_t, []),
        ("ggml_backend_dev_get", pointer, [ctypes.c_size_t]),
        ("ggml_backend_dev_type", ctypes.c_int, [pointer]),
        ("ggml_backend_dev_backend_reg", pointer, [pointer]),
    ):
        fn = getattr(g, name)
        fn.restype, fn.argtypes = restype, argtypes
    rpc_reg = g.ggml_backend_reg_by_name(b"RPC")
    if not rpc_reg:
        raise RpcError(f"This llama.cpp build has no RPC backend; rebuild with {RPC_REBUILD_COMMAND}")
    address = g.ggml_backend_reg_get_proc_address(rpc_reg, b"ggml_backend_rpc_add_server")
    if not address:
        raise RpcError("This llama.cpp build's RPC backend has no ggml_backend_rpc_add_server.")
    add_server = ctypes.CFUNCTYPE(pointer, text)(address)
    devices: list[int] = []
    for endpoint in endpoints:
        server_reg = add_server(endpoint.encode())
        if not server_reg:
            raise RpcError(f"The RPC server at {endpoint} reports no device.")
        g.ggml_backend_register(server_reg)
        devices += [g.ggml_backend_reg_dev_get(server_reg, i) for i in range(g.ggml_backend_reg_dev_count(server_reg))]
    for i in range(g.ggml_backend_dev_count()):  # then this machine's GPUs, as llama.cpp orders them
        dev = g.ggml_backend_dev_get(i)
        own_gpu = g.ggml_backend_dev_type(dev) in (GGML_BACKEND_DEVICE_TYPE_GPU, GGML_BACKEND_DEVICE_TYPE_IGPU)
        if own_gpu and g.ggml_backend_dev_backend_reg(dev) != rpc_reg and dev not in devices:
            devices.append(dev)
    return (ctypes.c_void_p * (len(devices) + 1))(*devices, None)


def load_models_on(llama_cpp: Any, devices: Any) -> None:
    """Make every model this process loads through ``llama_cpp.Llama`` use ``devices`` (from
    :func:`register_rpc_servers`): llama-cpp-python's ``Llama`` takes no device list, so its
    starting point, ``llama_model_default_params()``, gets one."""
    module = llama_cpp.llama_cpp
    original = module.llama_model_default_params

    def with_devices() -> Any:
        params = original()
        params.devices = ctypes.cast(devices, ctypes.c_void_p)
        return params

    module.llama_model_default_params = with_devices


def offloads_to_local_gpu(llama_cpp: Any) -> bool:
    """Whether this llama.cpp build can offload to a GPU of this machine: a GPU or integrated-GPU
    device of a backend other than RPC. (``llama_supports_gpu_offload()`` also answers true for a
    CPU-only build with the RPC backend.)"""
    if not llama_cpp.llama_supports_gpu_offload():
        return False
    from llama_cpp._ggml import libggml as g

    pointer = ctypes.c_void_p
    for name, restype, argtypes in (
        ("ggml_backend_dev_count", ctypes.c_size_t, []),
        ("ggml_backend_dev_get", pointer, [ctypes.c_size_t]),
        ("ggml_backend_dev_type", ctypes.c_int, [pointer]),
        ("ggml_backend_dev_backend_reg", pointer, [pointer]),
        ("ggml_backend_reg_name", ctypes.c_char_p, [pointer]),
    ):
        fn = getattr(g, name)
        fn.restype, fn.argtypes = restype, argtypes
    for i in range(g.ggml_backend_dev_count()):
        dev = g.ggml_backend_dev_get(i)
        gpu = g.ggml_backend_dev_type(dev) in (GGML_BACKEND_DEVICE_TYPE_GPU, GGML_BACKEND_DEVICE_TYPE_IGPU)
        if gpu and g.ggml_backend_reg_name(g.ggml_backend_dev_backend_reg(dev)) != b"RPC":
            return True
    return False
