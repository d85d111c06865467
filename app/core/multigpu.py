"""One model across several identical GPUs, the two ways people serve it: the names callers import.

- llama.cpp's layer split (``--split-mode layer``): :mod:`app.core.layer_split`.
- vLLM's tensor parallelism: :mod:`app.core.vllm` (the plan and its command) and
  :mod:`app.core.vllm_memory` (the memory accounting per GPU).

The command line, the Scale out tab and :mod:`app.services.plans` import both plans from here.
"""

from __future__ import annotations

from app.core.layer_split import LlamaSplitPlan, SplitDevice, llama_split_plan
from app.core.vllm import VllmPlan, hf_model_id, vllm_plan
from app.core.vllm_memory import VllmGpu

__all__ = ["LlamaSplitPlan", "SplitDevice", "VllmGpu", "VllmPlan", "hf_model_id", "llama_split_plan", "vllm_plan"]
