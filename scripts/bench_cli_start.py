"""Cold start of the command line: `fitscope estimate` for a catalog model on a catalog GPU, and
`fitscope --help`, each run N times in a fresh interpreter. Prints the median and worst wall time,
the median CPU time (user + system) and the target; it does not fail when over.

    .venv/bin/python scripts/bench_cli_start.py [--runs 10]

Where bytecode writing is off (PYTHONDONTWRITEBYTECODE), FitScope's own modules are compiled from
source at every start; the figures are then given twice: as this environment runs the command, and
with compiled bytecode kept in a temporary folder, as an installed FitScope starts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 0.2
ESTIMATE = ["estimate", "--model", "llama-3.1-8b", "-c", "8192", "--gpu", "rtx-4090", "--json"]
COMMANDS = {
    "fitscope " + " ".join(ESTIMATE): ESTIMATE,
    "fitscope --help": ["--help"],
}


def _children_cpu_s() -> float:
    times = os.times()  # of the finished children: user + system
    return times.children_user + times.children_system


def time_run(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one fresh process running ``argv``; raises when it fails."""
    cpu0 = _children_cpu_s()
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return wall, _children_cpu_s() - cpu0


def report(label: str, samples: list[tuple[float, float]], target_s: float | None) -> None:
    walls = [wall for wall, _ in samples]
    median = statistics.median(walls)
    line = (
        f"  {label:70s} wall median {median:.3f} s, worst {max(walls):.3f} s; "
        f"CPU median {statistics.median(cpu for _, cpu in samples):.3f} s"
    )
    if target_s is not None:
        line += f"  (target {target_s:.1f} s: {'within' if median <= target_s else 'over'})"
    print(line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="fresh processes per command (default 10)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter (default: this one)")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")

    with tempfile.TemporaryDirectory(prefix="fitscope-bytecode-") as cache:
        modes = {"as this environment runs it": dict(os.environ)}
        if os.environ.get("PYTHONDONTWRITEBYTECODE"):
            installed = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            modes["with compiled bytecode, as installed"] = installed | {"PYTHONPYCACHEPREFIX": cache}
        commands = {"python -c pass (the interpreter alone)": [args.python, "-c", "pass"]}
        commands |= {label: [args.python, "-m", "app.cli", *argv] for label, argv in COMMANDS.items()}
        for env in modes.values():  # the first run writes the bytecode where it is kept; not counted
            for argv in commands.values():
                time_run(argv, env)
        # Round-robin, so that a change in the machine's load weighs on every figure alike.
        samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for _ in range(args.runs):
            for title, env in modes.items():
                for label, argv in commands.items():
                    samples.setdefault((title, label), []).append(time_run(argv, env))
    print(f"{args.runs} runs each, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    for title in modes:
        print(f"\n{title}:")
        for label in commands:
            target = TARGET_S if label.startswith("fitscope estimate") else None
            report(label, samples[(title, label)], target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
