"""llama.cpp's RPC backend through llama-cpp-python: is it built in, local ``ggml-rpc-server``
processes, and a client that uses them.

llama-cpp-python builds ``libggml-rpc`` only with ``CMAKE_ARGS="-DGGML_RPC=ON"`` and installs no
``ggml-rpc-server`` program, so both ends go through the library:

* a server is ``ggml_backend_rpc_start_server(endpoint, cache_dir, n_threads, n_devices, devices)``
  (ggml-rpc.h) on the CPU backend device. It never returns, so each server is a child process,
  ``python -m app.adapters.rpc_servers --serve HOST:PORT`` (:class:`LocalRpcServers` starts N of
  them on loopback, waits until each accepts connections and stops them all on exit, on error and
  when the parent dies);
* a client registers each server with ``ggml_backend_rpc_add_server(endpoint)`` and
  ``ggml_backend_register`` before loading the model (:func:`register_rpc_servers`, what
  llama.cpp's ``--rpc`` does in common/arg.cpp); llama.cpp then puts their devices, named
  ``RPC<n>`` and printed in buffer lines as ``RPC0[HOST:PORT]``, at the front of its device list.

A server's memory is what its CPU device reports (the host's RAM): this release's
``ggml_backend_rpc_start_server`` takes no memory size, so FitScope fixes the split with
``--tensor-split`` instead of letting the reported free memory decide it.

pip may reuse a wheel built without RPC: :func:`rpc_backend_problem` says so, with the command that
rebuilds it, instead of failing later inside llama.cpp.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from app.adapters.child import child_env, module_command
from app.adapters.child_protocol import ChildEvent
from app.adapters.rpc_backend import (
    GGML_BACKEND_DEVICE_TYPE_CPU,
    require_rpc_backend,
    rpc_backend_problem,
    rpc_library_path,
)
from app.adapters.rpc_hello import RpcError, rpc_hello, split_endpoint
from app.core.common.units import MIB
from app.core.plans.rpc import RpcBufferCheck, RpcPlan
from app.core.speed.measure import RunResult, RunSettings

"""Add the platform's other flags to CMAKE_ARGS (scripts/bootstrap.sh sets them)."""
START_TIMEOUT_S = 30.0
STOP_GRACE_S = 2.0


# -- is it built in? ------------------------------------------------------------------------------


# -- endpoints ------------------------------------------------------------------------------------


