"""The estimator's records: llama.cpp's settings (named after its flags), the devices a model may go
to, and the estimate itself (per device, per KV cache), with the constants they rest on."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from app.core.common.units import MIB, Frozen, pad_to
from app.core.memory.backends import Backend, Consumer
from app.core.model.architecture import Architecture
from app.core.model.coverage import Status
from app.core.model.projector import ProjectorEstimate, ProjectorSpec
from app.core.model.tensors import CACHE_TYPES, GGMLType, TensorInfo

GPU_RUNTIME_OVERHEAD_BYTES = 512 * MIB


CPU_RUNTIME_OVERHEAD_BYTES = 160 * MIB


MAX_CONTEXT_TOKENS = 16 * 1024 * 1024


RepackProfile = Literal["x86-avx2", "x86-avx512", "arm-neon", "none"]
GpuLayers = Annotated[int, Field(ge=0)] | Literal["auto", "all"]
"""llama.cpp's ``-ngl``: a number of layers (the output layer counts as one), "all", or "auto" (placed
as llama.cpp's ``--fit`` places it: :func:`app.core.memory.autofit.auto_fit`)."""
TOTALS_CACHE_SIZE = 128  # models remembered by the per-object caches below

REPACK_TYPES: dict[str, frozenset[GGMLType]] = {
    "x86-avx2": frozenset({GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.IQ4_NL, GGMLType.MXFP4}),
    "x86-avx512": frozenset({GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.IQ4_NL, GGMLType.MXFP4, GGMLType.Q2_K}),
    "arm-neon": frozenset(
        {GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.IQ4_NL, GGMLType.MXFP4, GGMLType.Q8_0}
    ),
    "none": frozenset(),
}


class SpeculativeSpec(Frozen):
    """llama-server's speculative decoding, which keeps a second context beside the model's:

    - ``mtp``: the model's own multi-token-prediction head (``--spec-type draft-mtp``): the head is
      loaded with the model (load_mtp) and gets an MTP context of its own (its KV cache holds the MTP
      layers only);
    - ``draft``: a smaller draft model (``-md DRAFT.gguf``, with ``-ngld`` layers on the GPUs), with
      its own weights and context.

    Both contexts hold as many cells as the model's, in the draft cache types (``-ctkd`` / ``-ctvd``),
    and reserve logits for one row per slot (common_base_params_to_speculative, common/speculative.cpp).
    """

    kind: Literal["mtp", "draft"]
    name: str = Field(description="what the user chose: the draft's name, or the model's MTP head")
    file_name: str = Field(default="", description="the draft GGUF llama-server is given with -md")
    architecture: Architecture | None = Field(default=None, description="the draft model's (None for mtp)")
    tensors: tuple[TensorInfo, ...] = Field(default=(), description="the draft model's tensors")
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    gpu_layers: int | None = Field(default=None, ge=0, description="-ngld; None: every draft layer on the GPUs")
    draft_max: int = Field(default=3, ge=1, le=64, description="--spec-draft-n-max: tokens drafted per step")

    @model_validator(mode="after")
    def _check(self) -> SpeculativeSpec:
        if self.kind == "draft" and (self.architecture is None or not self.tensors):
            raise ValueError("a draft model needs its architecture and tensors")
        for name in (self.cache_type_k, self.cache_type_v):
            if name not in CACHE_TYPES:
                raise ValueError(f"unknown draft cache type '{name}' (choose {', '.join(CACHE_TYPES)})")
        return self


