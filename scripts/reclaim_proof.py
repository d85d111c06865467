"""Show that a CPU build of llama.cpp runs in less memory than its mapped file plus its repacked copy.

    sudo .venv/bin/python scripts/reclaim_proof.py            # the demo model and an 8B test file
    sudo .venv/bin/python scripts/reclaim_proof.py --gguf X   # a file of your own

With mmap (llama.cpp's default), the CPU backend reads each repackable tensor (Q4_0, Q4_K, IQ4_NL,
MXFP4 on x86) from the mapped file once, into its interleaved repack buffer; the mapped pages of
those tensors are then clean page cache that nothing reads again, and the kernel drops them when
memory is short. FitScope's verdict counts what must stay resident (``DeviceBreakdown.resident_bytes``)
and shows the rest as reclaimable. This script loads each model and decodes a few tokens in a child
process inside a memory cgroup (v1 ``/sys/fs/cgroup/memory`` or v2) whose limit is below FitScope's
old "needed" figure (mapped file + repacked copy + the rest) and a little above the resident figure,
and prints whether the kernel had to kill it. Without a cgroup (not root), it prints the child's
RSS and proportional set size after loading and after the page cache is dropped.

The 8B test file is sparse (tests/support/synthetic_gguf.py: the real tensor layout of Llama 3.1 8B
Q4_K_M, zeros that take no disk): llama.cpp maps, reads and repacks it as it would the real one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.core.common.units import GIB, MIB  # noqa: E402

CHILD = r"""
import json, sys, time
import numpy as np
from llama_cpp import Llama

def rollup():
    out = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[0].rstrip(":") in ("Rss", "Pss", "Pss_File", "Pss_Anon"):
                out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return out

path, n_ctx, threads, gen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t = time.time()
llm = Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_gpu_layers=0, use_mmap=True, verbose=False)
loaded = rollup()
tokens = [1 + (i * 7919) % 1000 for i in range(32)]
llm.eval(tokens)
for _ in range(gen):
    llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
print(json.dumps({"loaded": loaded, "decoded": rollup(), "seconds": round(time.time() - t, 1)}), flush=True)
"""


def estimate_for(path: str, context: int):
    """FitScope's CPU-build estimate of ``path`` at ``context`` on this machine's CPU."""
    from app.adapters.host import detect_host
    from app.core.memory.estimate import estimate
    from app.core.memory.records import Settings
    from app.core.memory.targets import cpu_target, repack_profile
    from app.core.model.source import model_from_gguf

    host = detect_host(measure_bandwidth=False)
    model = model_from_gguf(path)
    settings = Settings(context_tokens=context, repack=repack_profile(host), mmap=True)
    return model, estimate(model.arch, model.tensors, settings, [cpu_target(host)])


class MemoryCgroup:
    """A memory cgroup (v1 or v2) with a limit, for one child process; None when there is none here."""

    def __init__(self, name: str, limit_bytes: int) -> None:
        v1 = Path("/sys/fs/cgroup/memory")
        v2 = Path("/sys/fs/cgroup")
        if v1.is_dir():
            self.path, self.v2 = v1 / name, False
        elif (v2 / "cgroup.controllers").exists():
            self.path, self.v2 = v2 / name, True
        else:
            raise OSError("no memory cgroup controller on this machine")
        self.path.mkdir(exist_ok=True)
        (self.path / ("memory.max" if self.v2 else "memory.limit_in_bytes")).write_text(str(limit_bytes))
        if not self.v2 and (self.path / "memory.memsw.limit_in_bytes").exists():
            # No swap here: the limit is on memory alone (memsw stays at its maximum).
            pass

    def join(self) -> None:
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def figures(self) -> dict[str, int]:
        if self.v2:
            events = dict(line.split() for line in (self.path / "memory.events").read_text().splitlines())
            peak = self.path / "memory.peak"
            return {
                "peak_bytes": int(peak.read_text()) if peak.exists() else -1,
                "oom_kill": int(events.get("oom_kill", 0)),
            }
        control = dict(line.split() for line in (self.path / "memory.oom_control").read_text().splitlines())
        return {
            "peak_bytes": int((self.path / "memory.max_usage_in_bytes").read_text()),
            "oom_kill": int(control.get("oom_kill", 0)),
            "failcnt": int((self.path / "memory.failcnt").read_text()),
        }

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def evict(path: str) -> None:
    """Drop the file's pages from the page cache (they would be charged to whoever read them first,
    not to the child's cgroup)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run_child(path: str, context: int, gen: int, cgroup: MemoryCgroup | None) -> tuple[int, dict | None, str]:
    evict(path)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, path, str(context), "2", str(gen)],
        capture_output=True,
        text=True,
        preexec_fn=cgroup.join if cgroup is not None else None,
        timeout=1800,
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("{")), None)
    return proc.returncode, json.loads(line) if line else None, proc.stderr[-500:]