def free_loopback_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 now (the OS's choice)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


# -- local servers (parent side) ------------------------------------------------------------------


class LocalRpcServers:
    """``count`` RPC servers on loopback, each a child process serving this machine's CPU.

    ``start()`` returns their endpoints once every one accepts connections; ``stop()`` ends them
    (terminate, then kill after ``STOP_GRACE_S``). Use it as a context manager; it is also stopped
    at interpreter exit, and each server ends when its parent dies (its stdin closes; on Linux the
    kernel also sends it SIGKILL). Raises :class:`RpcError` when the backend is missing or a
    server does not come up within ``start_timeout_s``.
    """

    def __init__(self, count: int, *, threads: int | None = None, start_timeout_s: float = START_TIMEOUT_S) -> None:
        if not 1 <= count <= 16:
            raise RpcError("Start 1 to 16 local RPC servers (llama.cpp takes at most 16).")
        self.count = count
        self.threads = threads
        self.start_timeout_s = start_timeout_s
        self.endpoints: tuple[str, ...] = ()
        self._procs: list[subprocess.Popen[bytes]] = []
        self._stderr: list[list[str]] = []
        self._lock = threading.Lock()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def start(self) -> tuple[str, ...]:
        require_rpc_backend()
        atexit.register(self.stop)
        try:
            ports = free_loopback_ports(self.count)
            endpoints = tuple(f"127.0.0.1:{p}" for p in ports)
            for endpoint in endpoints:
                self._spawn(endpoint)
            self._wait_until_accepting(endpoints)
        except BaseException:
            self.stop()
            raise
        self.endpoints = endpoints
        return endpoints

    def _spawn(self, endpoint: str) -> None:
        cmd = [*module_command("app.adapters.rpc_servers"), "--serve", endpoint]
        if self.threads:
            cmd += ["--threads", str(self.threads)]
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=child_env(),
        )
        lines: list[str] = []

        def drain() -> None:
            assert proc.stderr is not None
            for raw in proc.stderr:
                lines.append(raw.decode("utf-8", "replace"))
                del lines[:-50]

        threading.Thread(target=drain, daemon=True).start()
        with self._lock:
            self._procs.append(proc)
            self._stderr.append(lines)

    def _wait_until_accepting(self, endpoints: Sequence[str]) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        waiting = dict(zip(endpoints, self._procs, strict=True))
        while waiting:
            for endpoint, proc in list(waiting.items()):
                if proc.poll() is not None:
                    tail = "".join(self._stderr[self._procs.index(proc)][-5:]).strip()
                    raise RpcError(
                        f"The RPC server at {endpoint} exited at start (status {proc.returncode})"
                        + (f": {tail}" if tail else ".")
                    )
                try:
                    # Up only once it answers llama.cpp's hello: anything else may accept on a port.
                    rpc_hello(endpoint, timeout_s=1.0)
                except RpcError:
                    pass
                else:
                    del waiting[endpoint]
            if waiting and time.monotonic() > deadline:
                raise RpcError(
                    f"The RPC server(s) at {', '.join(waiting)} did not answer llama.cpp's RPC hello within "
                    f"{self.start_timeout_s:g} s."
                )
            if waiting:
                time.sleep(0.05)

    def stopped(self) -> list[str]:
        """The endpoints whose server process has exited."""
        return [e for e, p in zip(self.endpoints, self._procs, strict=False) if p.poll() is not None]

    def stop(self) -> None:
        """End every server: SIGTERM, then SIGKILL after ``STOP_GRACE_S``. Idempotent."""
        with self._lock:
            procs, self._procs = self._procs, []
        for p in procs:
            with contextlib.suppress(OSError, ValueError):
                if p.stdin is not None:
                    p.stdin.close()
            with contextlib.suppress(OSError):
                p.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    p.kill()
                p.wait()
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        # Keep the processes for stopped()/pids after stop: they are reaped.
        self._procs = procs

    def __enter__(self) -> LocalRpcServers:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- a run across servers (parent side; what the command line and the window both call) -----------


@dataclass(frozen=True)
class RpcRunOutcome:
    """A finished run across RPC servers: the run, the plan it followed and every per-device buffer
    llama.cpp printed beside the plan's figure."""

    result: RunResult
    plan: RpcPlan
    endpoints: tuple[str, ...]
    checks: tuple[RpcBufferCheck, ...]

    @property
    def weights_and_kv_agree(self) -> bool:
        return all(c.agrees for c in self.checks if c.buffer != "compute")

    def verdict(self) -> str:
        exact = [c for c in self.checks if c.buffer != "compute"]
        worst = max((abs(c.difference_bytes) for c in self.checks if c.buffer == "compute"), default=0)
        compute = f"compute buffers within {worst / MIB:.2f} MiB of the plan"
        if self.weights_and_kv_agree:
            return (
                f"Across {len(self.endpoints)} RPC servers every weight and KV buffer llama.cpp printed equals "
                f"the plan to its 0.01 MiB; {compute}."
            )
        bad = ", ".join(f"{c.device} {c.buffer}" for c in exact if not c.agrees)
        return f"Across {len(self.endpoints)} RPC servers these buffers differ from the plan: {bad}; {compute}."


