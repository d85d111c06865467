"""Launch commands for a configuration the hardware advisor found: llama-server's, and vLLM's.

The llama-server command is the one command builder's (:func:`app.core.memory.commands.server_command`)
for the configuration's estimate: the whole-layer split over the box's GPUs (``--tensor-split
1,1,...``) and the placement it was judged with. Multi-GPU CUDA/ROCm boxes that hold the whole
model also get vLLM's tensor-parallel command when vLLM's plan (:func:`app.core.plans.vllm.vllm_plan`)
starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.common.errors import FitScopeError
from app.core.memory.commands import server_command
from app.core.model.architecture import Architecture
from app.core.model.catalog import find_device

if TYPE_CHECKING:
    from app.core.advisor.records import Candidate, Workload


def launch_commands(arch: Architecture, model_path: str, w: Workload, c: Candidate) -> tuple[str, str]:
    """The llama-server command for configuration ``c`` of workload ``w`` (``model_path``, or a
    file name made of the model and the preset), and a vLLM command for multi-GPU CUDA/ROCm boxes
    when vLLM's plan starts ("" otherwise, or the reason it would not, after '#'); both "" when
    ``c`` was settled without an estimate."""
    if c.estimate is None:
        return "", ""
    split = tuple(1 for _ in range(c.count)) if c.category == "multi-gpu" else ()
    layers = c.estimate.gpu_layers if c.category != "cpu" else 0
    path = model_path or f"{arch.id}-{c.quant}.gguf"
    llama = server_command(c.estimate, path, layers, arch.sliding_window is not None, tensor_split=split)
    return llama, vllm_command(arch, c, w)


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
        plan = vllm_plan(arch, device, c.count, dtype=fmt, max_model_len=w.context_tokens, max_num_seqs=w.users)
    except FitScopeError as exc:
        return f"# vLLM: {exc}"
    if not plan.starts:
        return f"# vLLM ({fmt}) would not start: {plan.problems[0]}"
    return plan.command
