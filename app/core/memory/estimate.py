"""The estimator: how much memory llama.cpp will allocate, per device, for a model and settings.

One pure function, :func:`estimate`, turns a model (architecture + tensor list), the context
settings and the target devices into a per-device breakdown. Every term follows llama.cpp
(vendored by llama-cpp-python 0.3.36) and is checked against its no-alloc dry run in
tests/test_proof.py:

- weights: each tensor's real bytes, placed as llama.cpp places them (token embedding on the CPU,
  the last ``n_gpu_layers`` layers on the GPUs, the output layer counting as layer ``n_layer``);
- CPU repack: on x86 with AVX2, Q4_0/Q4_K/IQ4_NL/MXFP4 matrices kept on the CPU are copied into an
  interleaved buffer on top of the memory-mapped file;
- KV cache: cells (context padded to 256 per sequence stream) x per-layer K and V row sizes, with
  a second, smaller cache for sliding-window layers unless ``swa_full``;
- recurrent state: Mamba conv + SSM state per sequence;
- compute buffer: the peak of live intermediates of the worst-case graph (see ``compute_bytes``);
- output buffer: n_vocab x n_seq x 4 bytes of logits, in host memory;
- runtime overhead per GPU: an explicit assumption (CUDA context, cuBLAS workspace, pools).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from functools import lru_cache

from app.core.common.errors import EstimateError
from app.core.common.units import GIB, MIB
from app.core.memory import backends
from app.core.memory.backends import Backend
from app.core.memory.compute import (
    fa_scratch_bytes,
)
from app.core.memory.consumers import ollama_batch_tokens, ollama_default_context
from app.core.memory.graphs import allowance_bytes, allowance_key, measured_tables
from app.core.memory.kv import (
    context_cells,
    kv_caches,
    layer_cache_bytes,
    mask_bytes,
    memo_per_arch,
    recurrent_state_bytes_per_layer,
)
from app.core.memory.layers import TensorTotals, breakdown_indices, device_runs, layer_devices, tensor_totals
from app.core.memory.records import (
    CPU_RUNTIME_OVERHEAD_BYTES,
    DeviceBreakdown,
    Estimate,
    Settings,
    SpeculativeEstimate,
    SpeculativeSpec,
    Target,
)
from app.core.memory.speculative import head_output_bytes, mtp_compute_bytes, mtp_kv_bytes, supports_mtp
from app.core.memory.splits import device_compute_bytes
from app.core.model.architecture import Architecture
from app.core.model.coverage import APPROXIMATE_NOTE, ArchCoverage, coverage
from app.core.model.projector import ProjectorEstimate, ProjectorSpec, estimate_projector
from app.core.model.tensors import TensorInfo


def resolve_backend(settings: Settings, gpus: Sequence[Target]) -> Backend:
    """The llama.cpp build an estimate models: the one asked for, or by the GPUs' vendor (CPU
    without GPUs). A GPU build with no GPU target behaves as the CPU build."""
    if not gpus:
        return "cpu"
    if settings.backend != "auto":
        return settings.backend
    return backends.default_backend(gpus[0].efficiency_class)


def estimate(
    arch: Architecture,
    tensors: Sequence[TensorInfo],
    settings: Settings,
    targets: list[Target],
) -> Estimate:
    """Memory llama.cpp will use on each target for ``arch`` with ``tensors`` under ``settings``.

    ``targets`` holds zero or more GPUs and exactly one CPU (host memory) entry; with no GPU, the
    whole model runs on the CPU. All figures are bytes. With GPUs, the buffers follow the build in
    ``settings.backend`` (see :mod:`app.core.memory.backends`): no repacking beside a host buffer type, op
    offload into GPU 0's compute buffer, the pinned host compute buffer, pipeline-parallel copies.

    Raises EstimateError for settings llama.cpp refuses (a quantized V cache without flash
    attention, a context beyond MAX_CONTEXT_TOKENS) or a target list without a CPU.
    """
    cpus = [t for t in targets if t.kind == "cpu"]
    gpus = [t for t in targets if t.kind == "gpu"]
    if len(cpus) != 1:
        raise EstimateError("An estimate needs exactly one CPU (host memory) target.")
    cpu = cpus[0]
    n_layer = arch.n_layer
    backend = resolve_backend(settings, gpus)
    if settings.gpu_layers == "auto":
        raise EstimateError("-ngl auto is placed by auto_fit (as llama.cpp's --fit), not by one estimate.")
    ngl = (n_layer + 1) if settings.gpu_layers == "all" else min(settings.gpu_layers, n_layer + 1)
    if not gpus:
        ngl = 0
    layer_dev = layer_devices(n_layer, ngl, tuple(g.capacity_bytes for g in gpus))
    device_of = layer_dev.__getitem__
    layer_counts: dict[int, int] = {}
    for dev, first, end in device_runs(layer_dev[:n_layer]):
        layer_counts[dev] = layer_counts.get(dev, 0) + end - first

    n_dev = len(gpus)
    totals = tensor_totals(arch, tensors)
    cpu_moe = min(settings.n_cpu_moe, n_layer) if arch.moe is not None and gpus else 0
    # Host-resident weights take the GPU's pinned host buffer type before the repack types
    # (make_cpu_buft_list): a CUDA/ROCm/Vulkan build repacks nothing.
    repacks = settings.repack != "none" and not (gpus and backends.has_host_buffer(backend))
    weights = [0] * (n_dev + 1)  # index -1 → CPU (last slot)
    repack = 0
    repack_by_layer = totals.repack_bytes[settings.repack]
    weights[-1] += totals.input_bytes
    for dev, first, end in device_runs(layer_dev):
        weights[dev] += sum(totals.layer_bytes[first:end])
        if dev != -1 and first < cpu_moe:
            # --n-cpu-moe: these layers' routed experts stay in host memory.
            moved = sum(totals.expert_bytes[first : min(end, cpu_moe)])
            weights[-1] += moved
            weights[dev] -= moved
        if dev == -1 and repacks:
            repack += sum(repack_by_layer[first:end])
    reclaimable = 0
    if repacks and not settings.mmap:
        # Without mmap a repacked tensor is loaded straight into the repack buffer: no second copy.
        weights[-1] -= repack
    elif repacks:
        # With mmap the loader reads each repacked tensor from the mapped file once, into the repack
        # buffer (llama_model_loader::load_all_data -> ggml_backend_tensor_set -> the repack
        # buffer's set_tensor); its mapped pages stay as clean page cache that nothing reads again, so
        # the kernel drops them when memory is short instead of killing the process.
        reclaimable = repack
    out_dev = device_of(n_layer)
    if not totals.has_output and out_dev != -1:
        # Tied embeddings: the output layer on a GPU gets its own copy of the token embedding.
        weights[out_dev] += totals.token_embd_bytes

    caches = kv_caches(arch, settings)
    kv = [0] * (n_dev + 1)
    runs = device_runs(layer_dev)
    for detail, group in caches:
        per_layer = layer_cache_bytes(detail, group)
        for dev, first, end in runs:
            # A cache's layers are in order: count those in this run of one device's layers.
            kv[dev] += per_layer * (bisect_left(group, end) - bisect_left(group, first))
    state = [0] * (n_dev + 1)
    per_layer_state = recurrent_state_bytes_per_layer(arch, settings)
    recurrent = memo_per_arch(arch, ("recurrent",), lambda: [i for i in range(n_layer) if arch.is_recurrent_layer(i)])
    for i in recurrent:
        state[device_of(i)] += per_layer_state

    cells, _ = context_cells(settings)
    details = [d for d, _ in caches]
    swa_cells = next((d.cells for d in details if d.kind == "swa"), None)
    full_cells = next((d.cells for d in details if d.kind == "full"), cells)
    allowance = allowance_bytes(arch, settings, full_cells if caches else cells)
    gpu_used = sorted(set(layer_dev) - {-1})
    masks = mask_bytes(settings, details)
    gpu_build = bool(gpus) and backend != "cpu"
    n_kv = full_cells if caches else cells
    compute = device_compute_bytes(
        arch, settings, caches, layer_dev, n_dev, backend, totals, cpu_moe, masks, (n_kv, swa_cells)
    )
    output = max(1, settings.parallel_sequences) * arch.n_vocab * 4
    scratch = fa_scratch_bytes(arch, settings, details, backend) if gpu_build else 0

    breakdown = []
    for g, target in enumerate(gpus):
        layers_here = layer_counts.get(g, 0)
        busy = g in gpu_used or compute[g] > 0
        breakdown.append(
            DeviceBreakdown(
                name=target.name,
                kind="gpu",
                capacity_bytes=target.capacity_bytes,
                weights_bytes=weights[g],
                repack_bytes=0,
                kv_cache_bytes=kv[g],
                recurrent_state_bytes=state[g],
                compute_bytes=compute[g],
                output_bytes=0,
                overhead_bytes=(target.runtime_overhead_bytes + (scratch if g in gpu_used else 0)) if busy else 0,
                layers=layers_here,
            )
        )
    breakdown.append(
        DeviceBreakdown(
            name=cpu.name,
            kind="cpu",
            capacity_bytes=cpu.capacity_bytes,
            weights_bytes=weights[-1],
            repack_bytes=repack,
            kv_cache_bytes=kv[-1],
            recurrent_state_bytes=state[-1],
            compute_bytes=compute[-1],
            output_bytes=output,
            overhead_bytes=cpu.runtime_overhead_bytes,
            layers=layer_counts.get(-1, 0),
            reclaimable_bytes=reclaimable,
        )
    )
    projector, projector_device = _place_projector(settings, breakdown, gpu_build)
    speculative = _place_speculative(arch, totals, settings, targets, breakdown, layer_dev)
    rules = coverage(arch.arch)
    return Estimate(
        settings=settings,
        devices=tuple(breakdown),
        kv_caches=tuple(details),
        model_bytes=totals.model_bytes,
        gpu_layers=ngl,
        n_layer=n_layer,
        layer_devices=breakdown_indices(layer_dev, len(breakdown)),
        assumptions=tuple(
            _assumptions(settings, gpus, cpu, backend, repacks, cpu_moe, rules, arch.n_embd_per_layer > 0)
        )
        + _projector_notes(projector, projector_device, breakdown)
        + _speculative_notes(speculative, breakdown)
        + _mtp_head_notes(arch, totals.unloaded_bytes, settings)
        + _allowance_notes(arch, allowance),
        backend=backend,
        cpu_moe_layers=cpu_moe,
        runtime_scratch_bytes=scratch,
        rules=rules.status,
        architecture=arch.arch,
        projector=projector,
        projector_device=projector_device,
        speculative=speculative,
        compute_allowance_bytes=allowance,
    )


def _place_projector(
    settings: Settings, breakdown: list[DeviceBreakdown], gpu_build: bool
) -> tuple[ProjectorEstimate | None, int | None]:
    """Add the ``--mmproj`` projector to the device mtmd puts it on: the first GPU with a GPU build
    and offload on (``clip_ctx`` takes the first GPU backend when ``use_gpu``), else host memory
    (the last entry of ``breakdown``, which is changed in place)."""
    if settings.mmproj is None:
        return None, None
    projector = _projector_estimate(settings.mmproj, settings.flash_attn)
    index = 0 if gpu_build and settings.mmproj_offload else len(breakdown) - 1
    device = breakdown[index]
    breakdown[index] = device.model_copy(update={"projector_bytes": projector.total_bytes})
    return projector, index


def _projector_notes(
    projector: ProjectorEstimate | None, index: int | None, breakdown: list[DeviceBreakdown]
) -> tuple[str, ...]:
    if projector is None or index is None:
        return ()
    where = breakdown[index]
    place = (
        f"The vision projector goes on {where.name}, as mtmd places it (the first GPU unless "
        "--no-mmproj-offload; not yet checked on a GPU)."
        if where.kind == "gpu"
        else f"The vision projector runs in host memory ({where.name})."
    )
    return (*projector.assumptions, place)


def _place_speculative(
    arch: Architecture,
    totals: TensorTotals,
    settings: Settings,
    targets: list[Target],
    breakdown: list[DeviceBreakdown],
    layer_dev: tuple[int, ...],
) -> SpeculativeEstimate | None:
    """Add speculative decoding's second context to the devices llama-server puts it on (changes
    ``breakdown`` in place). A draft model is estimated like any model, on the same devices, with its
    own -ngld, the draft cache types and one logits row per slot; its share of the process overhead
    is not counted twice. The MTP head's weights and context go where the model's last layer is (the
    NextN layers are its last), its logits in host memory.

    Raises EstimateError when the model has no MTP head llama.cpp can run."""
    spec = settings.speculative
    if spec is None:
        return None
    n_dev = len(breakdown)
    by_device = [0] * n_dev
    if spec.kind == "draft":
        assert spec.architecture is not None
        draft_settings = settings.model_copy(
            update={
                "speculative": None,
                "mmproj": None,
                "cache_type_k": spec.cache_type_k,
                "cache_type_v": spec.cache_type_v,
                "gpu_layers": "all" if spec.gpu_layers is None else spec.gpu_layers,
                "n_cpu_moe": 0,
                "consumer": "llama-server",
            }
        )
        draft = estimate(spec.architecture, spec.tensors, draft_settings, targets)
        for i, d in enumerate(draft.devices):
            by_device[i] = d.total_bytes - d.overhead_bytes
        weights = draft.weights_bytes + draft.repack_bytes
        kv = draft.kv_cache_bytes + draft.recurrent_state_bytes
        compute, output = draft.compute_bytes, draft.output_bytes
    else:
        if not supports_mtp(arch):
            raise EstimateError(
                f"{arch.name} has no multi-token-prediction head llama.cpp can draft with: use a draft "
                "model (-md) instead, or a GGUF that keeps the MTP block."
            )
        where = layer_dev[arch.n_layer - 1] % n_dev
        weights = totals.unloaded_bytes
        kv = mtp_kv_bytes(arch, settings, spec)
        compute = mtp_compute_bytes(arch, settings)
        output = head_output_bytes(arch, settings)
        by_device[where] += weights + kv + compute
        by_device[-1] += output
    for i, extra in enumerate(by_device):
        if extra:
            breakdown[i] = breakdown[i].model_copy(update={"speculative_bytes": extra})
    return SpeculativeEstimate(
        spec=spec,
        weights_bytes=weights,
        kv_cache_bytes=kv,
        compute_bytes=compute,
        output_bytes=output,
        by_device=tuple(by_device),
    )


def _speculative_notes(spec: SpeculativeEstimate | None, breakdown: list[DeviceBreakdown]) -> tuple[str, ...]:
    if spec is None:
        return ()
    places = ", ".join(f"{breakdown[i].name} {b / MIB:,.0f} MiB" for i, b in enumerate(spec.by_device) if b)
    what = (
        "the model's MTP head (--spec-type draft-mtp: loaded with the model, its own KV cache over the MTP layers)"
        if spec.spec.kind == "mtp"
        else f"the draft model {spec.spec.name} (-md: its weights, KV cache and buffers)"
    )
    return (
        f"Speculative decoding keeps {what} beside the model: {places}; its cache uses "
        f"-ctkd {spec.spec.cache_type_k} -ctvd {spec.spec.cache_type_v} (not yet checked on a GPU).",
    )


def _allowance_notes(arch: Architecture, allowance: int) -> tuple[str, ...]:
    """The measured compute allowance, when one applies: an assumption line, not a hidden term."""
    if not allowance:
        return ()
    source = "measured on this model" if measured_tables(arch) else f"the widest measured on {allowance_key(arch)}"
    if allowance > 0:
        what = (
            f"a measured allowance of {allowance / MIB:,.1f} MiB for where ggml's allocator places the "
            "logits and the last hidden state"
        )
    else:
        what = f"a measured correction of {allowance / MIB:,.1f} MiB to the modelled layers' peak"
    return (
        f"Compute buffers include {what} ({source}: the largest shortfall of the modelled peak against "
        "llama.cpp's dry run at these settings, scripts/fit_compute_allowance.py), so they are not below "
        "llama.cpp's there.",
    )


def _mtp_head_notes(arch: Architecture, unloaded_bytes: int, settings: Settings) -> tuple[str, ...]:
    """Whether the file's MTP (NextN) head is loaded, and what loading it costs."""
    if not arch.n_nextn_layers or (settings.speculative is not None and settings.speculative.kind == "mtp"):
        return ()
    head = f"The file's multi-token-prediction head ({arch.n_nextn_layers} layer(s), {unloaded_bytes / MIB:,.0f} MiB)"
    if not supports_mtp(arch):
        return (f"{head} is not loaded: this llama.cpp cannot draft with it (load_mtp off).",)
    spec = SpeculativeSpec(kind="mtp", name="the model's MTP head")
    kv = mtp_kv_bytes(arch, settings, spec)
    compute = mtp_compute_bytes(arch, settings) + head_output_bytes(arch, settings)
    return (
        f"{head} is not loaded (load_mtp off). Drafting with it (llama-server --spec-type draft-mtp; "
        f"fitscope estimate --mtp) loads it and adds {kv / MIB:,.0f} MiB of KV cache and "
        f"{compute / MIB:,.0f} MiB of buffers at these settings.",
    )