class Settings(Frozen):
    """llama.cpp context settings, named after its command-line flags.

    The defaults are what FitScope's own runner uses: llama.cpp's context defaults (batch 2048,
    ubatch 512, flash attention on, f16 cache, one sequence), and llama-cpp-python's full-size
    sliding-window cache.
    """

    context_tokens: int = Field(default=4096, ge=1, le=MAX_CONTEXT_TOKENS)
    batch_tokens: int = Field(default=2048, ge=1, le=1 << 20)
    ubatch_tokens: int = Field(default=512, ge=1, le=1 << 20)
    flash_attn: bool = True
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    parallel_sequences: int = Field(default=1, ge=1, le=256)
    kv_unified: bool = False
    swa_full: bool = True
    gpu_layers: GpuLayers = Field(default="all", description='"auto" is placed by auto_fit, never by estimate()')
    repack: RepackProfile = "x86-avx2"
    backend: Backend | Literal["auto"] = Field(
        default="auto",
        description="the llama.cpp build; auto: CUDA/ROCm/Metal/SYCL by the GPUs' vendor, CPU without GPUs",
    )
    consumer: Consumer = Field(
        default="llama-cpp-python", description="llama-server reserves logits for its slots only (n_outputs_max)"
    )
    mmap: bool = True
    n_cpu_moe: int = Field(default=0, ge=0, description="--n-cpu-moe: expert tensors of the first N layers in RAM")
    threads: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="-t: CPU threads; None: llama.cpp's default (the physical cores, a hybrid CPU's performance cores)",
    )
    mmproj: ProjectorSpec | None = Field(default=None, description="--mmproj: a vision projector beside the model")
    mmproj_offload: bool = Field(default=True, description="False: --no-mmproj-offload (the projector in host memory)")
    speculative: SpeculativeSpec | None = Field(
        default=None, description="speculative decoding: the model's MTP head or a draft model (-md)"
    )

    @model_validator(mode="after")
    def _check(self) -> Settings:
        for name in (self.cache_type_k, self.cache_type_v):
            if name not in CACHE_TYPES:
                raise ValueError(f"unknown cache type '{name}' (choose {', '.join(CACHE_TYPES)})")
        return self

    @property
    def effective_ubatch(self) -> int:
        return min(self.ubatch_tokens, self.batch_tokens)

    @property
    def reserve_ubatch(self) -> int:
        """The ubatch of llama.cpp's worst-case graph before it is split among sequences: n_ubatch, at
        most the context (padded to 256 cells) (llama_context::sched_reserve)."""
        return min(self.effective_ubatch, pad_to(self.context_tokens, 256))

    @property
    def graph_tokens(self) -> int:
        """Tokens in llama.cpp's worst-case graph: ``reserve_ubatch`` made a multiple of the sequences,
        as graph_reserve rounds it up (513 for -ub 512 with -np 3; 512 with -np 2 or 4)."""
        return pad_to(self.reserve_ubatch, max(self.parallel_sequences, 1))

    @property
    def graph_outputs(self) -> int:
        """Rows of logits in the worst-case graph: ``reserve_ubatch``'s tokens, at most ``n_outputs_max``
        (the rounding to the sequences adds tokens, not outputs)."""
        return min(self.reserve_ubatch, self.n_outputs_max)

    @property
    def n_outputs_max(self) -> int:
        """Rows of logits the worst-case graph reserves: llama-server sets ``n_outputs_max`` to its
        slots (``server_output_limits``, tools/server/server-context.cpp); llama-cpp-python leaves
        it at 0, which llama_context turns into n_batch. Ollama runs llama-server."""
        if self.consumer in ("llama-server", "ollama"):
            return min(self.batch_tokens, self.parallel_sequences)
        return self.batch_tokens

    def describe(self) -> str:
        fa = "on" if self.flash_attn else "off"
        return (
            f"-c {self.context_tokens} -b {self.batch_tokens} -ub {self.ubatch_tokens} -fa {fa} "
            f"-ctk {self.cache_type_k} -ctv {self.cache_type_v} -np {self.parallel_sequences}"
            + (" --kv-unified" if self.kv_unified else "")
            + (" --swa-full" if self.swa_full else " --no-swa-full")
            + ("" if self.mmap else " --no-mmap")
            + (f" --n-cpu-moe {self.n_cpu_moe}" if self.n_cpu_moe else "")
            + (f" -t {self.threads}" if self.threads else "")
            + (self._speculative_flags() if self.speculative is not None else "")
        )

    def _speculative_flags(self) -> str:
        spec = self.speculative
        assert spec is not None
        head = " --spec-type draft-mtp" if spec.kind == "mtp" else f" -md {spec.file_name or spec.name}"
        return head + f" -ctkd {spec.cache_type_k} -ctvd {spec.cache_type_v}"


