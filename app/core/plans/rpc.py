"""One model across several machines with llama.cpp's RPC backend: memory per host, speed with the
network in the loop, and the command for each host.

llama.cpp (``ggml-rpc``, built with ``-DGGML_RPC=ON``) turns each device an ``ggml-rpc-server``
exposes on a remote host into one more device of the client, of GPU type, put at the *front* of the
device list (``llama_model_load``, src/llama.cpp: "add RPC servers at the front of the list to
minimize network transfers"), then the client's own GPUs. The layer split is the ordinary one: whole
layers to each device in proportion to its memory (``--tensor-split`` pins the proportions), every
device holding its layers' weights and KV cache and its own compute buffer; the client keeps the
token embedding, the logits and whatever is not offloaded. So the plan is the estimator's
(:func:`app.core.memory.estimate.estimate`) over the hosts' devices as targets, plus, per host, the memory
of the process serving it; each host's part is the layer split's per-device record
(:class:`app.core.plans.layer_split.SplitDevice`) summed over its devices.

Decoding crosses the network at every host boundary: the client sends each device its inputs,
starts the graph and reads the result back, synchronously. Per decode step and per remote device
FitScope counts ``RPC_ROUND_TRIPS_PER_STEP`` round trips plus the hidden state in and out (n_embd
f32 values per user) at the link's speed, and the logits when the output layer is remote. These
are assumptions, shown with the plan: the per-device buffers follow the estimator, which the
dry-run proof checks for one machine; the network term has not been measured here.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from app.core.common.errors import EstimateError
from app.core.common.text import shell_quote
from app.core.common.units import MIB, Frozen
from app.core.memory.commands import MODEL_PLACEHOLDER, server_command, tensor_split
from app.core.memory.estimate import estimate
from app.core.memory.records import CPU_RUNTIME_OVERHEAD_BYTES, GPU_RUNTIME_OVERHEAD_BYTES, Estimate, Settings, Target
from app.core.memory.targets import host_ram_target, target_from_device
from app.core.model.architecture import Architecture
from app.core.model.catalog import find_device
from app.core.model.tensors import TensorInfo
from app.core.plans.layer_split import SplitDevice, share_json, share_line
from app.core.speed.measure import MeasuredBuffers
from app.core.speed.predict import estimate_speed

RPC_TRUST_NOTE = (
    "The RPC protocol has no authentication: anyone who reaches a host's port can use its memory and devices; "
    "run it only on a trusted network."
)
DEFAULT_RPC_PORT = 50052  # ggml-rpc-server's default port (tools/rpc/rpc-server.cpp)
RPC_SERVER_BINARY = "ggml-rpc-server"  # tools/rpc in this llama.cpp; older releases built it as rpc-server
RPC_ROUND_TRIPS_PER_STEP = 3
"""Per remote device and decode step: inputs set, graph computed, result read (an assumption)."""
RPC_SERVER_OVERHEAD_BYTES = CPU_RUNTIME_OVERHEAD_BYTES
"""The ggml-rpc-server process on a CPU-only host (a GPU host adds the GPU runtime's own)."""
PRINT_PRECISION_BYTES = round(0.005 * MIB)
"""llama.cpp prints buffer sizes as ``%.2f MiB``: a printed figure is good to ±0.005 MiB (5243 bytes)."""

_ENDPOINT = re.compile(r"^[A-Za-z0-9.\-_\[\]:]+$")


class RpcHost(Frozen):
    """One remote machine running ``ggml-rpc-server``: a catalog device (a GPU, ``count`` of them,
    an Apple or unified-memory machine, or a CPU box) reachable at ``address``:``port``."""

    address: str = Field(min_length=1, max_length=200)
    port: int = Field(default=DEFAULT_RPC_PORT, ge=1, le=65535)
    device_id: str
    count: int = Field(default=1, ge=1, le=8)

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{self.port}"


class NetworkLink(Frozen):
    """The network between the client and each host: ``gbit_s`` of bandwidth, ``rtt_ms`` round trip."""

    gbit_s: float = Field(default=10.0, gt=0, le=10000)
    rtt_ms: float = Field(default=0.2, ge=0, le=1000)


@dataclass(frozen=True)
class RpcHostPlan:
    """What one machine holds, ``share``: its devices' parts of the split summed; with where it
    listens and the command it runs. The byte figures group the buffers as llama.cpp prints them
    for a device, so that a run's log can be held against them: the model buffers (repacked weights
    included), the KV cache with the recurrent state, the compute buffer with the logits' output
    buffer (and a vision projector's)."""

    share: SplitDevice
    endpoint: str
    device_name: str
    command: str

    @property
    def name(self) -> str:
        return self.share.name

    @property
    def layers(self) -> int:
        return self.share.layers

    @property
    def holds_output(self) -> bool:
        return self.share.holds_output

    @property
    def weights_bytes(self) -> int:
        return self.share.model_buffer_bytes

    @property
    def kv_cache_bytes(self) -> int:
        return self.share.cache_buffer_bytes

    @property
    def compute_bytes(self) -> int:
        return self.share.compute_buffer_bytes

    @property
    def overhead_bytes(self) -> int:
        return self.share.overhead_bytes

    @property
    def total_bytes(self) -> int:
        return self.share.total_bytes

    @property
    def capacity_bytes(self) -> int:
        return self.share.capacity_bytes

    @property
    def fits(self) -> bool:
        return self.share.fits

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "endpoint": self.endpoint,
            "device": self.device_name,
            **share_json(self),
            "command": self.command,
        }


