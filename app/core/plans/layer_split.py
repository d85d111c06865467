"""llama.cpp's layer split over several identical GPUs, and the per-device record every split plan uses.

:func:`llama_split_plan` runs the estimator (:func:`app.core.memory.estimate.estimate`) over ``count``
copies of a GPU and reports each GPU's share of llama.cpp's ``--split-mode layer`` (whole layers
per GPU, every GPU holding its layers' weights and KV cache, plus its own compute buffer), with
the ``llama-server`` command that reproduces it.

:class:`SplitDevice` is one part of such a split: one device, or several summed (the devices one
RPC host serves, :mod:`app.core.plans.rpc`). :func:`share_line` and :func:`share_json` write a part's
figures the same way for every plan, and :func:`tensor_split` gives llama.cpp's
``--tensor-split`` proportions for a list of capacities.

All byte figures are integers (bytes); nothing here imports Qt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from app.core.common.errors import EstimateError
from app.core.common.units import GIB
from app.core.hardware.devices import DeviceSpec
from app.core.memory.commands import MODEL_PLACEHOLDER, server_command, tensor_split
from app.core.memory.estimate import estimate
from app.core.memory.limits import max_gpu_layers
from app.core.memory.records import DeviceBreakdown, Estimate, Settings
from app.core.memory.targets import host_ram_target, target_from_device
from app.core.model.architecture import Architecture
from app.core.model.tensors import TensorInfo


def _gib(n: float) -> str:
    return f"{n / GIB:.2f}"


class SplitDevice(DeviceBreakdown):
    """One part of a llama.cpp layer split: the estimator's breakdown of one device, or of several
    summed (the devices one RPC host serves), and whether the output layer (llama.cpp's layer
    ``n_layer``) is here. ``layers`` counts repeating layers only; ``other_bytes`` is CPU repack +
    recurrent state + output buffer."""

    holds_output: bool

    @property
    def other_bytes(self) -> int:
        return self.repack_bytes + self.recurrent_state_bytes + self.output_bytes

    @property
    def model_buffer_bytes(self) -> int:
        """The weights as llama.cpp prints its model buffers: repacked copies included."""
        return self.weights_bytes + self.repack_bytes

    @property
    def cache_buffer_bytes(self) -> int:
        """The KV cache with the recurrent state, as llama.cpp prints its cache buffers."""
        return self.kv_cache_bytes + self.recurrent_state_bytes

    @property
    def compute_buffer_bytes(self) -> int:
        """The compute buffer with the logits' output buffer and a vision projector's."""
        return self.compute_bytes + self.output_bytes + self.projector_bytes

    @classmethod
    def of(
        cls, name: str, devices: Sequence[DeviceBreakdown], holds_output: bool, capacity_bytes: int | None = None
    ) -> SplitDevice:
        """``devices`` summed under ``name``: of kind "cpu" when host memory is among them, and with
        their own capacity unless ``capacity_bytes`` is given."""
        return cls(
            name=name,
            kind="cpu" if any(d.kind == "cpu" for d in devices) else "gpu",
            capacity_bytes=sum(d.capacity_bytes for d in devices) if capacity_bytes is None else capacity_bytes,
            weights_bytes=sum(d.weights_bytes for d in devices),
            repack_bytes=sum(d.repack_bytes for d in devices),
            kv_cache_bytes=sum(d.kv_cache_bytes for d in devices),
            recurrent_state_bytes=sum(d.recurrent_state_bytes for d in devices),
            compute_bytes=sum(d.compute_bytes for d in devices),
            output_bytes=sum(d.output_bytes for d in devices),
            overhead_bytes=sum(d.overhead_bytes for d in devices),
            layers=sum(d.layers for d in devices),
            projector_bytes=sum(d.projector_bytes for d in devices),
            holds_output=holds_output,
        )

    @classmethod
    def from_breakdown(cls, d: DeviceBreakdown, holds_output: bool) -> SplitDevice:
        return cls.of(d.name, [d], holds_output)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, **share_json(self, other_bytes=self.other_bytes)}


class DeviceShare(Protocol):
    """What :func:`share_line` and :func:`share_json` read of a part of a split."""

    @property
    def layers(self) -> int: ...
    @property
    def holds_output(self) -> bool: ...
    @property
    def weights_bytes(self) -> int: ...
    @property
    def kv_cache_bytes(self) -> int: ...
    @property
    def compute_bytes(self) -> int: ...
    @property
    def overhead_bytes(self) -> int: ...
    @property
    def total_bytes(self) -> int: ...
    @property
    def capacity_bytes(self) -> int: ...
    @property
    def fits(self) -> bool: ...


def share_line(label: str, d: DeviceShare, total_unit: str = "") -> str:
    """One sentence for a part of a split: its layers, its buffers in GiB and whether it fits.
    ``total_unit`` is written after the total as well (" GiB": "7.77 GiB of 72.00 GiB")."""
    output = " and the output layer" if d.holds_output else ""
    verdict = "fits" if d.fits else "does NOT fit"
    return (
        f"{label}: {d.layers} layers{output}; weights {_gib(d.weights_bytes)} GiB, KV cache "
        f"{_gib(d.kv_cache_bytes)} GiB, compute {_gib(d.compute_bytes)} GiB, overhead "
        f"{_gib(d.overhead_bytes)} GiB: {_gib(d.total_bytes)}{total_unit} of {_gib(d.capacity_bytes)} GiB, {verdict}."
    )


def share_json(d: DeviceShare, **extra: int) -> dict[str, Any]:
    """A part's figures for a report, ``extra`` byte figures after the overhead."""
    return {
        "layers": d.layers,
        "holds_output": d.holds_output,
        "weights_bytes": d.weights_bytes,
        "kv_cache_bytes": d.kv_cache_bytes,
        "compute_bytes": d.compute_bytes,
        "overhead_bytes": d.overhead_bytes,
        **extra,
        "total_bytes": d.total_bytes,
        "capacity_bytes": d.capacity_bytes,
        "fits": d.fits,
    }


