"""Time reading a remote GGUF header: the demo model's (Gemma 3 270M, a 262,144-token vocabulary:
a 6.2 MiB header) over loopback, from a Hub-shaped HTTP server in this process
(tests/support/fake_remote.py), as ``fitscope estimate --hf`` reads it.

    python scripts/bench_remote.py [--repeat 5] [--gguf PATH]

Prints, as medians over the repeats: a cold read through huggingface_hub's session (the listing,
then the header's range requests, each a fresh cache), the same ranges over a bare httpx2 client
(what the library's session costs), a second read from the header cache, and the local reader on
the file itself; with the bytes the server sent and the requests it answered.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.adapters.header_cache import HeaderCache
from app.adapters.hf_hub import display_path, file_source
from app.adapters.remote_gguf import read_remote_header
from app.core.model.gguf_model import read_gguf
from app.core.report.choices import ModelChoice
from app.services.remote import Fetch, load_remote_model
from tests.support.fake_remote import FakeRemote, HubRepo

REPO = "bench/gemma-3-270m-GGUF"
MIB = 1024 * 1024


def _median_ms(times: list[float]) -> str:
    return f"{statistics.median(times) * 1000:7.1f} ms (min {min(times) * 1000:.1f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--gguf", type=Path, default=None, help="another GGUF to serve (default: the demo model)")
    args = parser.parse_args(argv)
    if args.gguf is None:
        from app.adapters.demo_model import demo_model_path

        args.gguf = demo_model_path()
    path: Path = args.gguf
    header_bytes = read_gguf(path).data_offset
    scratch = Path(tempfile.mkdtemp(prefix="fitscope-bench-remote-"))
    os.environ["FITSCOPE_CACHE_DIR"] = str(scratch / "cache")

    with FakeRemote() as server:
        server.hub[REPO] = HubRepo({path.name: path})
        os.environ["HF_ENDPOINT"] = server.url
        choice = ModelChoice(kind="hf", ref=f"{REPO}/{path.name}")
        import httpx2

        cold, bare, warm, local = [], [], [], []
        sent = requests = 0
        for i in range(max(1, args.repeat)):
            server.reset_counts()
            fetch = Fetch(cache=HeaderCache(scratch / f"cold-{i}"))
            start = time.perf_counter()
            load_remote_model(choice, fetch)
            cold.append(time.perf_counter() - start)
            sent, requests = server.file_bytes, len([r for r in server.requests if r[1].startswith("/cdn/")])

            source = file_source(REPO, server.hub[REPO].sha, path.name)
            with httpx2.Client() as client:
                start = time.perf_counter()
                read_remote_header(client, source, display_path(REPO, path.name))
                bare.append(time.perf_counter() - start)

            start = time.perf_counter()
            load_remote_model(choice, fetch)  # the same cache: no request
            warm.append(time.perf_counter() - start)

            start = time.perf_counter()
            read_gguf(path)
            local.append(time.perf_counter() - start)

    print(f"{path.name}: {path.stat().st_size / MIB:,.1f} MiB file, header {header_bytes / MIB:,.2f} MiB")
    print(f"  remote, cold (listing + ranges, huggingface_hub session): {_median_ms(cold)}")
    print(
        f"      sent {sent / MIB:,.2f} MiB of the file in {requests} range requests "
        f"({sent / header_bytes:.2f}x the header)"
    )
    print(f"  the same ranges over a bare httpx2 client:               {_median_ms(bare)}")
    print(f"  remote, from the header cache:                           {_median_ms(warm)}")
    print(f"  local file (read_gguf):                                  {_median_ms(local)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