@dataclass(frozen=True)
class RpcPlan:
    model_name: str
    estimate: Estimate
    hosts: tuple[RpcHostPlan, ...]
    client: RpcHostPlan
    link: NetworkLink
    decode_compute_tokens_per_s: float
    network_seconds_per_token: float
    command: str
    notes: tuple[str, ...]
    tensor_split: tuple[int, ...] = ()
    """llama.cpp's ``--tensor-split`` for the plan's devices (remote first), as in ``command``."""

    @property
    def decode_tokens_per_s(self) -> float:
        """Per user, the network in the loop (typical figure of the speed model)."""
        compute = 1.0 / self.decode_compute_tokens_per_s if self.decode_compute_tokens_per_s > 0 else math.inf
        return 1.0 / (compute + self.network_seconds_per_token)

    @property
    def fits(self) -> bool:
        return all(h.fits for h in self.hosts) and self.client.fits

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": "llama.cpp rpc",
            "model": self.model_name,
            "fits": self.fits,
            "gpu_layers": self.estimate.gpu_layers,
            "n_layer": self.estimate.n_layer,
            "hosts": [h.to_json() for h in self.hosts],
            "client": self.client.to_json(),
            "link": self.link.model_dump(),
            "decode_compute_tokens_per_s": round(self.decode_compute_tokens_per_s, 2),
            "network_seconds_per_token": self.network_seconds_per_token,
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 2),
            "settings": self.estimate.settings.model_dump(),
            "command": self.command,
            "notes": list(self.notes),
        }

    def summary_lines(self) -> list[str]:
        lines = [
            f"llama.cpp's RPC backend splits {self.model_name} by whole layers over {len(self.hosts)} remote "
            f"host(s) and the client: {self.estimate.gpu_layers} of {self.estimate.n_layer + 1} layers (the output "
            "layer included) on the remote devices and the client's GPUs."
        ]
        lines += [share_line(f"{h.name} ({h.device_name})", h, total_unit=" GiB") for h in (*self.hosts, self.client)]
        lines.append(
            f"Decode: about {self.decode_tokens_per_s:.1f} tokens/s per user with the network "
            f"({self.link.gbit_s:g} Gbit/s, {self.link.rtt_ms:g} ms round trip: "
            f"{self.network_seconds_per_token * 1000:.2f} ms per token) against "
            f"{self.decode_compute_tokens_per_s:.1f} without it."
        )
        return lines


def bind_address(address: str) -> str:
    """The address a host's ``ggml-rpc-server -H`` binds to: the one the client reaches it by,
    never every interface (0.0.0.0, what llama.cpp's README shows). The server takes an IPv4
    address only (``inet_addr`` in ggml-rpc's transport.cpp), so a host named otherwise gets a
    placeholder naming it (IPV4_OF_NAME) to replace with its own IPv4 address."""
    try:
        return str(ipaddress.IPv4Address(address))
    except ValueError:
        return "IPV4_OF_" + (re.sub(r"[^A-Za-z0-9]+", "_", address.strip("[]")).strip("_").upper() or "HOST")


