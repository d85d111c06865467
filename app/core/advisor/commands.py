"""Launch commands for a configuration the hardware advisor found: llama-server's, and vLLM's.

The llama-server command is the estimate service's for the configuration (the placement it was
judged with, as ``fitscope estimate`` prints it for the same machine). Multi-GPU CUDA/ROCm boxes that hold the whole
model also get vLLM's tensor-parallel command when vLLM's plan (:func:`app.core.plans.vllm.vllm_plan`)
starts.
"""

from __future__ import annotations

from typing import Any

from app.core.advisor.records import Candidate, HardwareAdvice, Workload
from app.core.common.errors import FitScopeError
from app.core.model.architecture import Architecture
from app.core.model.catalog import find_device


def launch_commands(advice: HardwareAdvice, c: Candidate) -> tuple[str, str]:
    """The llama-server command for configuration ``c`` (the estimate service's, for the model's
    file or a file name made of the model and the preset), and a vLLM command for multi-GPU
    CUDA/ROCm boxes when vLLM's plan starts ("" otherwise, or the reason it would not, after '#');
    both "" when ``c`` was settled without an estimate."""
    if not c.llama_command:
        return "", ""
    return c.llama_command, vllm_command(advice.arch, c, advice.workload)


def advice_json(advice: HardwareAdvice, limit: int = 50) -> dict[str, Any]:
    """The answer as ``fitscope advise --json`` prints it: the first ``limit`` ranked configurations
    and the best of each kind, with their launch commands; the failing ones with their reasons."""

    def with_commands(c: Candidate) -> dict[str, Any]:
        llama, vllm = launch_commands(advice, c)
        return c.to_json() | {"llama_server_command": llama, "vllm_command": vllm or None}

    return {
        "model": advice.model_label,
        "workload": advice.workload.model_dump(mode="json"),
        "presets": list(advice.presets),
        "evaluated": advice.evaluated,
        "estimated": advice.estimated,
        "seconds": round(advice.seconds, 3),
        "ranked": [with_commands(c) for c in advice.ranked[:limit]],
        "best_per_category": {k: with_commands(c) for k, c in advice.best_per_category().items()},
        "passing": len(advice.passing),
        "failing": [c.to_json() for c in advice.failing],
        "assumptions": list(advice.assumptions),
    }


def vllm_command(arch: Architecture, c: Candidate, w: Workload) -> str:
    """vLLM's command for a multi-GPU CUDA/ROCm box that holds the whole model: FP16 weights for the
    16-bit presets, FP8 for presets of practically the same quality (perplexity increase at most
    0.03), AWQ 4-bit for the others. "" for other configurations; the reason vLLM would not start,
    after '#', when its plan fails."""
    if c.category != "multi-gpu" or c.placement != "gpu":
        return ""
    from app.core.plans.vllm import vllm_plan

    device = find_device(c.device_id)
    if device.backend not in ("cuda", "rocm"):
        return ""
    ppl = c.ppl_increase if c.ppl_increase is not None else 1.0
    fmt = "FP16" if c.quant in ("F16", "BF16") else "FP8" if ppl <= 0.03 else "AWQ-4bit"
    try:
        plan = vllm_plan(
            arch, device, c.count, dtype=fmt, max_model_len=w.context_per_user_tokens, max_num_seqs=w.users
        )
    except FitScopeError as exc:
        return f"# vLLM: {exc}"
    if not plan.starts:
        return f"# vLLM ({fmt}) would not start: {plan.problems[0]}"
    return plan.command
