"""The GPU proof: llama.cpp's own buffers on this machine's NVIDIA GPU against FitScope's estimate.

    .venv-cuda/bin/python scripts/gpu_proof.py        (scripts/gpu_proof.sh builds that venv)

For sparse synthetic GGUFs of real architectures (no download: the files are headers with real
tensor shapes and types), llama.cpp's no-alloc dry run reports what a CUDA build would allocate
with -ngl full, partial and 0; each printed buffer per device (CUDA0 compute, CUDA_Host compute,
the KV per device, the output buffer) is set against the estimator with the CUDA build rules. Then
a live run of the demo model with every layer on the GPU reports the real buffers too. Exits 1
when llama-cpp-python has no GPU offload or no NVIDIA GPU is visible.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.adapters.llamacpp_probe import dry_run  # noqa: E402
from app.adapters.nvml import NvmlMonitor  # noqa: E402
from app.core.memory.estimate import estimate  # noqa: E402
from app.core.memory.records import Settings  # noqa: E402
from app.core.memory.targets import host_ram_target, target_from_gpu  # noqa: E402
from app.core.model.catalog import find_model  # noqa: E402
from app.core.model.quant import find_preset, quantize_layout  # noqa: E402
from app.core.model.source import model_from_gguf  # noqa: E402
from tests.support.synthetic_gguf import write_sparse_gguf  # noqa: E402

MIB = 1024**2
CASES = [
    # (catalog model, preset, context, flash attention, K/V type, -ngl: None = all)
    ("llama-3.1-8b", "Q4_K_M", 8192, True, "f16", None),
    ("llama-3.1-8b", "Q4_K_M", 8192, True, "f16", 16),
    ("llama-3.1-8b", "Q4_K_M", 8192, True, "f16", 0),
    ("llama-3.1-8b", "Q4_K_M", 32768, False, "f16", None),
    ("qwen3-30b-a3b", "Q4_K_M", 16384, True, "q8_0", None),
    ("qwen3-30b-a3b", "Q4_K_M", 16384, True, "f16", 20),
    ("gemma-3-12b", "Q4_K_M", 16384, True, "f16", None),
    ("gpt-oss-20b", "MXFP4_MOE", 16384, True, "f16", None),
    # Per-layer inputs copied from host memory below the logits; shared-KV layers reading the caches
    # of layers left in host memory (20 of 36 offloaded): measured over RPC, unchecked on CUDA.
    ("gemma-4-e2b", "Q4_K_M", 32768, True, "f16", None),
    ("gemma-4-e2b", "Q4_K_M", 32768, True, "f16", 20),
]


def _row(name: str, printed: int | None, estimated: int) -> str:
    if printed is None:
        return f"  {name:26s} {'-':>12s} {estimated / MIB:11.2f}M"
    diff = estimated - printed
    pct = 100 * diff / printed if printed else 0.0
    return f"  {name:26s} {printed / MIB:11.2f}M {estimated / MIB:11.2f}M {diff / MIB:+9.2f}M {pct:+6.1f}%"


def main() -> int:
    import llama_cpp

    status = NvmlMonitor().status()
    if not status.available or not llama_cpp.llama_supports_gpu_offload():
        print("needs an NVIDIA GPU and a CUDA build of llama-cpp-python (scripts/gpu_proof.sh builds one)")
        return 1
    gpus = [target_from_gpu(g) for g in status.gpus]
    targets = [*gpus, host_ram_target(64 * 1024**3, 50.0)]
    print(f"GPUs: {', '.join(g.name for g in status.gpus)}; llama-cpp-python {llama_cpp.__version__}\n")
    work = Path(tempfile.mkdtemp())
    for model_id, preset, n_ctx, fa, kv, ngl in CASES:
        arch = find_model(model_id)
        tensors = quantize_layout(arch, find_preset(preset))
        path = work / f"{model_id}-{preset}.gguf"
        if not path.exists():
            write_sparse_gguf(path, arch, preset, tensors)
        layers = arch.n_layer + 1 if ngl is None else ngl
        r = dry_run(path, n_ctx=n_ctx, flash_attn=fa, type_k=kv, type_v=kv, n_gpu_layers=layers, swa_full=True)
        settings = Settings(
            context_tokens=n_ctx, flash_attn=fa, cache_type_k=kv, cache_type_v=kv, gpu_layers=layers, backend="cuda"
        )
        est = estimate(arch, tensors, settings, targets)
        print(f"{model_id} {preset} -c {n_ctx} -fa {'on' if fa else 'off'} -ctk/-ctv {kv} -ngl {layers}")
        print(f"  {'buffer':26s} {'llama.cpp':>12s} {'FitScope':>12s} {'diff':>10s} {'%':>7s}")
        for i, d in enumerate(est.devices[:-1]):
            name = f"CUDA{i}"
            print(_row(f"{name} compute", r.compute_bytes_by_device.get(name), d.compute_bytes))
        host = est.devices[-1]
        host_name = next((k for k in r.compute_bytes_by_device if not k.startswith("CUDA") or "Host" in k), "CPU")
        print(_row(f"{host_name} compute", r.compute_bytes_by_device.get(host_name), host.compute_bytes))
        print(_row("KV (all devices)", r.kv_cache_bytes, est.kv_cache_bytes))
        print(_row("output", r.output_bytes, est.output_bytes))
        print(f"  layers offloaded: {r.layers_offloaded}/{r.layers_offloadable}; estimate {est.gpu_layers}\n")

    from app.adapters.demo_model import demo_model_path
    from app.adapters.llamacpp_runner import run_live
    from app.core.report.run_vs_estimate import compare_buffers, estimate_for_run
    from app.core.speed.measure import RunSettings

    demo = str(demo_model_path())
    result = run_live(RunSettings(gguf_path=demo, gpu_layers=-1, prompt="Hello", max_tokens=64, ignore_eos=True))
    model = model_from_gguf(demo)
    run_est = estimate_for_run(result, model.arch, model.tensors, targets, "x86-avx2")
    rate = result.runs[0].decode_tokens_per_s_llama
    print(f"Live run of the demo model, every layer on the GPU: decode {rate} tok/s")
    for c in compare_buffers(result, run_est.estimate):
        print(_row(c.buffer, c.measured_bytes, c.estimated_bytes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