class Target(Frozen):
    """A device the model's layers may go to. ``kind='cpu'`` is host memory."""

    name: str
    kind: Literal["gpu", "cpu"]
    capacity_bytes: int = Field(ge=0)
    bandwidth_gb_s: float = Field(gt=0)
    fp16_tflops: float = Field(gt=0)
    vector_tflops: float | None = Field(
        default=None,
        gt=0,
        description="a GPU's FP32 rate on its shader ALUs (no tensor units): what each further row of a decode "
        "step (another user) costs arithmetic at; None: half of fp16_tflops",
    )
    efficiency_class: Literal["nvidia", "amd", "apple", "intel", "cpu", "host-spec"] = Field(
        default="nvidia", description="cpu: a measured read bandwidth; host-spec: a DRAM spec-sheet peak"
    )
    overhead_bytes: int | None = Field(default=None, ge=0, description="None: the documented default")
    pcie_gen: int | None = Field(default=None, ge=1, le=6, description="a GPU's link to the host: PCIe generation")
    pcie_lanes: int | None = Field(default=None, ge=1, le=32, description="a GPU's link to the host: lanes")
    pcie_stated: bool = Field(
        default=False,
        description="the link was reported by the driver or set by the user; otherwise it is the card's as sold, "
        "and the board's slot may give it fewer lanes or an older generation",
    )
    cpu_cores: int | None = Field(
        default=None,
        ge=1,
        description="host memory: the physical cores doing the CPU's share (fp16_tflops is all of them)",
    )
    bandwidth_span_gb_s: tuple[float, float] | None = Field(
        default=None,
        description="host memory named without its speed: the peaks of its generation's slowest and fastest common "
        "grades (bandwidth_gb_s is the grade assumed); the decode range spans them",
    )
    prompt_tflops: float | None = Field(
        default=None,
        gt=0,
        description="the rate of llama.cpp's kernels for quantized weights where it is below fp16_tflops "
        "(``targets.kernel_tflops``): a CPU's prompt kernels at AVX2's width even where it has AVX-512 "
        "(``prompt_lanes``); an RDNA 4 GPU's prompt and decode kernels at its packed-FP16 rate, half its "
        "matrix peak; fp16_tflops where None",
    )
    cpu_default_threads: int | None = Field(
        default=None,
        ge=1,
        description="a CPU's threads when -t is not given: llama.cpp's default here (a hybrid CPU's performance "
        "cores); None: all of cpu_cores",
    )
    cpu_clocks_ghz: tuple[float, float] | None = Field(
        default=None,
        description="a CPU's (base, boost) clocks in GHz, where known: its arithmetic runs at the clock its busy "
        "cores hold (``targets.busy_clock_ghz``); None: the nominal clock the speed model counts",
    )

    @property
    def runtime_overhead_bytes(self) -> int:
        if self.overhead_bytes is not None:
            return self.overhead_bytes
        return GPU_RUNTIME_OVERHEAD_BYTES if self.kind == "gpu" else CPU_RUNTIME_OVERHEAD_BYTES


class DeviceBreakdown(Frozen):
    name: str
    kind: Literal["gpu", "cpu"]
    capacity_bytes: int
    weights_bytes: int
    repack_bytes: int
    kv_cache_bytes: int
    recurrent_state_bytes: int
    compute_bytes: int
    output_bytes: int
    overhead_bytes: int
    layers: int = Field(description="repeating layers placed here (the output layer not counted)")
    projector_bytes: int = Field(default=0, description="a vision projector's weights and compute buffer (--mmproj)")
    reclaimable_bytes: int = Field(
        default=0,
        ge=0,
        description="page cache inside weights_bytes the kernel may drop: the mapped file pages of tensors the CPU "
        "backend repacked, never read again after loading",
    )
    speculative_bytes: int = Field(
        default=0, description="speculative decoding's draft or MTP head: its weights, KV cache and buffers"
    )

    @property
    def total_bytes(self) -> int:
        return (
            self.projector_bytes
            + self.speculative_bytes
            + self.weights_bytes
            + self.repack_bytes
            + self.kv_cache_bytes
            + self.recurrent_state_bytes
            + self.compute_bytes
            + self.output_bytes
            + self.overhead_bytes
        )

    @property
    def resident_bytes(self) -> int:
        """What must stay in memory: everything but the page cache the kernel can drop."""
        return self.total_bytes - self.reclaimable_bytes

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.resident_bytes

    @property
    def fits(self) -> bool:
        return self.resident_bytes <= self.capacity_bytes


