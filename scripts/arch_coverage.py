"""Which llama.cpp architectures FitScope estimates exactly, approximately, or not at all.

    python scripts/arch_coverage.py            # the table, checked against the installed llama.cpp
    python scripts/arch_coverage.py --refresh vendor/llama.cpp/src/llama-arch.cpp --version 0.3.36

``--refresh`` rewrites resources/llamacpp_architectures.json from a llama.cpp source tree's
``LLM_ARCH_NAMES`` table. Without it, every listed name is also looked up in the installed
llama.cpp library, so the list cannot drift from what actually loads.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.cli import main as cli_main
from app.core.model.coverage import ARCHITECTURES_PATH, llamacpp_architectures


def names_from_source(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    block = re.search(r"LLM_ARCH_NAMES\s*=\s*\{(.*?)\n\};", text, re.S)
    if block is None:
        raise SystemExit(f"{path}: no LLM_ARCH_NAMES table")
    names = re.findall(r'\{\s*LLM_ARCH_\w+\s*,\s*"([^"]+)"\s*\}', block.group(1))
    # "clip" is a placeholder for the quantizer and "(unknown)" the fallback; neither loads as a model.
    return [n for n in names if n not in ("clip", "(unknown)")]


def installed_library() -> Path | None:
    try:
        import llama_cpp
    except ImportError:
        return None
    libs = sorted(Path(llama_cpp.__file__).parent.glob("lib/libllama*"))
    return libs[0] if libs else None


def missing_from_library(names: list[str] | tuple[str, ...], lib: Path) -> list[str]:
    # The linker merges a name into a longer one it ends (qwen2 inside rwkv6qwen2): match the tail.
    data = lib.read_bytes()
    return [n for n in names if n.encode() + b"\0" not in data]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--refresh", type=Path, help="llama-arch.cpp to read the architecture names from")
    parser.add_argument("--version", default="", help="the llama-cpp-python version that source belongs to")
    args = parser.parse_args()
    if args.refresh:
        names = names_from_source(args.refresh)
        payload = {
            "llama_cpp_python": args.version,
            "source": "LLM_ARCH_NAMES in vendor/llama.cpp/src/llama-arch.cpp",
            "architectures": names,
        }
        ARCHITECTURES_PATH.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {len(names)} architectures to {ARCHITECTURES_PATH}")
        return 0
    cli_main(["architectures"])
    _, names = llamacpp_architectures()
    lib = installed_library()
    if lib is None:
        print("llama_cpp is not installed: the list was not checked against a library")
        return 0
    missing = missing_from_library(names, lib)
    print(f"checked against {lib.name}: " + (f"missing {', '.join(missing)}" if missing else "every name present"))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
