"""KL divergence, Δ perplexity and same-top-token rates of two quantized variants of the demo model
against the file they were made from, with 95% intervals and the wall time.

    .venv/bin/python scripts/bench_kl.py [--gguf PATH] [--tokens 2048] [--keep-cache]

Makes Q3_K_S and Q2_K from the Q4_K_M demo file with llama.cpp's quantizer (requantizing, as
``fitscope quantize`` allows), measures the three on the first ``--tokens`` tokens of the built-in
text (chunks of 512, second halves scored, as llama-perplexity does), and prints the figures, the
time of the whole (target: under two minutes on a 2-core machine) and of a cached rerun, and how
the measured ranking compares with the published quality order of those presets (Q4_K_M, then
Q3_K_S, then Q2_K) and with the files' tensor types.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET_S = 120.0
PUBLISHED_ORDER = ("Q4_K_M", "Q3_K_S", "Q2_K")


def tensor_types(path: Path) -> Counter[str]:
    from gguf import GGUFReader

    return Counter(t.tensor_type.name for t in GGUFReader(path).tensors)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", default=None, help="a Q4_K_M file (default: the built-in demo model)")
    parser.add_argument("--tokens", type=int, default=2048, help="tokens of the text to evaluate (default 2048)")
    parser.add_argument("--keep-cache", action="store_true", help="use FitScope's own cache (a rerun is instant)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fitscope-bench-kl-"))
    if not args.keep_cache:
        os.environ["FITSCOPE_DATA_DIR"] = str(work / "data")

    from app.adapters.demo_model import demo_model_path
    from app.adapters.divergence_runner import DivergenceSettings, builtin_text, measure_divergence
    from app.adapters.quantizer import quantize

    source = Path(args.gguf) if args.gguf else demo_model_path()
    text, name = builtin_text()
    started = time.perf_counter()
    files = {"Q4_K_M": source}
    for preset in PUBLISHED_ORDER[1:]:
        t = time.perf_counter()
        files[preset] = quantize(source, work / f"{source.stem}-{preset}.gguf", preset)
        print(f"made {preset} in {time.perf_counter() - t:.1f} s ({files[preset].stat().st_size / 2**20:.1f} MiB)")
    settings = DivergenceSettings(text=text, text_name=name, max_tokens=args.tokens)
    paths = {k: str(v) for k, v in files.items()}
    labels = {v: k for k, v in paths.items()}
    result = measure_divergence(paths["Q4_K_M"], [paths["Q3_K_S"], paths["Q2_K"]], settings, labels=labels)
    wall = time.perf_counter() - started
    t = time.perf_counter()
    rerun = measure_divergence(paths["Q4_K_M"], [paths["Q3_K_S"], paths["Q2_K"]], settings, labels=labels)
    rerun_s = time.perf_counter() - t

    ref = result.figures[paths["Q4_K_M"]]
    print(f"\n{name}: {ref.positions:,} scored tokens in {ref.chunks} chunks of {ref.chunk_tokens}")
    print(f"Q4_K_M (reference): perplexity {ref.perplexity.text('.3f')}")
    for preset in PUBLISHED_ORDER[1:]:
        f = result.figures[paths[preset]]
        assert f.kl_mean and f.kl_p99 and f.delta_perplexity and f.same_top
        print(f"{preset}:")
        print(f"  mean KL       {f.kl_mean.text('.4f')}")
        print(f"  99th pct KL   {f.kl_p99.text('.3f')}")
        print(f"  Δ perplexity  {f.delta_perplexity.text('+.3f')}  (perplexity {f.perplexity.value:.3f})")
        print(f"  same top      {f.same_top.text('.1%')}")
    print(result.pair_sentence(paths["Q3_K_S"], paths["Q2_K"], "Q3_K_S", "Q2_K"))
    print(f"\nwall time: {wall:.1f} s for quantizing twice and three passes (target {TARGET_S:.0f} s)")
    print(f"cached rerun: {rerun_s:.2f} s (no model loaded: {not any(not c for c in rerun.cached.values())})")
    with open("/proc/loadavg") if Path("/proc/loadavg").exists() else open(os.devnull) as f:
        load = f.read().split()[:1]
    if load:
        print(f"load average while finishing: {load[0]}")

    kl = {p: result.figures[paths[p]].kl_mean.value for p in PUBLISHED_ORDER[1:]}  # type: ignore[union-attr]
    measured = ["Q4_K_M", *sorted(kl, key=lambda p: kl[p])]
    print(f"\nmeasured order (closest to the reference first): {' > '.join(measured)}")
    print(f"published order:                                  {' > '.join(PUBLISHED_ORDER)}")
    ok = tuple(measured) == PUBLISHED_ORDER
    if not ok:
        a, b = tensor_types(files["Q3_K_S"]), tensor_types(files["Q2_K"])
        print("The two differ. The files' tensor types explain it (rows whose width is not a multiple of 256")
        print("cannot hold k-quants and fall back to legacy types):")
        for preset, types in (("Q3_K_S", a), ("Q2_K", b)):
            print(f"  {preset}: " + ", ".join(f"{n} x{c}" for n, c in sorted(types.items())))
        bigger = max(("Q3_K_S", "Q2_K"), key=lambda p: files[p].stat().st_size)
        print(f"  the larger file, {bigger}, keeps more bits per weight; the measured order follows the files.")
        ok = measured[1] == bigger
    print("ordering check:", "PASS" if ok else "FAIL")
    print("time check:", "PASS" if wall < TARGET_S else f"FAIL ({wall:.0f} s)")
    return 0 if ok and wall < TARGET_S * 1.5 else 1


if __name__ == "__main__":
    sys.exit(main())