def _host_target(host: RpcHost, index: int, given: Target | None = None) -> list[Target]:
    """The devices one ``ggml-rpc-server`` exposes, as the client's (GPU-type) devices; ``given``:
    a server exposing one device described by that target (this machine's CPU, say) instead of
    the catalog device."""
    if given is not None:
        overhead = RPC_SERVER_OVERHEAD_BYTES + (GPU_RUNTIME_OVERHEAD_BYTES if given.kind == "gpu" else 0)
        return [
            given.model_copy(
                update={
                    "kind": "gpu",
                    "overhead_bytes": overhead,
                    "name": f"{given.name} (RPC{index} {host.endpoint} #0)",
                }
            )
        ]
    device = find_device(host.device_id)
    base = target_from_device(device)
    if not device.is_gpu:
        # A CPU-only server exposes its CPU as one RPC device: its RAM, read at its bandwidth.
        base = base.model_copy(update={"kind": "gpu", "overhead_bytes": RPC_SERVER_OVERHEAD_BYTES})
    else:
        base = base.model_copy(update={"overhead_bytes": GPU_RUNTIME_OVERHEAD_BYTES + RPC_SERVER_OVERHEAD_BYTES})
    count = host.count if device.is_gpu else 1
    # The device's name stays in front: the speed model picks its family from it.
    return [base.model_copy(update={"name": f"{device.name} (RPC{index} {host.endpoint} #{i})"}) for i in range(count)]


