"""The llama.cpp settings a measurement uses when the user sets none: llama-server's and llama-bench's.

FitScope measures speed so that its figures, and every estimate calibrated from them, match what a
user gets from llama.cpp's own tools. llama-cpp-python's defaults differ from those tools in one way
that matters: with no ``n_threads`` it uses half the logical CPUs, while llama-server and
llama-bench use ``common_cpu_get_num_math()`` (vendored llama.cpp, ``common/common.cpp``): the
physical cores, without Intel's efficiency cores on hybrid x86 CPUs. On a 2-core machine without
SMT that is one thread against two, and about 25% of decode speed.

The other defaults, from ``common/common.h`` (``common_params``) and llama-bench's
``cmd_params_defaults`` (``tools/llama-bench/llama-bench.cpp``):

- ``n_batch`` 2048 and ``n_ubatch`` 512 (both tools);
- ``n_threads_batch`` = ``n_threads`` (``common_context_params_to_llama``: -1 means "as n_threads");
- flash attention ``auto``, which llama.cpp turns on when the device supports it (the CPU backend
  and every GPU backend FitScope models do); FitScope passes it as on;
- memory-mapped weights (``use_mmap`` true).

Every measuring worker (live runs, benchmark mode, the A/B suites, the batching probe, the dry
runs) takes its defaults from here; :func:`app.adapters.cpu_topology.llama_math_threads` supplies
the core count.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

N_BATCH = 2048
N_UBATCH = 512
FLASH_ATTN = True
USE_MMAP = True


class ThreadChoice(BaseModel):
    """The threads a measurement runs with and why: chosen by the user, or llama-server's default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_threads: int = Field(ge=1)
    llama_server_threads: int = Field(ge=1, description="what llama-server and llama-bench would use here")
    user_set: bool

    @property
    def is_llama_default(self) -> bool:
        return self.n_threads == self.llama_server_threads

    def describe(self) -> str:
        """One line for the window, the CLI and the history, e.g. '2 threads (like llama-server)'."""
        plural = "s" if self.n_threads != 1 else ""
        if self.is_llama_default:
            return f"{self.n_threads} thread{plural} (like llama-server)"
        return f"{self.n_threads} thread{plural} (llama-server would use {self.llama_server_threads})"


def choose_threads(requested: int | None, llama_server_threads: int) -> ThreadChoice:
    """The thread count for a measurement: ``requested`` when the user set one, else llama-server's.

    Raises ValueError when either count is below 1."""
    if llama_server_threads < 1:
        raise ValueError(f"llama_server_threads must be at least 1, got {llama_server_threads}")
    if requested is not None and requested < 1:
        raise ValueError(f"threads must be at least 1, got {requested}")
    return ThreadChoice(
        n_threads=requested if requested is not None else llama_server_threads,
        llama_server_threads=llama_server_threads,
        user_set=requested is not None,
    )


def thread_sweep(llama_server_threads: int, logical_cpus: int) -> tuple[int, ...]:
    """The thread counts a benchmark sweep tries: 1 up to the physical (math) cores, in steps that
    keep the sweep short on big machines (powers of two plus the end points), and the logical CPU
    count when it is larger (SMT threads rarely help matrix work; the sweep shows whether they do)."""
    top = max(1, llama_server_threads)
    counts = {1, top}
    step = 2
    while step < top:
        counts.add(step)
        step *= 2
    if logical_cpus > top:
        counts.add(logical_cpus)
    return tuple(sorted(counts))
