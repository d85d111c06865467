#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and the CUDA toolkit: build llama-cpp-python with CUDA into
# .venv-cuda (once; ~10 minutes on 16 cores), then run scripts/gpu_proof.py, which prints llama.cpp's
# per-device buffers against FitScope's estimate for -ngl full, partial and 0, and a live run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"
if [ ! -x .venv-cuda/bin/python ]; then
    "$python" -m venv .venv-cuda
    .venv-cuda/bin/python -m pip install --quiet --upgrade pip wheel
    CMAKE_ARGS="-DGGML_CUDA=on" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
        .venv-cuda/bin/python -m pip install --quiet --no-cache-dir --no-binary llama-cpp-python -e ".[demo]"
fi
.venv-cuda/bin/python -c "import llama_cpp, sys; sys.exit(0 if llama_cpp.llama_supports_gpu_offload() else 1)" \
    || { echo "llama-cpp-python in .venv-cuda was built without CUDA; delete .venv-cuda and retry" >&2; exit 1; }
PYTHONUNBUFFERED=1 exec .venv-cuda/bin/python scripts/gpu_proof.py "$@"