def prove(path: str, context: int, gen: int, headroom_bytes: int) -> dict:
    model, est = estimate_for(path, context)
    cpu = est.devices[-1]
    old_needed = cpu.total_bytes
    limit = min(cpu.resident_bytes + headroom_bytes, old_needed - 256 * MIB)
    print(f"\n{model.label} ({Path(path).name}), CPU build, {context} tokens of context:")
    print(
        f"  FitScope: mapped file {cpu.weights_bytes / GIB:.2f} GiB + repacked copy {cpu.repack_bytes / GIB:.2f} GiB + "
        f"KV/compute/output/overhead {(cpu.total_bytes - cpu.weights_bytes - cpu.repack_bytes) / GIB:.2f} GiB"
    )
    print(
        f"  old 'needed' (everything): {old_needed / GIB:.2f} GiB; resident: {cpu.resident_bytes / GIB:.2f} GiB; "
        f"reclaimable page cache: {cpu.reclaimable_bytes / GIB:.2f} GiB"
    )
    cgroup = None
    try:
        cgroup = MemoryCgroup(f"fitscope_reclaim_{os.getpid()}", limit)
        print(f"  memory cgroup limit: {limit / GIB:.2f} GiB ({cgroup.path})")
    except OSError as exc:
        print(f"  no memory cgroup ({exc}); measuring RSS/PSS only")
    try:
        code, figures, err = run_child(path, context, gen, cgroup)
        out = {"model": model.label, "old_needed_bytes": old_needed, "resident_bytes": cpu.resident_bytes}
        out |= {"reclaimable_bytes": cpu.reclaimable_bytes, "limit_bytes": limit, "exit_code": code}
        if cgroup is not None:
            out |= cgroup.figures()
            killed = code in (-9, 137) or out.get("oom_kill", 0) > 0
            verdict = "KILLED by the OOM killer" if killed else ("ran to the end" if code == 0 else f"failed ({code})")
            print(
                f"  child: {verdict}; peak cgroup usage {out['peak_bytes'] / GIB:.2f} GiB "
                f"(limit {limit / GIB:.2f} GiB, below the old figure by {(old_needed - limit) / GIB:.2f} GiB); "
                f"OOM kills: {out.get('oom_kill', 0)}"
            )
        if figures is not None:
            for stage in ("loaded", "decoded"):
                f = figures[stage]
                print(
                    f"  after {stage}: RSS {f.get('Rss', 0) / GIB:.2f} GiB, PSS {f.get('Pss', 0) / GIB:.2f} GiB "
                    f"(file-backed {f.get('Pss_File', 0) / GIB:.2f}, anonymous {f.get('Pss_Anon', 0) / GIB:.2f})"
                )
            out["child"] = figures
        elif err:
            print(f"  child stderr: {err.strip()}")
        return out
    finally:
        if cgroup is not None:
            cgroup.remove()


def make_test_file(directory: Path) -> Path:
    """A sparse GGUF with Llama 3.1 8B Q4_K_M's real tensor layout."""
    from app.core.model.source import model_from_catalog
    from tests.support.synthetic_gguf import write_sparse_gguf

    model = model_from_catalog("llama-3.1-8b", "Q4_K_M")
    path = directory / "llama-3.1-8b-Q4_K_M-sparse.gguf"
    write_sparse_gguf(path, model.arch, "Q4_K_M")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--gguf", action="append", help="a GGUF file (repeat); default: the demo model and an 8B test file"
    )
    parser.add_argument("-c", "--ctx-size", type=int, default=2048)
    parser.add_argument("--generate", type=int, default=8, help="tokens to decode after a 32-token prompt")
    parser.add_argument("--headroom-mib", type=int, default=384, help="cgroup limit above the resident figure")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = args.gguf
        if not paths:
            from app.adapters.demo_model import demo_model_path

            paths = [str(demo_model_path()), str(make_test_file(Path(tmp)))]
        for path in paths:
            results.append(prove(path, args.ctx_size, args.generate, args.headroom_mib * MIB))
    if args.json:
        print(json.dumps(results, indent=2))
    return 0 if all(r["exit_code"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