def rpc_plan(
    arch: Architecture,
    tensors: Sequence[TensorInfo],
    settings: Settings,
    hosts: Sequence[RpcHost],
    client_ram_bytes: int,
    *,
    client_gpu_id: str | None = None,
    client_gpu_count: int = 0,
    link: NetworkLink | None = None,
    model_path: str = MODEL_PLACEHOLDER,
    host_targets: Sequence[Target] | None = None,
) -> RpcPlan:
    """llama.cpp's layer split of ``arch`` over the devices of ``hosts`` (in that order, at the front)
    and the client's own ``client_gpu_count`` x ``client_gpu_id``, with ``client_ram_bytes`` of host
    memory on the client, under ``settings``. Bytes are integers.

    ``host_targets`` (one per host) describes each server's one device directly, for servers that
    are not catalog hardware (the hosts' ``device_id`` is then only a label); CPU targets run the CPU
    backend.

    Raises EstimateError for no host, an endpoint that is not a host name or address, or settings
    llama.cpp refuses; CatalogError for an unknown device id.
    """
    if not hosts:
        raise EstimateError("An RPC plan needs at least one remote host (ggml-rpc-server).")
    for h in hosts:
        if not _ENDPOINT.match(h.address):
            raise EstimateError(f"'{h.address}' is not a host name or address.")
    if host_targets is not None and len(host_targets) != len(hosts):
        raise EstimateError("Describe every RPC host's device, or none.")
    link = link or NetworkLink()
    given: Sequence[Target | None] = host_targets if host_targets is not None else [None] * len(hosts)
    per_host = [_host_target(h, i, g) for i, (h, g) in enumerate(zip(hosts, given, strict=True))]
    cpu_hosts = [
        g.kind == "cpu" if g is not None else not find_device(h.device_id).is_gpu
        for h, g in zip(hosts, given, strict=True)
    ]
    remote = [t for ts in per_host for t in ts]
    local: list[Target] = []
    if client_gpu_id and client_gpu_count:
        gpu = find_device(client_gpu_id)
        if not gpu.is_gpu:
            raise EstimateError(f"{gpu.name} is not a GPU; the client's own devices must be GPUs.")
        base = target_from_device(gpu)
        local = [base.model_copy(update={"name": f"client GPU {i}"}) for i in range(client_gpu_count)]
    cpu = host_ram_target(client_ram_bytes).model_copy(update={"name": "client host memory"})
    targets = [*remote, *local, cpu]
    if settings.backend == "auto" and all(cpu_hosts) and not local:
        # CPU-only servers and client: the client offloads to RPC devices only (pipelined, no host
        # buffer type: app.core.memory.backends), every server runs ggml's CPU backend.
        settings = settings.model_copy(update={"backend": "rpc"})
    est = estimate(arch, tensors, settings, targets)
    out_dev = est.layer_devices[est.n_layer]
    devices = est.devices

    def part(name: str, endpoint: str, label: str, idx: list[int], command: str, capacity: int) -> RpcHostPlan:
        share = SplitDevice.of(name, [devices[i] for i in idx], out_dev in idx, capacity)
        return RpcHostPlan(share, endpoint, label, command)

    host_plans = []
    start = 0
    for i, (h, ts) in enumerate(zip(hosts, per_host, strict=True)):
        idx = list(range(start, start + len(ts)))
        start += len(ts)
        if given[i] is not None:
            label = h.device_id
        else:
            device = find_device(h.device_id)
            label = f"{h.count}x {device.name}" if device.is_gpu and h.count > 1 else device.name
        command = f"{RPC_SERVER_BINARY} -H {shell_quote(bind_address(h.address))} -p {h.port}"
        host_plans.append(part(f"host {i + 1}", h.endpoint, label, idx, command, sum(t.capacity_bytes for t in ts)))
    client_idx = list(range(start, len(devices)))
    client_label = (
        f"{client_gpu_count}x {find_device(client_gpu_id).name} + host memory"
        if local and client_gpu_id
        else "host memory only"
    )
    endpoints = ",".join(shell_quote(h.endpoint) for h in hosts)
    split = tensor_split([t.capacity_bytes for t in (*remote, *local)])
    command = (
        server_command(est, model_path, est.gpu_layers, arch.sliding_window is not None, tensor_split=split)
        + f" --rpc {endpoints}"
    )
    client = part("client", "", client_label, client_idx, command, sum(devices[i].capacity_bytes for i in client_idx))
    speed = estimate_speed(
        arch,
        tensors,
        est,
        targets,
        prompt_tokens=min(512, settings.context_tokens),
        depth_tokens=max(settings.context_tokens // max(settings.parallel_sequences, 1) // 2, 1),
        users=settings.parallel_sequences,
    )
    network = network_seconds_per_token(arch, est, hosts, per_host, link, settings.parallel_sequences)
    notes = (
        f"Each remote device costs {RPC_ROUND_TRIPS_PER_STEP} round trips per decode step (inputs, compute, "
        "result) plus the hidden state in and out; the logits cross too when the output layer is remote. "
        "An assumption, not a measurement.",
        f"Per host: the ggml-rpc-server process ({RPC_SERVER_OVERHEAD_BYTES // MIB} MiB assumed), plus the GPU "
        f"runtime ({GPU_RUNTIME_OVERHEAD_BYTES // MIB} MiB per GPU) on GPU hosts.",
        "RPC devices come first in llama.cpp's device list, then the client's GPUs: the first host holds the "
        "first layers, the client's last device the output layer.",
        f"Start {RPC_SERVER_BINARY} with -c to cache the weights on each host (later loads skip the network).",
        RPC_TRUST_NOTE,
    )
    return RpcPlan(
        model_name=arch.name,
        estimate=est,
        hosts=tuple(host_plans),
        client=client,
        link=link,
        decode_compute_tokens_per_s=speed.decode_typical,
        network_seconds_per_token=network,
        command=command,
        notes=notes,
        tensor_split=split,
    )


def network_seconds_per_token(
    arch: Architecture,
    est: Estimate,
    hosts: Sequence[RpcHost],
    per_host: Sequence[Sequence[Target]],
    link: NetworkLink,
    users: int,
) -> float:
    """Seconds the network adds to one decode step: for each remote device that holds layers,
    ``RPC_ROUND_TRIPS_PER_STEP`` round trips and the hidden state in and out (f32, one row per user);
    the logits (f32, n_vocab per user) when the output layer is on a remote device."""
    bytes_per_s = link.gbit_s * 1e9 / 8
    rtt = link.rtt_ms / 1000
    seconds = 0.0
    index = 0
    remote_devices = set()
    for ts in per_host:
        for _ in ts:
            if est.devices[index].layers or est.layer_devices[est.n_layer] == index:
                remote_devices.add(index)
                seconds += RPC_ROUND_TRIPS_PER_STEP * rtt + 2 * arch.n_embd * 4 * users / bytes_per_s
            index += 1
    if est.layer_devices[est.n_layer] in remote_devices:
        seconds += arch.n_vocab * 4 * users / bytes_per_s
    return seconds


def parse_host(text: str) -> RpcHost:
    """``HOST[:PORT]=DEVICE_ID[xN]`` (``10.0.0.2=rtx-4090x2``) as an RpcHost. Raises EstimateError."""
    where, sep, what = text.partition("=")
    if not sep or not where or not what:
        raise EstimateError(f"'{text}': write HOST[:PORT]=CATALOG_ID[xN], e.g. 10.0.0.2:50052=rtx-4090x2.")
    count = 1
    m = re.fullmatch(r"(.+?)x(\d+)", what)
    if m:
        what, count = m.group(1), int(m.group(2))
    address, port = where, DEFAULT_RPC_PORT
    if where.count(":") == 1:
        address, _, p = where.partition(":")
        if not p.isdigit():
            raise EstimateError(f"'{where}': the port must be a number.")
        port = int(p)
    try:
        return RpcHost(address=address, port=port, device_id=what, count=count)
    except ValueError as exc:
        raise EstimateError(f"'{text}': {exc}") from None


@dataclass(frozen=True)
class RpcBufferCheck:
    """One buffer llama.cpp printed for one device of an RPC run, beside the plan's figure."""

    device: str
    """As llama.cpp prints it: ``RPC0[127.0.0.1:50052]``, or ``client`` for the client's own buffers."""
    buffer: str  # "weights", "kv_cache", "compute"
    measured_bytes: int
    planned_bytes: int

    @property
    def difference_bytes(self) -> int:
        return self.measured_bytes - self.planned_bytes

    @property
    def agrees(self) -> bool:
        """Equal to llama.cpp's printed precision (±0.005 MiB)."""
        return abs(self.difference_bytes) <= PRINT_PRECISION_BYTES

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "buffer": self.buffer,
            "measured_bytes": self.measured_bytes,
            "planned_bytes": self.planned_bytes,
            "difference_bytes": self.difference_bytes,
            "agrees": self.agrees,
        }


