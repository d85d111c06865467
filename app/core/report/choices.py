"""What the user chose, worked out without Qt: the hardware (this machine or a catalog device), the
model (the demo, a catalog entry, a GGUF file, a config.json, or a GGUF on the Hugging Face Hub or in
Ollama's library), the controls named for people, and what was detected here. ``resolve_targets``
turns a hardware choice into the estimator's devices, ``load_model`` a model choice into a model:
the one way for the window, the advisor and the CLI's local hardware.

A model on a server is read over the network, which the core does not do: ``load_model`` takes the
reader as an argument (``remote``, in practice ``app.services.remote.load_remote_model``), passed
in by whoever runs it (the window's estimate worker, the CLI). A plain function rather than a
registry, so that it travels to the estimate worker process with the request and nothing is set up
behind anyone's back; without it a remote choice is refused with a sentence."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from app.core.common.errors import EstimateError, FitScopeError
from app.core.common.units import GIB, Frozen
from app.core.hardware.devices import DeviceSpec
from app.core.hardware.host_memory import parse_pcie
from app.core.hardware.snapshots import GpuSnapshot, HostSnapshot
from app.core.memory.consumers import ollama_batch_tokens
from app.core.memory.records import MAX_CONTEXT_TOKENS, GpuLayers, RepackProfile, Settings, SpeculativeSpec, Target
from app.core.memory.targets import (
    cpu_target,
    host_ram_beside,
    host_ram_target,
    repack_of_device,
    repack_profile,
    target_from_device,
    target_from_gpu,
)
from app.core.model.catalog import find_device, find_projector, load_devices
from app.core.model.projector import ProjectorSpec
from app.core.model.source import ModelSource, model_from_catalog, model_from_gguf, model_from_hf_config

MIN_CONTEXT_TOKENS = 512
MAX_USERS = 64
DEMO_CATALOG_ID = "gemma-3-270m"  # the built-in demo file's model in the catalog (its size, its score)


class HardwareChoice(Frozen):
    """Where the model should run: this machine (its GPUs, or its CPU only) or a catalog device."""

    kind: Literal["local", "cpu", "catalog"] = "local"
    device_id: str | None = None
    count: int = Field(default=1, ge=1, le=8)
    host_ram_gib: float | None = Field(
        default=None, gt=0, le=65536, description="host memory beside catalog GPUs; None: this machine's"
    )
    host_memory: str | None = Field(
        default=None,
        description="catalog GPUs' host RAM as ``parse_host_memory`` reads it (a preset, or e.g. 'ddr4-2666-2ch'); "
        "None: dual-channel DDR5",
    )
    host_cores: int | None = Field(
        default=None, ge=1, le=1024, description="physical cores of the CPU beside catalog GPUs; None: by host_memory"
    )
    pcie: str | None = Field(
        default=None, description="the GPUs' PCIe link as 'GENxLANES' (a PCIE_CHOICES entry); None: as sold or detected"
    )

    def label(self, machine: Machine | None = None) -> str:
        if self.kind == "cpu":
            return "This machine's CPU"
        if self.kind == "local":
            if machine is not None and machine.gpus:
                names = {g.name for g in machine.gpus}
                one = names.pop() if len(names) == 1 else "GPUs"
                return (
                    f"This machine ({len(machine.gpus)}x {one})" if len(machine.gpus) > 1 else f"This machine ({one})"
                )
            return "This machine"
        device = find_device(self.device_id or "")
        return f"{self.count}x {device.name}" if self.count > 1 else device.name


class ModelChoice(Frozen):
    """The model: the built-in demo, a catalog entry (quantized with ``quant``), a GGUF file, a
    Hugging Face config.json (quantized with ``quant``), or a GGUF on a server: ``hf`` (``ref`` is
    ORG/REPO/path/file.gguf, ``revision`` its commit) or ``ollama`` (``ref`` is NAMESPACE/MODEL:TAG,
    ``revision`` the model blob's digest). A remote choice with a revision names bytes that never
    change, so its header, once fetched, is read from the cache."""

    kind: Literal["demo", "catalog", "gguf", "hf_config", "hf", "ollama"] = "demo"
    ref: str = ""
    quant: str = "Q4_K_M"
    revision: str = ""


RemoteLoader = Callable[[ModelChoice], ModelSource]
REMOTE_KINDS = ("hf", "ollama")


def catalog_projector(choice: ModelChoice) -> ProjectorSpec | None:
    """The vision projector a catalog model is served with (llama-server --mmproj); None for a
    text-only model, and for the demo, a file or a config.json (their projector is chosen)."""
    if choice.kind != "catalog":
        return None
    entry = find_projector(choice.ref)
    return entry.spec() if entry is not None else None


class Controls(Frozen):
    """What the user chooses, named for people, and llama.cpp's flags behind it.

    ``context_per_user_tokens`` is what each of ``users`` gets; llama.cpp's ``-c``
    (:attr:`Settings.context_tokens <app.core.memory.records.Settings.context_tokens>`) is their
    product, shared by its ``-np`` slots. ``gpu_layers`` is llama.cpp's ``-ngl`` ("auto": as its
    ``--fit`` places the model, keeping ``fit_margin_mib`` free per GPU). ``n_cpu_moe`` None is
    "auto" too: experts stay where the placement puts them. The window leaves batch sizes, the
    unified KV cache and the SWA cache at llama.cpp's defaults; the command line sets them.
    """

    context_per_user_tokens: int = Field(default=4096, ge=1, le=MAX_CONTEXT_TOKENS)
    users: int = Field(default=1, ge=1, le=MAX_USERS)
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: bool = True
    gpu_layers: GpuLayers = "auto"
    n_cpu_moe: int | None = Field(default=None, ge=0, description="experts of the first N layers in RAM; None: auto")
    backend: str = Field(default="auto", description="the llama.cpp build; auto: by the hardware")
    consumer: str = "llama-server"
    mmap: bool = True
    projector: ProjectorSpec | None = Field(
        default=None, description="the vision projector loaded beside the model (--mmproj); None: text only"
    )
    mmproj_offload: bool = Field(default=True, description="False: --no-mmproj-offload")
    batch_tokens: int | None = Field(default=None, ge=1, le=1 << 20, description="-b; None: the program's default")
    ubatch_tokens: int | None = Field(default=None, ge=1, le=1 << 20, description="-ub; None: the program's default")
    kv_unified: bool = False
    swa_full: bool | None = Field(default=None, description="None: the program's default (llama-server: no)")
    fit_margin_mib: int = Field(default=1024, ge=0, le=1 << 20, description="--fit-target: MiB kept free per GPU")
    threads: int | None = Field(default=None, ge=1, le=4096, description="-t: CPU threads; None: the physical cores")
    speculative: SpeculativeSpec | None = Field(
        default=None, description="speculative decoding: the model's MTP head or a draft model (-md); None: off"
    )

    @property
    def n_ctx_tokens(self) -> int:
        """llama.cpp's ``-c``: every user's context together."""
        return self.context_per_user_tokens * self.users

    def settings(self, repack: str = "x86-avx2", gpu_layers: GpuLayers = "all") -> Settings:
        """llama.cpp's settings for these controls, with ``gpu_layers`` placed (never "auto").
        Raises EstimateError for values it refuses."""
        total = self.n_ctx_tokens
        if total > MAX_CONTEXT_TOKENS:
            raise EstimateError(
                f"{self.users} users x {self.context_per_user_tokens:,} tokens is a llama.cpp context of "
                f"{total:,} tokens, beyond the {MAX_CONTEXT_TOKENS:,} FitScope estimates; lower the context or "
                "the users."
            )
        try:
            # Ollama passes llama-server one size for both, chosen by the context (memory.consumers).
            batch = ollama_batch_tokens(total) if self.consumer == "ollama" else None
            return Settings(
                context_tokens=total,
                batch_tokens=self.batch_tokens or batch or 2048,
                ubatch_tokens=self.ubatch_tokens or batch or 512,
                parallel_sequences=self.users,
                kv_unified=self.kv_unified,
                cache_type_k=self.cache_type_k,
                cache_type_v=self.cache_type_v,
                flash_attn=self.flash_attn,
                gpu_layers=gpu_layers,
                repack=repack,  # type: ignore[arg-type]
                backend=self.backend,  # type: ignore[arg-type]
                consumer=self.consumer,  # type: ignore[arg-type]
                # llama-server (and Ollama, which runs it) defaults to a window-sized SWA cache,
                # llama-cpp-python to a full one.
                swa_full=self.swa_full if self.swa_full is not None else self.consumer == "llama-cpp-python",
                mmap=self.mmap,
                n_cpu_moe=self.n_cpu_moe or 0,
                mmproj=self.projector,
                mmproj_offload=self.mmproj_offload,
                threads=self.threads,
                speculative=self.speculative,
            )
        except ValidationError as exc:
            raise EstimateError(exc.errors()[0]["msg"]) from None


@dataclass(frozen=True)
class Machine:
    """What was detected here: the GPUs of every vendor (empty when none was found, with the reason
    in ``gpu_message``) and the host."""

    gpus: tuple[GpuSnapshot, ...] = ()
    host: HostSnapshot | None = None
    gpu_message: str = ""


# -- hardware ------------------------------------------------------------------------------------


# Words every vendor's driver adds or leaves out ("Intel(R) Arc(TM) B580 Graphics", "AMD Radeon RX
# 7900 XTX", "NVIDIA GeForce RTX 4090"), bracketed text and memory sizes.
_NAME_NOISE = re.compile(r"\(.*?\)|\b(?:nvidia|geforce|tesla|amd|intel|graphics)\b|\b\d+\s*gb\b")


def _name_tokens(name: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", _NAME_NOISE.sub(" ", name.lower()))


def _token_matches(wanted: str, tokens: list[str]) -> bool:
    # A word may carry a generation digit ("sxm" matches NVML's "sxm4"); a model number must match
    # exactly ("l4" is not "l40", "l40" is not "l40s").
    if not wanted.isalpha():
        return wanted in tokens
    return any(t == wanted or (t.startswith(wanted) and t[len(wanted) :].isdigit()) for t in tokens)


# Words that make another chip of the same number: "Apple M3 Max" is not the M3, "RTX 4070 Super"
# not the 4070. A form factor ("SXM4", "PCIe") or a memory type does not.
_TIER_WORDS = frozenset({"max", "pro", "ultra", "ti", "super", "xt", "xtx", "gre"})


def _name_score(wanted: list[str], tokens: list[str]) -> tuple[bool, int, int] | None:
    """(every word found, minus the tier words of the detected name left unexplained, words found),
    or None when the model number (the first word with a digit) is missing."""
    number = next((w for w in wanted if any(c.isdigit() for c in w)), None)
    if number is None or not _token_matches(number, tokens):
        return None
    matched = sum(_token_matches(w, tokens) for w in wanted)
    unexplained = sum(t in _TIER_WORDS and t not in wanted for t in tokens)
    return matched == len(wanted), -unexplained, matched


def match_catalog_device(
    gpu_name: str, memory_bytes: int | None = None, vendor: str = "nvidia", gpu_cores: int | None = None
) -> DeviceSpec | None:
    """The catalog GPU of ``vendor`` for a name as its driver reports it ("NVIDIA GeForce RTX 4060
    Ti", "NVIDIA A100-SXM4-80GB", "AMD Radeon RX 7900 XTX", "Apple M3 Max", "Intel Arc B580"), or
    None. Every word of the catalog name (or of one of its ``aliases``; memory sizes aside) should
    appear in the driver's; the model number must. Ties go to the entry with the same GPU core count
    ("Apple M4 Max (40-core GPU)": a 48 GB M4 Max has the 40-core chip), then to the closest memory
    size (4060 Ti 8/16 GB, M3 Max 64/128 GB)."""
    tokens = _name_tokens(gpu_name)
    best: tuple[tuple[bool, int, bool, int, int], DeviceSpec] | None = None
    for d in load_devices():
        if d.vendor != vendor or not d.is_gpu:
            continue
        scores = [s for s in (_name_score(_name_tokens(n), tokens) for n in (d.name, *d.aliases)) if s is not None]
        if not scores:
            continue
        complete, tiers, matched = max(scores)
        # Memory in 4 GiB steps: drivers report a little less than the box says.
        gap = round(abs(d.memory_gib * GIB - memory_bytes) / (4 * GIB)) if memory_bytes else 0
        cores = bool(gpu_cores) and f"({gpu_cores}-core" in d.name
        score = (complete, tiers, cores, -gap, matched)
        if best is None or score > best[0]:
            best = (score, d)
    return best[1] if best else None


def catalog_entry(gpu: GpuSnapshot) -> DeviceSpec | None:
    """The catalog entry of a detected GPU: the one its detector matched, else by its name and
    memory (a unified-memory GPU by the size of its pool, as the catalog lists it)."""
    if gpu.catalog_id:
        return find_device(gpu.catalog_id)
    memory = gpu.shared_memory_bytes or gpu.memory_total_bytes
    return match_catalog_device(gpu.name, memory, gpu.vendor, gpu.compute_units if gpu.vendor == "apple" else None)


def resolve_targets(choice: HardwareChoice, machine: Machine, backend: str = "auto") -> list[Target]:
    """The estimator's targets for a hardware choice; this machine's GPUs as llama.cpp build
    ``backend`` sees them ("auto": each vendor's default). Beside a GPU that takes its memory from
    the system RAM (Apple, an AMD APU), host RAM is what the GPU leaves. Raises CatalogError for an
    unknown device."""
    host = machine.host
    if choice.kind == "cpu" or (choice.kind == "local" and not machine.gpus):
        return [cpu_target(host)]
    if choice.kind == "local":
        gpus = [target_from_gpu(g, catalog_entry(g), backend) for g in machine.gpus]
        ram = host.ram_total_bytes if host else 16 * GIB
        ram = max(0, ram - sum(g.taken_from_ram_bytes(backend) for g in machine.gpus))
        link = _link(choice)
        if link:
            gpus = [
                g.model_copy(update={"pcie_gen": link[0], "pcie_lanes": link[1], "pcie_stated": True}) for g in gpus
            ]
        return [*gpus, host_ram_target(ram, host.measured_read_bandwidth_gb_s if host else None, host=host)]
    device = find_device(choice.device_id or "")
    base = target_from_device(device, _link(choice))
    if not device.is_gpu:
        return [base]
    gpus = [
        base.model_copy(update={"name": f"{base.name} #{i + 1}"}) if choice.count > 1 else base
        for i in range(choice.count)
    ]
    host_bytes = host_ram_beside(
        device,
        int(choice.host_ram_gib * GIB) if choice.host_ram_gib is not None else None,
        host.ram_total_bytes if host else 64 * GIB,
    )
    try:
        host_target = host_ram_target(host_bytes, host_memory=choice.host_memory, cores=choice.host_cores)
    except ValueError as exc:  # memory parse_host_memory cannot read (an edited settings file)
        raise EstimateError(str(exc)) from None
    return [*gpus, host_target]


def _link(choice: HardwareChoice) -> tuple[int, int] | None:
    """The PCIe link a choice names, or None (as the card is sold, or as NVML reports it)."""
    if not choice.pcie:
        return None
    try:
        return parse_pcie(choice.pcie)
    except ValueError as exc:
        raise EstimateError(str(exc)) from None


def repack_for(choice: HardwareChoice, machine: Machine) -> RepackProfile:
    """The CPU repacking rules of the machine a choice names: this machine's own CPU for "local" and
    "cpu", the catalog machine's for a catalog choice (never the CPU FitScope happens to run on)."""
    if choice.kind != "catalog":
        return repack_profile(machine.host)
    return repack_of_device(find_device(choice.device_id or ""))


def load_model(
    choice: ModelChoice, demo_path: str | Path | None = None, remote: RemoteLoader | None = None
) -> ModelSource:
    """The model a choice names: a catalog entry at its quantization, a config.json, a GGUF file,
    the demo model (at ``demo_path``) or a GGUF on a server (read by ``remote``). Raises
    ModelFileError / CatalogError / EstimateError, or FitScopeError from ``remote``."""
    if choice.kind in REMOTE_KINDS:
        if remote is None:
            raise FitScopeError(f"{choice.ref} is on a server, and this part of FitScope does not read servers.")
        return remote(choice)
    if choice.kind == "catalog":
        return model_from_catalog(choice.ref, choice.quant)
    if choice.kind == "hf_config":
        return model_from_hf_config(choice.ref, choice.quant)
    path = choice.ref if choice.kind == "gguf" else (demo_path or choice.ref)
    if not path:
        raise FitScopeError("The demo model is not available; pick a catalog model or open a GGUF file.")
    return model_from_gguf(path)
