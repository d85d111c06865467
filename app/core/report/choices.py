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
from app.core.hardware.snapshots import GpuSnapshot, HostSnapshot
from app.core.memory.consumers import ollama_batch_tokens
from app.core.memory.records import MAX_CONTEXT_TOKENS, Settings, Target
from app.core.memory.targets import cpu_target, host_ram_beside, host_ram_target, target_from_device, target_from_gpu
from app.core.model.catalog import find_device, find_projector, load_devices
from app.core.model.projector import ProjectorSpec
from app.core.model.source import ModelSource, model_from_catalog, model_from_gguf, model_from_hf_config

MIN_CONTEXT_TOKENS = 512
MAX_USERS = 64


class HardwareChoice(Frozen):
    """Where the model should run: this machine (its GPUs, or its CPU only) or a catalog device."""

    kind: Literal["local", "cpu", "catalog"] = "local"
    device_id: str | None = None
    count: int = Field(default=1, ge=1, le=8)
    host_ram_gib: float | None = Field(
        default=None, gt=0, le=65536, description="host memory beside catalog GPUs; None: this machine's"
    )
    host_memory: str | None = Field(
        default=None, description="a HOST_MEMORY key for catalog GPUs' host RAM; None: dual-channel DDR5"
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
    """The knobs, named for people: ``context_tokens`` is what each user gets; llama.cpp's ``-c`` is
    that times ``users`` (its ``-np`` slots). ``gpu_layers=None`` means "auto": the most that fit."""

    context_tokens: int = Field(default=4096, ge=1, le=MAX_CONTEXT_TOKENS)
    users: int = Field(default=1, ge=1, le=MAX_USERS)
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: bool = True
    gpu_layers: int | None = Field(default=None, ge=0)
    n_cpu_moe: int | None = Field(default=None, ge=0, description="experts of the first N layers in RAM; None: auto")
    backend: str = Field(default="auto", description="the llama.cpp build; auto: by the hardware")
    consumer: str = "llama-server"
    mmap: bool = True
    projector: ProjectorSpec | None = Field(
        default=None, description="the vision projector loaded beside the model (--mmproj); None: text only"
    )

    def settings(self, repack: str = "x86-avx2", gpu_layers: int | None = None) -> Settings:
        """llama.cpp's settings for these controls. Raises EstimateError for values it refuses."""
        total = self.context_tokens * self.users
        if total > MAX_CONTEXT_TOKENS:
            raise EstimateError(
                f"{self.users} users x {self.context_tokens:,} tokens is a llama.cpp context of {total:,} tokens, "
                f"beyond the {MAX_CONTEXT_TOKENS:,} FitScope estimates; lower the context or the users."
            )
        try:
            # Ollama passes llama-server one size for both, chosen by the context (memory.consumers).
            batch = ollama_batch_tokens(total) if self.consumer == "ollama" else None
            return Settings(
                context_tokens=total,
                parallel_sequences=self.users,
                batch_tokens=batch or 2048,
                ubatch_tokens=batch or 512,
                cache_type_k=self.cache_type_k,
                cache_type_v=self.cache_type_v,
                flash_attn=self.flash_attn,
                gpu_layers=gpu_layers,
                repack=repack,  # type: ignore[arg-type]
                backend=self.backend,  # type: ignore[arg-type]
                consumer=self.consumer,  # type: ignore[arg-type]
                # llama-server (and Ollama, which runs it) defaults to a window-sized SWA cache,
                # llama-cpp-python to a full one.
                swa_full=self.consumer == "llama-cpp-python",
                mmap=self.mmap,
                n_cpu_moe=self.n_cpu_moe or 0,
                mmproj=self.projector,
            )
        except ValidationError as exc:
            raise EstimateError(exc.errors()[0]["msg"]) from None


@dataclass(frozen=True)
class Machine:
    """What was detected here: NVIDIA GPUs (empty without a driver) and the host."""

    gpus: tuple[GpuSnapshot, ...] = ()
    host: HostSnapshot | None = None
    gpu_message: str = ""


# -- hardware ------------------------------------------------------------------------------------


_NAME_NOISE = re.compile(r"\(.*?\)|\bnvidia\b|\bgeforce\b|\btesla\b|\b\d+\s*gb\b")


def _name_tokens(name: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", _NAME_NOISE.sub(" ", name.lower()))


def _token_matches(wanted: str, tokens: list[str]) -> bool:
    # A word may carry a generation digit ("sxm" matches NVML's "sxm4"); a model number must match
    # exactly ("l4" is not "l40", "l40" is not "l40s").
    if not wanted.isalpha():
        return wanted in tokens
    return any(t == wanted or (t.startswith(wanted) and t[len(wanted) :].isdigit()) for t in tokens)


def match_catalog_device(gpu_name: str, memory_bytes: int | None = None) -> DeviceSpec | None:
    """The catalog entry for a GPU name as NVML reports it ("NVIDIA GeForce RTX 4060 Ti",
    "NVIDIA A100-SXM4-80GB"), or None. Every word of the catalog name (memory sizes aside) should
    appear in NVML's; the model number must. Ties (4060 Ti 8/16 GB) go to the closest memory size."""
    tokens = _name_tokens(gpu_name)
    best: tuple[tuple, DeviceSpec] | None = None
    for d in load_devices():
        if d.vendor != "nvidia":
            continue
        wanted = _name_tokens(d.name)
        number = next((w for w in wanted if any(c.isdigit() for c in w)), None)
        if number is None or not _token_matches(number, tokens):
            continue
        matched = sum(_token_matches(w, tokens) for w in wanted)
        # Memory in 4 GiB steps: NVML reports a little less than the box says.
        gap = round(abs(d.memory_gib * GIB - memory_bytes) / (4 * GIB)) if memory_bytes else 0
        score = (matched == len(wanted), -gap, matched)
        if best is None or score > best[0]:
            best = (score, d)
    return best[1] if best else None


def resolve_targets(choice: HardwareChoice, machine: Machine) -> list[Target]:
    """The estimator's targets for a hardware choice. Raises CatalogError for an unknown device."""
    host = machine.host
    if choice.kind == "cpu" or (choice.kind == "local" and not machine.gpus):
        return [cpu_target(host)]
    if choice.kind == "local":
        gpus = [target_from_gpu(g, match_catalog_device(g.name, g.memory_total_bytes)) for g in machine.gpus]
        ram = host.ram_total_bytes if host else 16 * GIB
        return [*gpus, host_ram_target(ram, host.measured_read_bandwidth_gb_s if host else None)]
    device = find_device(choice.device_id or "")
    base = target_from_device(device)
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
    return [*gpus, host_ram_target(host_bytes, host_memory=choice.host_memory)]


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
