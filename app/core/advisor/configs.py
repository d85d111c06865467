"""What the hardware advisor sweeps: the machines it can build from the catalog, and the model's presets.

Machines: boxes of 1-8 identical GPUs on a host platform (:data:`PLATFORMS`: a desktop for 1-2
GPUs, a workstation for 3-4, a server for 5-8, each with its CPU, host memory type, RAM sizes and a
round price for the rest), and the machines with one memory (Apple machines, unified-memory boxes,
CPU servers): :func:`catalog_machines`.

Prices: :func:`machine_price` is the one whole-computer price of a catalog machine, on the basis
every screen uses (the compare table, the hardware lists, "Estimate for", the advisor): a GPU's
catalog price is the card's, so a GPU box adds the platform around it; an Apple machine or a
unified-memory box is priced whole; a CPU server adds its board, power, case, disk and RAM.

Presets: every llama.cpp preset whose published quality loss meets the workload's floor
(:func:`presets_for`), or the ones asked for, each as a :class:`Variant` of the model with the byte
sums the sweep's bounds need. A preset no smaller than another that loses more quality is left out.
The tensor layout of each preset is computed once per model and kept here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from app.core.advisor.records import QUALITY_FLOORS, QualityFloor, Workload, format_usd
from app.core.common.errors import EstimateError, FitScopeError
from app.core.common.units import GIB
from app.core.hardware.devices import DeviceSpec
from app.core.memory.layers import tensor_totals
from app.core.model.architecture import Architecture
from app.core.model.catalog import find_device, find_model, load_devices
from app.core.model.hf_config import read_hf_config
from app.core.model.quant import PRESETS, QuantPreset, find_preset, quantize_layout
from app.core.model.source import model_from_gguf
from app.core.model.tensors import TensorInfo
from app.core.report.machine_text import short_device_name

OS_RESERVE_BYTES = 4 * GIB  # host RAM left to the operating system when choosing a RAM size
RAM_USD_PER_GIB = 4.0  # DDR5 at a round 2025 street price; an assumption, shown with the answer


@dataclass(frozen=True)
class HostPlatform:
    """The computer around the GPUs: its CPU (a catalog entry), memory channels and RAM sizes, and a
    round price for everything else (board, power supply, case, disk)."""

    key: str
    label: str
    cpu_id: str
    host_memory: str
    max_gpus: int
    ram_options_gib: tuple[int, ...]
    base_usd: float

    def price_usd(self, ram_gib: float) -> float:
        return self.cpu_price_usd + self.base_usd + ram_gib * RAM_USD_PER_GIB

    @cached_property
    def cpu_price_usd(self) -> float:
        return find_device(self.cpu_id).price_usd or 0.0

    @cached_property
    def cpu_name(self) -> str:
        return find_device(self.cpu_id).name.split(" (")[0]


PLATFORMS: tuple[HostPlatform, ...] = (
    HostPlatform("desktop", "desktop", "ryzen-9-9950x", "ddr5-5600-2ch", 2, (64, 128, 192), 1000.0),
    HostPlatform("workstation", "workstation", "threadripper-7980x", "ddr5-6400-4ch", 4, (128, 256, 512), 2500.0),
    HostPlatform("server", "server", "epyc-9655", "ddr5-6000-12ch", 8, (256, 512, 768), 6000.0),
)


@dataclass(frozen=True)
class MachinePrice:
    """A catalog machine's whole-computer price in US dollars (None: no list price) and what it
    is made of: ``parts_usd`` the catalog's own price (the GPU cards, the CPU, or the whole
    computer), ``rest_usd`` what FitScope assumes for the rest of the machine, ``note`` both in
    words (for a tooltip or the details)."""

    total_usd: float | None
    parts_usd: float | None
    rest_usd: float
    kind: str  # "PC", "workstation", "server" (by the platform around the GPUs or the CPU), "computer"
    note: str

    @property
    def short(self) -> str:
        """"$3,655 PC", "$3,499 computer", "no list price"."""
        if self.total_usd is None:
            return "no list price"
        return f"{format_usd(self.total_usd)} {self.kind}"



_BOX_KINDS = {"desktop": "PC", "workstation": "workstation", "server": "server"}


def machine_price(device: DeviceSpec, count: int = 1, ram_gib: float | None = None) -> MachinePrice:
    """The whole-computer price of ``count`` x ``device`` (see the module docstring); ``ram_gib``
    is a GPU box's host RAM (None: its platform's smallest size)."""
    if device.is_gpu and device.memory_kind == "dedicated":
        platform = platform_for_gpus(count)
        ram = ram_gib if ram_gib is not None else float(platform.ram_options_gib[0])
        rest = platform.price_usd(ram)
        kind = _BOX_KINDS[platform.key]
        if not device.price_usd:
            return MachinePrice(None, None, rest, kind, "no list price for this GPU in the catalog")
        cards = device.price_usd * count
        what = f"{count} x {format_usd(device.price_usd)} GPU cards" if count > 1 else f"the {format_usd(cards)} card"
        return MachinePrice(
            cards + rest,
            cards,
            rest,
            kind,
            f"{what} + {format_usd(rest)} for the {platform.label} around {'them' if count > 1 else 'it'} "
            f"({platform.cpu_name}, {ram:g} GiB RAM, board, power supply, case and disk; assumed)",
        )
    if device.is_gpu:
        price = device.price_usd
        note = "the whole computer (catalog list price)" if price else "no list price in the catalog"
        return MachinePrice(price, price, 0.0, "computer", note)
    platform = platform_for_cpu(device)
    rest = platform.base_usd + device.memory_gib * RAM_USD_PER_GIB
    kind = _BOX_KINDS[platform.key]
    if not device.price_usd:
        return MachinePrice(None, None, rest, kind, "no list price in the catalog")
    return MachinePrice(
        device.price_usd + rest,
        device.price_usd,
        rest,
        kind,
        f"{format_usd(device.price_usd)} CPU + {format_usd(rest)} for the board, power, case, disk and "
        f"{device.memory_gib:g} GiB RAM (assumed)",
    )


def machine_name(device: DeviceSpec, count: int = 1) -> str:
    """The machine in a few words, as a buyer says it: "RTX 5090 PC", "2x RTX 3090 PC", "M4 Max
    computer with 128 GiB", "EPYC 9655 server"."""
    short = short_device_name(device.name)
    kind = machine_price(device, count).kind
    if device.is_gpu and device.memory_kind != "dedicated":
        return f"{short} computer with {device.memory_gib:g} GiB"
    return f"{count}x {short} {kind}" if count > 1 else f"{short} {kind}"


