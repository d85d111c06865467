"""What changes when llama.cpp is built with a GPU backend: which buffers exist and how big they are.

Each rule names the function of the llama.cpp vendored by llama-cpp-python 0.3.36 it follows
(file paths are relative to that llama.cpp's root).

- **Host buffer instead of repacking.** ``make_cpu_buft_list`` (src/llama-model.cpp) lists, for
  weights kept in host memory, the first GPU's *host* buffer type before the CPU "extra" (repack)
  types. CUDA, ROCm (HIP builds the CUDA backend), Vulkan and SYCL have one
  (``get_host_buffer_type`` in their device interfaces; SYCL's unless ``GGML_SYCL_NO_PINNED`` is
  set, ``ggml_backend_sycl_device_get_props``); Metal and the CPU backend do not. With mmap
  on, the loader then maps those weights from the file instead of copying them into the pinned
  buffer (``CPU_Mapped``); with mmap off they sit in the pinned buffer (``CUDA_Host``). Either way
  nothing is repacked, so a GPU build holds no ``CPU_REPACK`` copy.
- **Op offload.** ``ggml_backend_sched_backend_id_from_cur`` (ggml/src/ggml-backend.cpp) runs an
  operation whose weight lives in host memory on the first GPU when that GPU's ``offload_op``
  accepts it (CUDA: a batch of at least 32 tokens, ``ggml_backend_cuda_device_offload_op``; SYCL
  the same, ``ggml_backend_sycl_device_offload_op`` with ``GGML_OP_OFFLOAD_MIN_BATCH`` 32). The
  weight is then copied into that GPU's compute buffer for its split; a new split starts at each
  such weight "so that the memory of the previously offloaded weights can be reused"
  (``ggml_backend_sched_split_graph``). So with any layer, expert tensor or the output head in host
  memory, GPU 0's compute buffer must hold the largest such weight plus the activations around it
  — even at ``-ngl 0``.
- **The CPU backend's compute buffer is pinned.** ``llama_context`` (src/llama-context.cpp, "init
  backends") gives the CPU backend the first GPU's host buffer type, printed as ``CUDA_Host compute
  buffer``. It holds the graph inputs: the token embeddings looked up on the CPU, positions, and
  the attention mask of each KV cache (``build_attn_inp_kq_mask``, src/llama-graph.cpp: n_kv x
  n_tokens, f16 with flash attention, f32 without).
- **Pipeline parallelism.** With more than one GPU, every layer offloaded and no tensor overrides,
  ``llama_context`` enables pipeline parallelism and the scheduler keeps ``GGML_SCHED_MAX_COPIES``
  (4) copies of every graph input and split input (``ggml_backend_sched_split_graph``, passes 5
  and 6), marked as outputs so the allocator never reuses them. SYCL devices report async compute
  and events too (``ggml_backend_sycl_device_get_props``).
- **RPC devices** (``-DGGML_RPC=ON``, ggml/src/ggml-rpc/ggml-rpc.cpp) report async compute and
  events (``ggml_backend_rpc_device_get_props``), so a split over several servers is pipelined
  like CUDA's; they have no host buffer type and no ``offload_op``. ``rpc`` is the build of a
  client whose only offload devices are RPC servers.
- **Quantized KV with flash attention.** ggml-cuda's flash attention converts a quantized K/V view
  to f16 in its memory pool for batched (prompt) kernels: one layer's K and V at the full KV
  length, not printed as a buffer but allocated.
"""

from __future__ import annotations

from typing import Literal

Backend = Literal["cpu", "cuda", "rocm", "vulkan", "metal", "sycl", "rpc"]
BACKENDS: tuple[Backend, ...] = ("cpu", "cuda", "rocm", "vulkan", "metal", "sycl", "rpc")
BUILD_NAMES: dict[str, str] = {
    "cpu": "CPU",
    "cuda": "CUDA",
    "rocm": "ROCm",
    "vulkan": "Vulkan",
    "metal": "Metal",
    "sycl": "SYCL",
    "rpc": "RPC",
}
Consumer = Literal["llama-cpp-python", "llama-server", "ollama"]
CONSUMERS: tuple[Consumer, ...] = ("llama-cpp-python", "llama-server", "ollama")  # app.core.memory.consumers

# Backends whose devices offer a pinned host buffer type (``get_host_buffer_type`` is not NULL).
_HOST_BUFFER: frozenset[str] = frozenset({"cuda", "rocm", "vulkan", "sycl"})
# Backends whose devices take host-resident weights' batched ops (``offload_op``).
_OP_OFFLOAD: frozenset[str] = frozenset({"cuda", "rocm", "vulkan", "sycl"})
# Backends with async compute and events (pipeline parallelism across GPUs).
_PIPELINE: frozenset[str] = frozenset({"cuda", "rocm", "sycl", "rpc"})
# Backends that convert a quantized KV view to f16 scratch for flash attention.
_FA_F16_SCRATCH: frozenset[str] = frozenset({"cuda", "rocm"})

SCHED_MAX_COPIES = 4
OP_OFFLOAD_MIN_BATCH = 32
HOST_BUFFER_NAME: dict[str, str] = {
    "cuda": "CUDA_Host",
    "rocm": "ROCm_Host",
    "vulkan": "Vulkan_Host",
    "sycl": "SYCL_Host",
}


def has_host_buffer(backend: str) -> bool:
    return backend in _HOST_BUFFER


def offloads_ops(backend: str, batch_tokens: int) -> bool:
    """Whether host-resident weights' matrix products of a ``batch_tokens`` batch run on GPU 0."""
    return backend in _OP_OFFLOAD and batch_tokens >= OP_OFFLOAD_MIN_BATCH


def pipeline_copies(backend: str, n_gpus: int, all_layers_on_gpus: bool, overrides: bool) -> int:
    """The scheduler's input copies (1 without pipeline parallelism)."""
    if backend in _PIPELINE and n_gpus > 1 and all_layers_on_gpus and not overrides:
        return SCHED_MAX_COPIES
    return 1


def converts_quantized_kv(backend: str) -> bool:
    return backend in _FA_F16_SCRATCH


def default_backend(efficiency_class: str | None) -> Backend:
    """The build a device implies: CUDA for NVIDIA, ROCm for AMD, Metal for Apple, SYCL (Intel's
    oneAPI build) for Intel; CPU when there is no GPU. Vulkan runs on all but Apple and is chosen
    explicitly."""
    builds = {"nvidia": "cuda", "amd": "rocm", "apple": "metal", "intel": "sycl"}
    return builds.get(efficiency_class or "", "cpu")  # type: ignore[return-value]