def rpc_buffer_checks(plan: RpcPlan, buffers: MeasuredBuffers) -> list[RpcBufferCheck]:
    """Each host's model, KV and compute buffers as llama.cpp printed them (named ``...[HOST:PORT]``)
    against ``plan``; then the client's (every buffer without an endpoint in its name; its compute
    includes the logits' output buffer, as the plan counts it). A host the run printed nothing
    for shows 0 measured."""

    def of(d: dict[str, int], mine: Any) -> int:
        return sum(v for k, v in d.items() if mine(k))

    checks: list[RpcBufferCheck] = []
    for h in plan.hosts:
        suffix = f"[{h.endpoint}]"

        def mine(k: str, suffix: str = suffix) -> bool:
            return k.endswith(suffix)

        names = [k for d in (buffers.model_buffers, buffers.kv_buffers, buffers.compute_buffers) for k in d if mine(k)]
        device = names[0] if names else f"RPC{suffix}"
        checks += [
            RpcBufferCheck(device, "weights", of(buffers.model_buffers, mine), h.weights_bytes),
            RpcBufferCheck(
                device, "kv_cache", of(buffers.kv_buffers, mine) + of(buffers.rs_buffers, mine), h.kv_cache_bytes
            ),
            RpcBufferCheck(
                device, "compute", of(buffers.compute_buffers, mine) + of(buffers.output_buffers, mine), h.compute_bytes
            ),
        ]

    def local(k: str) -> bool:
        return not k.endswith("]")

    c = plan.client
    checks += [
        RpcBufferCheck("client", "weights", of(buffers.model_buffers, local), c.weights_bytes),
        RpcBufferCheck(
            "client", "kv_cache", of(buffers.kv_buffers, local) + of(buffers.rs_buffers, local), c.kv_cache_bytes
        ),
        RpcBufferCheck(
            "client", "compute", of(buffers.compute_buffers, local) + of(buffers.output_buffers, local), c.compute_bytes
        ),
    ]
    return checks


def cpu_servers_plan(
    arch: Architecture,
    tensors: Sequence[TensorInfo],
    settings: Settings,
    endpoints: Sequence[str],
    server: Target,
    client_ram_bytes: int,
    *,
    shared_memory: bool,
    model_path: str = MODEL_PLACEHOLDER,
) -> RpcPlan:
    """The plan for RPC servers at ``endpoints`` (``HOST:PORT``) that each serve one CPU like
    ``server`` (FitScope's own servers, or remote ones whose hardware is unknown), split evenly;
    ``shared_memory``: the servers run on one machine and share ``server``'s memory.

    Raises EstimateError as :func:`rpc_plan` does, and for an endpoint that is not HOST:PORT.
    """
    hosts = []
    for e in endpoints:
        address, sep, port = e.rpartition(":")
        if not sep or not port.isdigit():
            raise EstimateError(f"'{e}' is not HOST:PORT.")
        hosts.append(RpcHost(address=address.strip("[]"), port=int(port), device_id="CPU (RPC server)"))
    capacity = server.capacity_bytes // max(len(hosts), 1) if shared_memory else server.capacity_bytes
    share = server.model_copy(update={"capacity_bytes": capacity, "name": "CPU"})
    return rpc_plan(
        arch,
        tensors,
        settings,
        hosts,
        client_ram_bytes,
        model_path=model_path,
        host_targets=[share] * len(hosts),
    )