class KVCacheDetail(Frozen):
    """One llama.cpp KV cache: sliding-window models have a full and a sliding-window one, sparse-attention
    models (DeepSeek-V3.2, GLM-5) a K-only cache of indexer keys beside the main one (MiniMax-M3: indexer
    keys with a one-head value each)."""

    kind: Literal["full", "swa", "indexer"]
    cells: int
    streams: int
    layers: int
    k_bytes: int
    v_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.k_bytes + self.v_bytes


class SpeculativeEstimate(Frozen):
    """What speculative decoding adds (bytes): the draft's (or MTP head's) weights, its own KV cache,
    compute and output buffers, and where llama-server puts each."""

    spec: SpeculativeSpec
    weights_bytes: int
    kv_cache_bytes: int
    compute_bytes: int
    output_bytes: int
    by_device: tuple[int, ...] = Field(description="bytes per entry of Estimate.devices")

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.compute_bytes + self.output_bytes


class Estimate(Frozen):
    settings: Settings
    devices: tuple[DeviceBreakdown, ...]
    kv_caches: tuple[KVCacheDetail, ...]
    model_bytes: int = Field(
        description="llama_model_size: every tensor in the file once, NextN layers included though they are not loaded"
    )
    gpu_layers: int
    n_layer: int
    layer_devices: tuple[int, ...] = Field(
        description="for layers 0..n_layer (n_layer = the output layer): the index in ``devices`` holding it"
    )
    assumptions: tuple[str, ...]
    backend: Backend = "cpu"
    cpu_moe_layers: int = Field(default=0, description="layers whose expert tensors stay in host memory")
    runtime_scratch_bytes: int = Field(
        default=0, description="per GPU: memory-pool scratch llama.cpp does not print (inside overhead_bytes)"
    )
    rules: Status = Field(
        default="exact",
        description="exact: the architecture's rules are proven against llama.cpp (app.core.model.coverage); "
        "approximate: generic rules; unknown: llama.cpp does not load this architecture",
    )
    architecture: str = Field(default="", description="llama.cpp general.architecture")
    projector: ProjectorEstimate | None = Field(default=None, description="the --mmproj projector, when one is loaded")
    projector_device: int | None = Field(default=None, description="the index in ``devices`` holding the projector")
    speculative: SpeculativeEstimate | None = Field(default=None, description="the draft or MTP head, when one is used")
    compute_allowance_bytes: int = Field(
        default=0,
        description="the measured placement allowance each compute buffer includes (app.core.memory.graphs.ALLOWANCE)",
    )

    @property
    def approximate(self) -> bool:
        return self.rules != "exact"

    def _sum(self, field: str) -> int:
        return sum(getattr(d, field) for d in self.devices)

    @property
    def weights_bytes(self) -> int:
        return self._sum("weights_bytes")

    @property
    def repack_bytes(self) -> int:
        return self._sum("repack_bytes")

    @property
    def kv_cache_bytes(self) -> int:
        return self._sum("kv_cache_bytes")

    @property
    def recurrent_state_bytes(self) -> int:
        return self._sum("recurrent_state_bytes")

    @property
    def compute_bytes(self) -> int:
        return self._sum("compute_bytes")

    @property
    def output_bytes(self) -> int:
        return self._sum("output_bytes")

    @property
    def projector_bytes(self) -> int:
        return self._sum("projector_bytes")

    @property
    def speculative_bytes(self) -> int:
        return self._sum("speculative_bytes")

    @property
    def overhead_bytes(self) -> int:
        return self._sum("overhead_bytes")

    @property
    def reclaimable_bytes(self) -> int:
        return self._sum("reclaimable_bytes")

    @property
    def resident_bytes(self) -> int:
        return self.total_bytes - self.reclaimable_bytes

    @property
    def total_bytes(self) -> int:
        return sum(d.total_bytes for d in self.devices)

    @property
    def fits(self) -> bool:
        return all(d.fits for d in self.devices)


