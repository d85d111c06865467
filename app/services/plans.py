"""One model on several GPUs of one kind, planned both ways people serve it: llama.cpp's layer
split and vLLM's tensor parallelism. ``fitscope plan`` and the window's Scale out tab both call
``scale_out``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.common.errors import FitScopeError
from app.core.hardware.devices import DeviceSpec
from app.core.memory.records import Settings
from app.core.model.source import ModelSource
from app.core.plans.layer_split import LlamaSplitPlan, llama_split_plan
from app.core.plans.vllm import VllmPlan, vllm_plan


@dataclass(frozen=True)
class ScaleOut:
    """Both plans. vLLM may refuse a configuration (a head count the GPU count does not divide, a
    model too big for the cards): then ``vllm`` is None and ``vllm_problem`` says why."""

    split: LlamaSplitPlan
    vllm: VllmPlan | None
    vllm_problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"llama_cpp": self.split.to_json(), "vllm": self.vllm.to_json() if self.vllm else None}
        if self.vllm_problem:
            out["vllm_problem"] = self.vllm_problem
        return out


def scale_out(
    model: ModelSource,
    settings: Settings,
    gpu: DeviceSpec,
    count: int,
    host_ram_bytes: int,
    *,
    dtype: str,
    context_per_sequence: int,
    max_num_seqs: int,
    gpu_memory_utilization: float,
    kv_cache_dtype: str = "auto",
) -> ScaleOut:
    """``model`` on ``count`` x ``gpu``: llama.cpp with ``settings`` (its whole context over every
    sequence) and host RAM for what does not fit; vLLM with ``dtype`` weights and sequences of up to
    ``context_per_sequence`` tokens."""
    split = llama_split_plan(model.arch, model.tensors, settings, gpu, count, host_ram_bytes)
    try:
        vllm = vllm_plan(
            model.arch,
            gpu,
            count,
            dtype=dtype,
            max_model_len=context_per_sequence,
            max_num_seqs=max(max_num_seqs, 1),
            gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_dtype=kv_cache_dtype,
        )
    except (FitScopeError, ValueError) as exc:
        return ScaleOut(split, None, str(exc))
    return ScaleOut(split, vllm)