@lru_cache(maxsize=32)
def _projector_estimate(spec: ProjectorSpec, flash_attn: bool) -> ProjectorEstimate:
    return estimate_projector(spec, flash_attn)


def _assumptions(
    settings: Settings,
    gpus: list[Target],
    cpu: Target,
    backend: str,
    repacks: bool,
    cpu_moe: int,
    rules: ArchCoverage,
    per_layer_table: bool = False,
) -> list[str]:
    out = [] if rules.status == "exact" else [f"{APPROXIMATE_NOTE.capitalize()} ({rules.arch}): {rules.detail}."]
    out += [
        f"llama.cpp settings: {settings.describe()}; a {backend.upper() if backend != 'cpu' else 'CPU'} build "
        f"of llama.cpp, as {settings.consumer} uses it.",
        "Weights are summed tensor by tensor; "
        + (
            "the token embedding and the per-layer embedding table always stay in host memory."
            if per_layer_table
            else "the token embedding always stays in host memory."
        ),
        f"Host runtime overhead (process, libraries, threads): {CPU_RUNTIME_OVERHEAD_BYTES // MIB} MiB.",
    ]
    if settings.consumer == "llama-server":
        out.append(
            f"llama-server reserves logits for its {settings.parallel_sequences} slot(s) only (n_outputs_max), "
            "so its compute and output buffers are smaller than llama-cpp-python's."
        )
    if settings.consumer == "ollama":
        vram = sum(g.capacity_bytes for g in gpus)
        out.append(
            f"Ollama runs llama-server with -b and -ub {ollama_batch_tokens(settings.context_tokens)} at this context "
            "(unless num_batch is set); with no num_ctx it would give a model "
            f"{ollama_default_context(vram, 1 << 30):,} tokens on {vram / GIB:.0f} GiB of GPU memory."
        )
    if gpus and not repacks and backends.has_host_buffer(backend):
        out.append(
            "Weights left in host memory are "
            + ("memory-mapped from the file" if settings.mmap else "in pinned host memory (--no-mmap)")
            + "; a GPU build repacks nothing."
        )
    if cpu_moe:
        out.append(f"The routed experts of the first {cpu_moe} layers stay in host memory (--n-cpu-moe {cpu_moe}).")
    if gpus:
        out.append(
            f"Per-GPU runtime overhead not printed by llama.cpp (CUDA context, cuBLAS workspace, memory pool): "
            f"{gpus[0].runtime_overhead_bytes // MIB} MiB each (public logs show 0.3-0.6 GiB)."
        )
        out.append("Layers are split across GPUs in proportion to their memory, as llama.cpp's default split.")
    if repacks:
        out.append(
            f"CPU weight repacking ({settings.repack}): repacked matrices take extra host memory beside "
            "the memory-mapped file."
            + (
                " The mapped pages of those matrices are never read again after loading: the kernel can drop "
                "them (reclaimable page cache), so the verdict counts only what must stay resident."
                if settings.mmap
                else ""
            )
        )
    return out
