"""``fitscope tune`` (and ``fitscope estimate --fastest``): the fastest llama-server settings that fit
a model on some hardware, with their commands, predicted speeds and what each trades; ``--check``
runs them on this machine and prints predicted against measured.

The hardware and llama.cpp flags are read as ``fitscope estimate`` reads them (``-c`` is the context
that must fit, ``-np`` the users); the search chooses -ngl, --n-cpu-moe, -ub/-b, the KV type,
flash attention and -t (``app.services.tuning``).
"""

from __future__ import annotations

import argparse
import json
import sys


def cmd_tune(args: argparse.Namespace) -> int:
    from app.cli.estimate import _controls, _model, _targets
    from app.core.memory.targets import repack_of_device, repack_profile
    from app.core.model.catalog import find_device
    from app.core.speed.tuning import Goal
    from app.services.tuning import check_live, require_local_file, tune

    if not (args.gguf or args.hf_config or args.model):
        from app.adapters.demo_model import demo_model_path

        args.gguf = str(demo_model_path())
    model = _model(args)
    targets, host, machine = _targets(args)
    controls = _controls(args)
    catalog = [g for g in args.gpu or [] if g != "local"]
    repack = repack_of_device(find_device(catalog[0])) if machine is None else repack_profile(host)
    goal: Goal = "prompt" if getattr(args, "goal", "decode") == "prompt" else "decode"
    result = tune(
        model,
        controls,
        targets,
        repack=repack,
        model_path=args.gguf or "MODEL.gguf",
        goal=goal,
        prompt_tokens=args.prompt_tokens,
        top=getattr(args, "top", 3),
    )
    checks = []
    if getattr(args, "check", False):
        path = require_local_file(args.gguf)

        def progress(line: str) -> None:
            if not args.json:
                print(line, file=sys.stderr)

        checks = check_live(result, path, on_progress=progress)
    if args.json:
        print(json.dumps(_json(result, checks), indent=2))
        return 0
    print(_text(result, checks))
    return 0


def _json(result, checks) -> dict:
    return {
        "model": result.model_label,
        "goal": result.goal,
        "search_s": round(result.search_s, 3),
        "settings": [
            {
                "rank": t.rank,
                "llama_server_command": t.command,
                "decode_tokens_per_s": {
                    "low": round(t.decode_tokens_per_s[0], 2),
                    "high": round(t.decode_tokens_per_s[1], 2),
                },
                "decode_typical": round(t.candidate.speed.decode_typical, 2),
                "prefill_tokens_per_s": {
                    "low": round(t.prefill_tokens_per_s[0], 2),
                    "high": round(t.prefill_tokens_per_s[1], 2),
                },
                "gpu_free_bytes": t.candidate.gpu_free_bytes,
                "host_free_bytes": t.candidate.host_free_bytes,
                "max_context_tokens_per_user": t.candidate.max_context_tokens,
                "trades": t.trades,
            }
            for t in result.settings
        ],
        "live_check": [
            {
                "rank": c.setting.rank,
                "predicted_decode": round(c.predicted_decode, 2),
                "measured_decode": c.measured_decode,
                "predicted_prefill": round(c.predicted_prefill, 2),
                "measured_prefill": c.measured_prefill,
            }
            for c in checks
        ],
    }


def _text(result, checks) -> str:
    goal = "decode speed" if result.goal == "decode" else f"time to answer a {result.prompt_tokens}-token prompt"
    lines = [f"Fastest settings for {result.model_label}, by {goal} (searched in {result.search_s:.2f} s):", ""]
    for t in result.settings:
        d_lo, d_hi = t.decode_tokens_per_s
        p_lo, p_hi = t.prefill_tokens_per_s
        lines += [
            f"{t.rank}. decode {d_lo:.1f}-{d_hi:.1f} tokens/s (typical {t.candidate.speed.decode_typical:.1f}); "
            f"prefill {p_lo:.0f}-{p_hi:.0f} tokens/s",
            f"   trades: {t.trades}",
            f"   {t.command}",
            "",
        ]
    if checks:
        lines.append("Checked on this machine (llama.cpp, llama-bench style):")
        lines.append(
            f"{'#':>2s} {'decode predicted':>17s} {'measured':>9s} {'error':>7s} "
            f"{'prefill predicted':>18s} {'measured':>9s}"
        )
        for c in checks:
            err = c.decode_error
            lines.append(
                f"{c.setting.rank:2d} {c.predicted_decode:17.1f} {c.measured_decode or 0:9.1f} "
                f"{(f'{100 * err:+.0f}%' if err is not None else '-'):>7s} {c.predicted_prefill:18.0f} "
                f"{c.measured_prefill or 0:9.0f}"
            )
    return "\n".join(lines)