def projector_json(e: Estimate) -> dict[str, Any] | None:
    """The ``--mmproj`` projector's parts (bytes), or None without one."""
    p = e.projector
    if p is None:
        return None
    return {
        "name": p.spec.name,
        "projector_type": p.spec.projector_type,
        "file": p.spec.file_name,
        "source": p.spec.source,
        "device": e.devices[e.projector_device].name if e.projector_device is not None else None,
        "weights_bytes": p.weights_bytes,
        "compute_bytes": p.compute_bytes,
        "warmup_compute_bytes": p.warmup_compute_bytes,
        "total_bytes": p.total_bytes,
        "image_tokens": p.spec.image_tokens,
        "flash_attn": p.flash_attn,
        "approximate": p.approximate,
    }


def speculative_json(e: Estimate) -> dict[str, Any] | None:
    """Speculative decoding's parts (bytes): the draft model (-md) or the MTP head; None without."""
    s = e.speculative
    if s is None:
        return None
    return {
        "kind": s.spec.kind,
        "name": s.spec.name,
        "file": s.spec.file_name,
        "weights_bytes": s.weights_bytes,
        "kv_cache_bytes": s.kv_cache_bytes,
        "compute_bytes": s.compute_bytes,
        "output_bytes": s.output_bytes,
        "total_bytes": s.total_bytes,
        "devices": {e.devices[i].name: b for i, b in enumerate(s.by_device) if b},
    }


def estimate_json(e: Estimate) -> dict[str, Any]:
    """An estimate's figures as ``fitscope estimate --json`` names them: bytes as unrounded
    integers, ``context_tokens`` as llama.cpp's ``-c``, one entry per device, the settings."""
    return {
        "context_tokens": e.settings.context_tokens,
        "rules": e.rules,
        "approximate": e.approximate,
        "weights_bytes": e.weights_bytes,
        "repack_bytes": e.repack_bytes,
        "kv_cache_bytes": e.kv_cache_bytes,
        "recurrent_state_bytes": e.recurrent_state_bytes,
        "compute_bytes": e.compute_bytes,
        "output_bytes": e.output_bytes,
        "overhead_bytes": e.overhead_bytes,
        "projector_bytes": e.projector_bytes,
        "speculative_bytes": e.speculative_bytes,
        "total_bytes": e.total_bytes,
        "reclaimable_bytes": e.reclaimable_bytes,
        "resident_bytes": e.resident_bytes,
        "model_bytes": e.model_bytes,
        "gpu_layers": e.gpu_layers,
        "devices": [
            {
                "name": d.name,
                "kind": d.kind,
                "capacity_bytes": d.capacity_bytes,
                "total_bytes": d.total_bytes,
                "reclaimable_bytes": d.reclaimable_bytes,
                "resident_bytes": d.resident_bytes,
                "free_bytes": d.free_bytes,
                "fits": d.fits,
                "weights_bytes": d.weights_bytes,
                "repack_bytes": d.repack_bytes,
                "kv_cache_bytes": d.kv_cache_bytes,
                "recurrent_state_bytes": d.recurrent_state_bytes,
                "compute_bytes": d.compute_bytes,
                "output_bytes": d.output_bytes,
                "overhead_bytes": d.overhead_bytes,
                "projector_bytes": d.projector_bytes,
                "speculative_bytes": d.speculative_bytes,
                "layers": d.layers,
            }
            for d in e.devices
        ],
        "kv_caches": [c.model_dump() | {"total_bytes": c.total_bytes} for c in e.kv_caches],
        "projector": projector_json(e),
        "speculative": speculative_json(e),
        "fits": e.fits,
        # a draft's architecture and tensors are its file's, not settings
        "settings": e.settings.model_dump(exclude={"speculative": {"architecture", "tensors"}}),
    }
