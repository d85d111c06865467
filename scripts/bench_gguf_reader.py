"""Time FitScope's GGUF header reader on one file: the median of 5 reads.

python scripts/bench_gguf_reader.py path/to/model.gguf [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.core.common.errors import ModelFileError
from app.core.model.gguf_model import read_gguf


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="a .gguf file")
    parser.add_argument("--repeat", type=int, default=5, help="number of reads (default 5)")
    args = parser.parse_args(argv)

    times = []
    model = None
    for _ in range(max(1, args.repeat)):
        start = time.perf_counter()
        try:
            model = read_gguf(args.path)
        except ModelFileError as exc:
            print(exc, file=sys.stderr)
            return 1
        times.append(time.perf_counter() - start)

    assert model is not None
    a = model.architecture
    weights_mib = model.weights_bytes / 2**20
    file_mib = model.file_size_bytes / 2**20
    print(f"{args.path}")
    print(
        f"  {a.arch}, {a.n_layer} layers, vocab {a.n_vocab:,}, {len(model.tensors)} tensors, "
        f"{weights_mib:,.1f} MiB of weights in a {file_mib:,.1f} MiB file"
    )
    print(
        f"  read time: median {statistics.median(times) * 1000:.1f} ms over {len(times)} reads "
        f"(min {min(times) * 1000:.1f} ms, max {max(times) * 1000:.1f} ms)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
