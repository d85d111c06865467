"""Does the installed llama.cpp run on this CPU? Setup asks once, right after building it.

llama.cpp compiled for another CPU (a wheel from a cache, built elsewhere) or with kernels this
machine cannot execute (its AMX matrix kernels on virtual machines that list AMX without keeping
its tile state) does not fail with an error: the process stops with "illegal instruction" the first
time a matrix multiply runs. The check loads the demo model in a separate process and decodes a few
tokens, so such a build is found at setup with a clear way out, not later as a vanished window.

``python -m app.adapters.selfcheck [MODEL]`` prints nothing and exits 0 when llama.cpp runs."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from app.adapters.child import child_env

# The child: load the model on the CPU, evaluate a short prompt (prefill: matrix-matrix kernels)
# and one token more (decode: matrix-vector kernels).
_DECODE_A_FEW_TOKENS = """
import sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=128, n_batch=64, n_gpu_layers=0, verbose=False)
tokens = llm.tokenize(b"The quick brown fox jumps over the lazy dog.")
llm.eval(tokens)
llm.eval([tokens[-1]])
print("ok")
"""

REBUILD_HINT = (
    "Rebuild it for this CPU without the kernels it cannot run, for example:\n"
    '  CMAKE_ARGS="-DGGML_RPC=ON -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" '
    ".venv/bin/pip install --force-reinstall --no-deps --no-cache-dir --no-binary llama-cpp-python "
    '"llama-cpp-python==$(.venv/bin/python -c \'import llama_cpp; print(llama_cpp.__version__)\')"'
)


def describe_failure(returncode: int, stderr: str) -> str | None:
    """What a user is told about the check's child ending with ``returncode``; None when it ran."""
    if returncode == 0:
        return None
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        if -returncode == signal.SIGILL:
            return (
                "The installed llama.cpp stops with an illegal instruction (SIGILL) on this CPU: "
                "it was built for a different processor or with kernels this machine cannot "
                "execute.\n" + REBUILD_HINT
            )
        return f"The installed llama.cpp stopped with {name} while decoding the demo model."
    last = [line for line in stderr.strip().splitlines() if line.strip()][-3:]
    detail = ("\n  " + "\n  ".join(last)) if last else ""
    return f"The installed llama.cpp could not decode the demo model (exit code {returncode}).{detail}"


def check_runs(model: Path, *, code: str = _DECODE_A_FEW_TOKENS, timeout_s: float = 180.0) -> str | None:
    """Run ``code`` with ``model`` in a new Python process; a message if it did not finish."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, str(model)],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            env=child_env(),
        )
    except subprocess.TimeoutExpired:
        return f"The installed llama.cpp did not decode a few tokens of the demo model in {timeout_s:.0f} s."
    return describe_failure(done.returncode, done.stderr)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args:
        model = Path(args[0])
    else:
        from app.adapters.demo_model import demo_model_path

        model = demo_model_path()
    problem = check_runs(model)
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