def platform_for_gpus(count: int) -> HostPlatform:
    """The smallest platform that takes ``count`` GPUs."""
    return next(p for p in PLATFORMS if count <= p.max_gpus)


def platform_for_cpu(device: DeviceSpec) -> HostPlatform:
    """The platform a CPU server is priced as: the one built on that CPU, else the smallest whose
    largest RAM size holds the server's memory."""
    same = next((p for p in PLATFORMS if p.cpu_id == device.id), None)
    if same is not None:
        return same
    return next((p for p in PLATFORMS if device.memory_gib <= p.ram_options_gib[-1]), PLATFORMS[-1])


# -- the model and its presets ---------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """The model at one preset, with the byte sums the sweep's bounds read (bytes; per token where
    said)."""

    preset: str
    ppl_increase: float | None
    tensors: tuple[TensorInfo, ...]
    weights_bytes: int  # loaded: every tensor but unloaded NextN layers
    layer_bytes: int  # what full offload puts on the GPUs (the input embedding stays in host memory)
    active_bytes: float  # read per decoded token
    expert_bytes: int
    active_expert_bytes: float
    active_params: float


_LAYOUTS: dict[tuple[int, str], tuple[Architecture, tuple[TensorInfo, ...]]] = {}
_ARCHS: dict[tuple[str, str, float], Architecture] = {}


def preset_layout(arch: Architecture, preset: QuantPreset) -> tuple[TensorInfo, ...]:
    """The tensors of ``arch`` at ``preset``, computed once per model and preset (the last 256 kept)."""
    key = (id(arch), preset.name)
    hit = _LAYOUTS.get(key)
    if hit is not None and hit[0] is arch:
        return hit[1]
    tensors = tuple(quantize_layout(arch, preset))
    if len(_LAYOUTS) >= 256:
        _LAYOUTS.pop(next(iter(_LAYOUTS)))
    _LAYOUTS[key] = (arch, tensors)
    return tensors


def variant_of(arch: Architecture, preset: str, ppl: float | None, tensors: tuple[TensorInfo, ...]) -> Variant:
    """The variant of ``arch`` stored as ``tensors`` (at ``preset``, with published loss ``ppl``)."""
    t = tensor_totals(arch, tensors)
    loaded = t.model_bytes - t.unloaded_bytes
    return Variant(
        preset=preset,
        ppl_increase=ppl,
        tensors=tensors,
        weights_bytes=loaded,
        layer_bytes=loaded - t.input_bytes,
        active_bytes=sum(t.active_layer_bytes),
        expert_bytes=sum(t.expert_bytes),
        active_expert_bytes=sum(t.active_expert_bytes),
        active_params=t.active_params,
    )


def presets_for(arch: Architecture, floor: QualityFloor) -> list[QuantPreset]:
    """The llama.cpp presets whose published quality loss meets ``floor`` (BF16 left out: the same
    bytes as F16; F32 left out; presets without a published loss left out; MXFP4_MOE only for models
    released in MXFP4, whatever the floor)."""
    limit = QUALITY_FLOORS[floor][1]
    out = []
    for p in PRESETS:
        if p.name in ("F32", "BF16"):
            continue
        if p.name == "MXFP4_MOE":
            if arch.native_expert_type == "MXFP4":
                out.append(p)
            continue
        if p.ppl_increase is None:
            continue  # no published loss to hold to a floor (the IQ presets): named with quants only
        if p.ppl_increase <= limit:
            out.append(p)
    return out


def load_variants(workload: Workload) -> tuple[Architecture, str, str, list[Variant]]:
    """The architecture, its label, the model path for commands, and a variant per preset."""
    choice = workload.model
    if choice.kind == "gguf":
        source = model_from_gguf(choice.ref)
        arch = source.arch
        variants = [variant_of(arch, source.quant, _ppl(source.quant), source.tensors)]
        if workload.quants:
            variants = [
                variant_of(arch, p.name, p.ppl_increase, preset_layout(arch, p))
                for p in map(find_preset, workload.quants)
            ]
        return arch, source.label, str(choice.ref), variants
    if choice.kind == "catalog":
        arch = find_model(choice.ref)
        path = ""
    elif choice.kind == "hf_config":
        from pathlib import Path

        p = Path(choice.ref)
        key = (choice.kind, str(p), p.stat().st_mtime if p.exists() else 0.0)
        cached = _ARCHS.get(key)
        arch = cached if cached is not None else read_hf_config(p)
        _ARCHS[key] = arch
        path = ""
    else:
        raise FitScopeError("The advisor needs a catalog model, a GGUF file or a config.json.")
    presets = (
        [find_preset(q) for q in workload.quants] if workload.quants else presets_for(arch, workload.quality_floor)
    )
    if not presets:
        raise FitScopeError("No quantization preset meets that quality floor.")
    variants = [variant_of(arch, p.name, p.ppl_increase, preset_layout(arch, p)) for p in presets]
    return arch, arch.name, path, variants if workload.quants else undominated(variants)


def undominated(variants: list[Variant]) -> list[Variant]:
    """The presets worth trying: one that is no smaller than another and loses more quality is never
    the better choice (memory and decode speed both follow the bytes)."""

    def loss(v: Variant) -> float:
        return v.ppl_increase if v.ppl_increase is not None else math.inf

    return [
        v
        for v in variants
        if v.preset == "MXFP4_MOE"  # the released format of the models offered it
        or not any(u is not v and u.weights_bytes <= v.weights_bytes and loss(u) < loss(v) for u in variants)
    ]


def _ppl(quant: str) -> float | None:
    try:
        return find_preset(quant).ppl_increase
    except EstimateError:
        return None


# -- the machines ------------------------------------------------------------------------------------


def catalog_machines(max_gpus: int) -> tuple[list[tuple[DeviceSpec, int]], list[DeviceSpec]]:
    """What the sweep evaluates, in catalog order: boxes of 1 to ``max_gpus`` of every GPU with its
    own memory, as (GPU, count); and every machine with one memory (Apple machines, unified-memory
    boxes, CPU servers)."""
    devices = [d for d in load_devices()]
    boxes = [(d, n) for d in devices if d.is_gpu and d.memory_kind == "dedicated" for n in range(1, max_gpus + 1)]
    singles = [d for d in devices if not (d.is_gpu and d.memory_kind == "dedicated")]
    return boxes, singles
