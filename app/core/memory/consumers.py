"""The programs that run llama.cpp, where their defaults differ in what the estimate depends on.

- **llama-server** (tools/server of the vendored llama.cpp): ``-b 2048 -ub 512``, a window-sized
  sliding-window cache, and logits reserved for its slots only (``n_outputs_max``).
- **llama-cpp-python**: the same batch sizes, a full-size sliding-window cache, logits for a whole
  ubatch.
- **Ollama**: its current releases run llama-server itself as a subprocess
  (ollama/ollama ``llm/llama_server.go``, read at commit fb30760 of August 2026) with
  ``-c num_ctx x parallel -np parallel -b B -ub B``, so its memory follows llama-server's rules
  (slot-sized logits, window-sized SWA cache) with its own batch: ``num_batch`` when the user sets
  it, else chosen by the context (``server/sched.go``, ``generationBatchForContext``): 512 tokens up
  to a 4 096-token context, 1 024 up to 32 768, 2 048 beyond. It lowers that batch when the model
  would fill more than 60-80 % of the free VRAM, and to 256 on small CUDA cards without flash
  attention: not modelled here (the estimate is then slightly high). Its default context follows
  the total VRAM (``server/routes.go``): 4 096 tokens below 23 GiB, 32 768 below 47 GiB, 262 144
  above, capped at the model's trained context; ``OLLAMA_NUM_PARALLEL`` defaults to 1.
"""

from __future__ import annotations

from app.core.common.units import GIB

OLLAMA_BATCH_STEPS = ((4096, 512), (32768, 1024))
OLLAMA_BATCH_LARGE = 2048


def ollama_batch_tokens(context_tokens: int) -> int:
    """The ``-b`` and ``-ub`` Ollama passes to llama-server for a total context of ``context_tokens``."""
    for limit, batch in OLLAMA_BATCH_STEPS:
        if context_tokens <= limit:
            return batch
    return OLLAMA_BATCH_LARGE


def ollama_default_context(total_vram_bytes: int, n_ctx_train: int) -> int:
    """The context Ollama gives a model when the request sets none (``num_ctx``)."""
    if total_vram_bytes >= 47 * GIB:
        default = 262144
    elif total_vram_bytes >= 23 * GIB:
        default = 32768
    else:
        default = 4096
    return min(default, n_ctx_train) if n_ctx_train > 0 else default