@dataclass(frozen=True)
class LlamaSplitPlan:
    """llama.cpp's ``--split-mode layer`` over ``count`` identical GPUs, as the estimator places it."""

    model_name: str
    gpu_name: str
    count: int
    estimate: Estimate
    gpus: tuple[SplitDevice, ...]
    host: SplitDevice
    tensor_split: tuple[int, ...]
    command: str
    suggested_gpu_layers: int | None
    """When the GPUs do not fit: the most layers (``-ngl``) that would; None when they fit."""

    @property
    def settings(self) -> Settings:
        return self.estimate.settings

    @property
    def gpu_layers(self) -> int:
        return self.estimate.gpu_layers

    @property
    def n_layer(self) -> int:
        return self.estimate.n_layer

    @property
    def fits(self) -> bool:
        return self.estimate.fits

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": "llama.cpp",
            "model": self.model_name,
            "gpu": self.gpu_name,
            "count": self.count,
            "split_mode": "layer",
            "tensor_split": list(self.tensor_split),
            "gpu_layers": self.gpu_layers,
            "n_layer": self.n_layer,
            "fits": self.fits,
            "suggested_gpu_layers": self.suggested_gpu_layers,
            "gpus": [g.to_json() for g in self.gpus],
            "host": self.host.to_json(),
            "settings": self.settings.model_dump(),
            "command": self.command,
        }

    def summary_lines(self) -> list[str]:
        s = self.settings
        lines = [
            f"llama.cpp splits {self.model_name} by whole layers over {self.count} x {self.gpu_name}: "
            f"{self.gpu_layers} of {self.n_layer + 1} layers (the output layer included) on the GPUs, "
            f"context {s.context_tokens:,} tokens for {s.parallel_sequences} sequence(s)."
        ]
        lines += [share_line(g.name, g) for g in self.gpus]
        h = self.host
        held = (
            f"{h.layers} layers, the token embedding and the logits"
            if h.layers
            else "the token embedding and the logits"
        )
        lines.append(
            f"Host memory keeps {held}: {_gib(h.total_bytes)} of {_gib(h.capacity_bytes)} GiB"
            f"{'' if h.fits else ', which does NOT fit'}."
        )
        if self.suggested_gpu_layers is not None:
            if self.suggested_gpu_layers:
                lines.append(
                    f"The GPUs are too small for every layer: -ngl {self.suggested_gpu_layers} would fit, "
                    "the rest running on the CPU."
                )
            else:
                lines.append("No number of GPU layers fits these GPUs and this host with these settings.")
        lines.append("Each GPU runs its own layers in turn (no tensor parallelism): speed is about one GPU's.")
        return lines


def llama_split_plan(
    arch: Architecture,
    tensors: Sequence[TensorInfo],
    settings: Settings,
    gpu: DeviceSpec,
    count: int,
    host_ram_bytes: int,
    *,
    model_path: str | None = None,
) -> LlamaSplitPlan:
    """llama.cpp's layer split of ``arch`` (``tensors``) over ``count`` copies of ``gpu`` (named
    "GPU 0".."GPU n-1") beside ``host_ram_bytes`` of host memory, under ``settings``.

    Raises EstimateError for fewer than one GPU, a device that is not a GPU, or settings
    llama.cpp refuses.
    """
    if count < 1:
        raise EstimateError("A multi-GPU plan needs at least one GPU.")
    if not gpu.is_gpu:
        raise EstimateError(f"{gpu.name} is not a GPU: a layer split needs GPUs.")
    base = target_from_device(gpu)
    gpus = [base.model_copy(update={"name": f"GPU {i}"}) for i in range(count)]
    targets = [*gpus, host_ram_target(host_ram_bytes)]
    est = estimate(arch, tensors, settings, targets)
    out_dev = est.layer_devices[est.n_layer] if est.gpu_layers else -1
    lines = tuple(SplitDevice.from_breakdown(d, out_dev == i) for i, d in enumerate(est.devices[:count]))
    host = SplitDevice.from_breakdown(est.devices[-1], False)
    split = tensor_split([t.capacity_bytes for t in gpus])
    suggested = None
    if not all(g.fits for g in lines):
        suggested = max_gpu_layers(arch, tensors, settings, targets)
    command = server_command(
        est, model_path or MODEL_PLACEHOLDER, est.gpu_layers, arch.sliding_window is not None, tensor_split=split
    )
    return LlamaSplitPlan(arch.name, gpu.name, count, est, lines, host, split, command, suggested)
