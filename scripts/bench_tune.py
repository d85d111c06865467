"""How fast the fastest-settings search answers, and how well its best setting's speed holds on this
machine.

    .venv/bin/python scripts/bench_tune.py            # search times for 100B-class MoE models
    .venv/bin/python scripts/bench_tune.py --live     # also run the best settings here and compare

Target: under 2 s for a 100B-class mixture of experts on a catalog machine; on this machine, the top
candidate's measured decode within 15% of its prediction. The live check runs the demo model (or
--gguf) on this machine's CPU, llama-bench style (app.services.tuning.check_live), as
``fitscope tune --cpu --check`` does; the prediction uses this machine's measured memory bandwidth.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.core.common.units import GIB  # noqa: E402
from app.core.memory.targets import host_ram_target, target_from_device  # noqa: E402
from app.core.model.catalog import find_device  # noqa: E402
from app.core.model.source import model_from_catalog  # noqa: E402
from app.core.report.choices import Controls  # noqa: E402
from app.services.tuning import check_live, tune  # noqa: E402

CASES = (  # model, quantization, GPU, host RAM (GiB), context
    ("gpt-oss-120b", "MXFP4_MOE", "rtx-4070", 64, 16384),
    ("glm-4.5-air", "Q4_K_M", "rtx-4090", 96, 32768),
    ("qwen3-next-80b-a3b", "Q4_K_M", "rtx-5070", 64, 32768),
    ("qwen3-235b-a22b", "Q4_K_M", "rtx-5090", 192, 16384),
    ("llama-3.1-70b", "Q4_K_M", "rtx-3090", 64, 8192),
)


def search_times(repeat: int) -> None:
    label = f"search (median of {repeat})"
    print(f"{'model':22s} {'GPU':10s} {label:>22s}  best setting")
    for model_id, quant, gpu, ram, context in CASES:
        model = model_from_catalog(model_id, quant)
        targets = [target_from_device(find_device(gpu)), host_ram_target(ram * GIB)]
        controls = Controls(context_per_user_tokens=context)
        times = []
        result = None
        for _ in range(repeat):
            started = time.perf_counter()
            result = tune(model, controls, targets)
            times.append(time.perf_counter() - started)
        assert result is not None
        best = result.settings[0]
        flags = best.command.split(" -c ", 1)[1]
        print(
            f"{model_id:22s} {gpu:10s} {statistics.median(times):21.2f}s  decode "
            f"{best.candidate.speed.decode_typical:.1f} tok/s: -c {flags}"
        )


def live(gguf: str | None, repeat: int) -> int:
    from app.adapters.demo_model import demo_model_path
    from app.core.model.source import model_from_gguf
    from app.core.report.choices import HardwareChoice, resolve_targets
    from app.services.runs import detect_machine

    path = gguf or str(demo_model_path())
    model = model_from_gguf(path)
    machine = detect_machine(measure_bandwidth=True)
    targets = resolve_targets(HardwareChoice(kind="cpu"), machine)
    controls = Controls(context_per_user_tokens=2048, consumer="llama-cpp-python")
    result = tune(model, controls, targets, model_path=path, prompt_tokens=128)
    print(f"\n{model.label} on this machine's CPU ({targets[0].bandwidth_gb_s:.1f} GB/s measured):")
    checks = check_live(result, path, generate_tokens=48, repeat=repeat, on_progress=lambda line: print(" ", line))
    print(f"{'#':>2s} {'decode predicted':>17s} {'measured':>9s} {'error':>7s}")
    for c in checks:
        err = c.decode_error
        print(
            f"{c.setting.rank:2d} {c.predicted_decode:17.1f} {c.measured_decode or 0:9.1f} "
            f"{(f'{100 * err:+.0f}%' if err is not None else '-'):>7s}"
        )
    top = checks[0].decode_error if checks else None
    verdict = "met" if top is not None and abs(top) <= 0.15 else "NOT met"
    print(f"top candidate within 15% of its prediction: {verdict}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--live", action="store_true", help="run the best settings on this machine")
    parser.add_argument("--gguf", help="the model for --live (default: the demo model)")
    args = parser.parse_args()
    search_times(args.repeat)
    return live(args.gguf, 2) if args.live else 0


if __name__ == "__main__":
    sys.exit(main())