def run_across_rpc(
    settings: RunSettings,
    *,
    endpoints: Sequence[str] = (),
    local_servers: int = 0,
    on_event: Callable[[ChildEvent], None] | None = None,
    on_start: Callable[[Any], None] | None = None,
    on_servers: Callable[[tuple[str, ...]], None] | None = None,
) -> RpcRunOutcome:
    """Run ``settings`` split across the RPC servers at ``endpoints``, or across ``local_servers``
    servers started here for the run (and stopped after it, whatever happens). ``-ngl 0`` becomes
    every layer (the servers would hold nothing). The split is even (``--tensor-split 1,1,...``):
    the plan assumes each server serves one CPU like this machine's.

    Raises :class:`RpcError` (no RPC backend, a server that does not start or answer) and
    :class:`~app.adapters.llamacpp_runner.RunError` (the run failed; a server that went away is
    named: "the RPC server at HOST:PORT stopped during the run").
    """
    from app.adapters.host import detect_host
    from app.adapters.llamacpp_runner import run_live
    from app.core.memory.targets import cpu_target, repack_profile
    from app.core.model.source import model_from_gguf
    from app.core.plans.rpc import cpu_servers_plan, rpc_buffer_checks
    from app.core.report.run_vs_estimate import estimate_settings

    require_rpc_backend()
    if settings.gpu_layers == 0:
        settings = settings.model_copy(update={"gpu_layers": "all"})
    model = model_from_gguf(settings.gguf_path)
    host = detect_host(measure_bandwidth=False)
    with contextlib.ExitStack() as stack:
        if local_servers:
            servers = stack.enter_context(LocalRpcServers(local_servers, threads=settings.n_threads))
            names = servers.endpoints
        else:
            names = tuple(endpoints)
            if not names:
                raise RpcError("Name the RPC servers (HOST:PORT) or how many to start here.")
        if on_servers is not None:
            on_servers(names)
        plan = cpu_servers_plan(
            model.arch,
            model.tensors,
            estimate_settings(settings, repack_profile(host)),
            names,
            cpu_target(host),
            host.ram_total_bytes,
            shared_memory=bool(local_servers),
            model_path=settings.gguf_path,
        )
        settings = settings.model_copy(update={"rpc_servers": names, "tensor_split": plan.tensor_split})
        result = run_live(
            settings, on_event=on_event, on_start=on_start, hardware={"label": f"{len(names)} RPC servers"}
        )
    return RpcRunOutcome(result, plan, names, tuple(rpc_buffer_checks(plan, result.buffers)))


# -- client side (inside a llama.cpp worker) ------------------------------------------------------


# -- a server (the child process) -----------------------------------------------------------------


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            pr_set_pdeathsig = 1
            libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)

    def watch_stdin() -> None:
        with contextlib.suppress(OSError, ValueError):
            while sys.stdin.buffer.read(4096):
                pass
        os._exit(0)  # the parent closed our stdin or died

    threading.Thread(target=watch_stdin, daemon=True).start()


def serve(endpoint: str, threads: int | None = None) -> int:
    """Serve this machine's CPU at ``endpoint`` until killed (``ggml_backend_rpc_start_server``
    blocks; ctypes drops the GIL meanwhile, so the stdin watcher keeps running). Returns 1 when the
    server could not start (its reason is on stderr)."""
    split_endpoint(endpoint)
    problem = rpc_backend_problem()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    # Anything ggml prints goes to stderr; stdout is not read.
    os.dup2(2, 1)
    import llama_cpp  # noqa: F401 - loads libggml and registers the CPU backend
    from llama_cpp._ggml import libggml

    from app.adapters.cpu_topology import llama_math_threads

    libggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    libggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    cpu = libggml.ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)
    if not cpu:
        print("llama.cpp reports no CPU device", file=sys.stderr)
        return 1
    path = rpc_library_path()
    assert path is not None
    rpc = ctypes.CDLL(str(path))
    start = rpc.ggml_backend_rpc_start_server
    start.restype = None
    start.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_void_p),
    ]
    devices = (ctypes.c_void_p * 1)(cpu)
    start(endpoint.encode(), None, threads or llama_math_threads(), 1, devices)
    print(f"the RPC server at {endpoint} could not start (is the port in use?)", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m app.adapters.rpc_servers", description=__doc__.split("\n")[0])
    p.add_argument("--serve", metavar="HOST:PORT", help="serve this machine's CPU at HOST:PORT until killed")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--check", action="store_true", help="say whether the RPC backend is built in")
    args = p.parse_args(argv)
    if args.serve:
        _die_with_parent()
        return serve(args.serve, args.threads)
    problem = rpc_backend_problem()
    print(problem or f"RPC backend present: {rpc_library_path()}")
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(main())
