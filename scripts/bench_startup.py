"""Cold start: from launching `fitscope window --demo` to a usable window (shown) and to its first
estimate on screen, on this machine, offscreen. Several launches; median and worst are printed.

    .venv/bin/python scripts/bench_startup.py [--runs 5] [--exe PATH]    # PATH: e.g. a bundle

Target: a usable window within 3 s.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--exe", default=str(ROOT / ".venv" / "bin" / "fitscope"))
    args = parser.parse_args()
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", FITSCOPE_REPORT_STARTUP="1")
    shown, first = [], []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as cfg, tempfile.TemporaryDirectory() as data:
            env |= {"FITSCOPE_CONFIG_DIR": cfg, "FITSCOPE_DATA_DIR": data}
            out = subprocess.run([args.exe, "window", "--demo"], env=env, capture_output=True, text=True, timeout=120)
        m = re.search(r"window shown ([\d.]+) s, first estimate on screen ([\d.]+) s", out.stdout)
        if not m:
            print(
                f"run {i + 1}: no startup report (exit {out.returncode}): {out.stderr.strip()[-300:]}", file=sys.stderr
            )
            return 1
        shown.append(float(m[1]))
        first.append(float(m[2]))
        print(f"run {i + 1}: window shown {shown[-1]:.2f} s, first estimate {first[-1]:.2f} s")
    print(
        f"\nwindow shown: median {statistics.median(shown):.2f} s, worst {max(shown):.2f} s (target 3 s); "
        f"first estimate: median {statistics.median(first):.2f} s, worst {max(first):.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
