"""Quantization A/B from the terminal: ``fitscope compare`` (task suites, token agreement and KL
divergence on 2-4 quantized variants of one model, and the variant to pick per task), ``fitscope
suites`` (the suites, and adding examples of your own task) and ``fitscope quantize`` (a variant
made with llama.cpp's quantizer).
"""

from __future__ import annotations

import argparse
import json
import sys

from app.cli import clean_message
from app.core.common.errors import FitScopeError
from app.core.common.units import GIB, MIB


def cmd_quantize(args: argparse.Namespace) -> int:
    from app.adapters.quantizer import default_variant_path, quantize

    target = args.output or default_variant_path(args.gguf, args.type)
    last = [-1]

    def progress(done: int, total: int) -> None:
        percent = 100 * done // max(total, 1)
        if percent // 10 != last[0] // 10:
            print(f"  {percent:3d}% ({done}/{total} tensors)", file=sys.stderr)
            last[0] = percent

    out = quantize(args.gguf, target, args.type, on_progress=progress)
    print(f"{out} ({out.stat().st_size / MIB:,.1f} MiB)")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from app.adapters.ab_compare import compare_variants
    from app.adapters.host import detect_host
    from app.adapters.user_suites import load_user_suites
    from app.core.memory.targets import cpu_target, host_ram_target, repack_profile, target_from_device
    from app.core.model.catalog import find_device
    from app.core.quality.quant_compare import routing_config, to_toml
    from app.core.quality.suite_reading import builtin_suites, find_suite

    yours = [u.suite for u in load_user_suites()[0]]
    suites = [find_suite(s, yours) for s in args.suite] if args.suite else [*builtin_suites().values(), *yours]
    host = detect_host(measure_bandwidth=False)
    if args.gpu:
        device = find_device(args.gpu)
        targets = [target_from_device(device), host_ram_target(host.ram_total_bytes)]
        hardware = device.name
    else:
        targets = [cpu_target(host)]
        hardware = f"this machine's CPU ({host.cpu_model})"

    def progress(fraction: float, message: str) -> None:
        if not args.json:
            print(f"  {fraction:4.0%} {message}", file=sys.stderr)

    divergence = None
    if not args.no_kl:
        from app.adapters.divergence_runner import DivergenceSettings, builtin_text, read_text

        text, text_name = builtin_text() if args.kl_text == "builtin" else read_text(args.kl_text)
        divergence = DivergenceSettings(
            text=text, text_name=text_name, max_tokens=args.kl_tokens, chunk_tokens=args.kl_chunk
        )
    comparison = compare_variants(
        args.gguf,
        suites,
        targets,
        hardware,
        repack=repack_profile(host),
        context_tokens=args.ctx_size,
        gpu_layers=args.n_gpu_layers,
        on_progress=progress,
        divergence=divergence,
    )
    config = routing_config(comparison)
    if args.routing_config:
        path = args.routing_config
        text = to_toml(config) if path.endswith(".toml") else json.dumps(config, indent=2)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    report = config | {
        "suites": [{"name": s.name, "task": s.task, "quality_floor": s.quality_floor} for s in suites],
        "details": [
            {
                "name": v.label,
                "reference": v.is_reference,
                "file_bytes": v.file_bytes,
                "estimated_total_bytes": v.estimated_total_bytes,
                "peak_rss_bytes": v.peak_rss_bytes,
                "decode_tokens_per_s": v.decode_tokens_per_s,
                "prefill_tokens_per_s": v.prefill_tokens_per_s,
                "ttft_s": v.ttft_s,
                "n_threads": v.n_threads,
                "prompt_format": v.prompt_format,
                "identical_token_share": v.identical_token_share,
                "top1_agreement": v.top1_agreement,
                "divergence": v.divergence.model_dump(mode="json") if v.divergence else None,
                "answers": [
                    {
                        "suite": a.suite,
                        "prompt": a.prompt_id,
                        "passed": a.result.passed,
                        "reason": a.result.reason,
                        "text": a.text,
                    }
                    for a in v.answers
                ],
            }
            for v in comparison.variants
        ],
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    names = [s.name for s in suites]
    print(f"{'variant':28s} {'memory':>9s} {'tok/s':>7s} {'same tok':>8s} {'top-1':>6s}  " + "  ".join(names))
    for v in comparison.variants:
        same = "ref" if v.is_reference else f"{v.identical_token_share or 0:.0%}"
        top1 = "ref" if v.is_reference else f"{v.top1_agreement or 0:.0%}"
        rates = "  ".join(f"{v.pass_rates.get(n, 0):>{len(n)}.0%}" for n in names)
        print(
            f"{v.label[:28]:28s} {v.estimated_total_bytes / GIB:8.2f}G {v.decode_tokens_per_s or 0:7.1f} "
            f"{same:>8s} {top1:>6s}  {rates}"
        )
    if any(v.divergence for v in comparison.variants):
        from app.core.quality.divergence import meaning

        print("\nMeasured on this model (95% intervals):")
        for v in comparison.variants:
            d = v.divergence
            if d is None:
                continue
            if d.is_reference or d.kl_mean is None:
                print(f"  {v.label}: reference, perplexity {d.perplexity.text('.3f')}")
                continue
            p99 = d.kl_p99.text(".3f") if d.kl_p99 else "-"
            print(
                f"  {v.label}: KL mean {d.kl_mean.text('.4f')}, 99th percentile {p99}"
                f"\n    Δ perplexity {d.delta_perplexity.text('+.3f') if d.delta_perplexity else '-'}, "
                f"same top token {d.same_top.text('.1%') if d.same_top else '-'}\n    {meaning(d)}"
            )
        for note in comparison.notes[1:]:
            print(f"  {note}")
    for advice in comparison.advice:
        print(f"\n{advice.profile} (floor {advice.floor:.0%}): {advice.chosen or 'no variant qualifies'}")
        for reason in advice.reasons:
            print(f"  - {reason}")
    return 0


def _read_stdin_prompt() -> str:
    """The prompt piped to ``suites --add -``, read with a cap: a stream without end is refused
    after MAX_EXAMPLE_CHARS characters, never read whole."""
    from app.adapters.user_suites import MAX_EXAMPLE_CHARS

    text = sys.stdin.read(MAX_EXAMPLE_CHARS + 1)
    if len(text) > MAX_EXAMPLE_CHARS:
        raise FitScopeError(f"The prompt on standard input is longer than {MAX_EXAMPLE_CHARS:,} characters.")
    return text


def cmd_suites(args: argparse.Namespace) -> int:
    from app.adapters.user_suites import add_example, load_user_suites, user_suites_dir
    from app.core.quality.suite_reading import builtin_suites

    if args.add is not None:
        if not args.expect:
            raise FitScopeError("--add needs --expect: the answer you expect to the prompt.")
        prompt = _read_stdin_prompt() if args.add == "-" else args.add
        saved = add_example(prompt, args.expect, args.check, suite_name=args.to)
        added = saved.suite.prompts[-1]
        count = len(saved.suite.prompts)
        noun = "prompt" if count == 1 else "prompts"
        print(f"Added '{added.id}' ({args.check}) to {saved.suite.name}: {count} {noun} in {saved.path}")
        print(f"Use it: fitscope compare --gguf A.gguf --gguf B.gguf --suite {saved.suite.name}")
        return 0
    yours, problems = load_user_suites()
    rows = [(s, "built-in") for s in builtin_suites().values()] + [(u.suite, str(u.path)) for u in yours]
    print(f"{'suite':16s} {'task':13s} {'prompts':>7s} {'floor':>5s}  checks / where")
    for suite, where in rows:
        floor = f"{suite.quality_floor:.0%}" if suite.quality_floor is not None else "-"
        kinds = ", ".join(sorted({p.check.kind for p in suite.prompts}))
        print(f"{suite.name[:16]:16s} {suite.task:13s} {len(suite.prompts):7d} {floor:>5s}  {kinds} / {where}")
    if not yours:
        print(f"\nNo suites of yours yet in {user_suites_dir()}; add an example with")
        print('  fitscope suites --add "PROMPT" --expect "ANSWER" [--check contains|exact|similar]')
    for problem in problems:
        print(f"fitscope: {clean_message(problem)}", file=sys.stderr)
    return 0
