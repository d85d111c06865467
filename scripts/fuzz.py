"""A long fuzz run over FitScope's inputs, with counts by outcome.

    .venv/bin/python scripts/fuzz.py [--gguf 20000] [--config 2000] [--cli 1000]
        [--templates 500] [--suites 2000] [--kept-runs 1000] [--settings 1000] [--seed 1]

GGUF headers are structure-aware mutations of small valid files of three shapes and of the real
demo model's header; config.json files vary every key a reader uses with extreme and ill-typed
values; command lines combine every estimate option with hostile values. Each case ends as clean
(FitScope's one-line refusal), accepted, traceback, hang (over 5 s) or memory (over 300 MB of
Python allocations). The targets: 0 tracebacks, 0 hangs, peak memory under 300 MB.

What files control is a second table: chat templates (rendered through the product's own child
process), suites (random regexes, JSON Schema patterns and $refs, hostile answer prefixes), kept
runs and settings files (valid ones with a node replaced, cut short, deep, NaN, not UTF-8, a FIFO
or a link to /dev/zero). There a hang is over 10 s and memory over 1 GB (Python allocations, or the
renderer child's peak). This process is itself held to 4 GiB of address space, so that a
regression fails a case instead of taking the machine down.
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from tests.fuzz_targets import (  # noqa: E402
    command_case,
    config_case,
    gguf_case,
    kept_run_case,
    mutate_gguf,
    random_command,
    random_config,
    random_suite,
    random_template,
    settings_case,
    small_seeds,
    suite_case,
    template_case,
)


def _seeds(folder: Path) -> list[bytes]:
    seeds = small_seeds(folder)
    try:
        from app.adapters.demo_model import demo_model_path
        from app.core.model.gguf_model import read_gguf

        demo = demo_model_path()
        header = read_gguf(demo).data_offset
        with demo.open("rb") as f:
            seeds.append(f.read(header + 4096))  # the real header, tensor data cut off
    except Exception as exc:
        print(f"(demo model header not used: {exc})")
    return seeds


def report(name: str, outcomes: list) -> bool:
    counts = collections.Counter(o.kind for o in outcomes)
    slowest = max((o.seconds for o in outcomes), default=0.0)
    peak = max((o.peak_bytes for o in outcomes), default=0)
    print(
        f"{name:14s} {len(outcomes):7,d} cases: clean {counts['clean']:,}, accepted {counts['accepted']:,}, "
        f"traceback {counts['traceback']}, hang {counts['hang']}, memory {counts['memory']}; "
        f"slowest {slowest:.2f} s, peak memory {peak / 1024**2:.1f} MB"
    )
    for o in outcomes:
        if o.kind in ("traceback", "hang", "memory"):
            print(f"    {o.kind}: {o.detail}")
            break
    return not (counts["traceback"] or counts["hang"] or counts["memory"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=int, default=20000)
    parser.add_argument("--config", type=int, default=2000)
    parser.add_argument("--cli", type=int, default=1000)
    parser.add_argument("--templates", type=int, default=500)
    parser.add_argument("--suites", type=int, default=2000)
    parser.add_argument("--kept-runs", type=int, default=1000)
    parser.add_argument("--settings", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    import logging
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (4 * 1024**3, 4 * 1024**3))
    logging.disable(logging.WARNING)  # the refusals are counted, not logged one by one
    rng = random.Random(args.seed)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        seeds = _seeds(work)
        case = work / "case.gguf"
        # The demo header is 100x the small seeds: one case in fifty uses it.
        ggufs = [
            gguf_case(mutate_gguf(seeds[-1] if rng.random() < 0.02 else rng.choice(seeds[:3]), rng), case)
            for _ in range(args.gguf)
        ]
        configs = [config_case(random_config(rng)) for _ in range(args.config)]
        commands = [command_case(random_command(rng, work)) for _ in range(args.cli)]
        templates = [template_case(random_template(rng)) for _ in range(args.templates)]
        suites = [suite_case(*random_suite(rng)) for _ in range(args.suites)]
        kept = [kept_run_case(rng, work / "data") for _ in range(args.kept_runs)]
        settings = [settings_case(rng, work / "config") for _ in range(args.settings)]
    print("Headers, configs and command lines (hang > 5 s, memory > 300 MB of Python allocations):")
    ok = report("GGUF headers", ggufs) & report("config.json", configs) & report("command lines", commands)
    print("\nWhat files control (hang > 10 s, memory > 1 GB):")
    ok &= report("chat templates", templates) & report("suites", suites)
    ok &= report("kept runs", kept) & report("settings files", settings)
    print(f"\n{time.perf_counter() - started:.0f} s; {'no defect found' if ok else 'DEFECTS FOUND'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
