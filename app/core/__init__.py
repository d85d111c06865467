"""The pure core: what llama.cpp will allocate and how fast it runs, from models and hardware alone.

Packages, each importing only those listed before it (``tests/test_layers.py`` enforces the order):

1. ``common`` — errors, byte units, the immutable record base, safe file opening.
2. ``hardware`` — devices in the catalog and what was detected here (records only).
3. ``model`` — architectures, tensors and quantization, reading GGUF files and config.json, the
   catalogs, and which architectures' rules are proven.
4. ``memory`` — the estimator: llama.cpp's settings, KV cache and state, compute buffers, where
   layers go, auto-fit, GPU backends, the llama-server command.
5. ``speed`` — the speed model, its fitted constants, live measurements, the load simulation.
6. ``quality`` — task suites and their checks, KL divergence, the statistics of a comparison, chat
   templates, the quantization choice by the user's own task.
7. ``plans`` — one model over several GPUs or machines: llama.cpp's layer split, RPC, vLLM.
8. ``report`` — the user's choices in people's terms, the verdict's words, runs held against the
   estimate, the remembered settings.
9. ``advisor`` — the hardware advisor's machines, workload records and the bounds of its sweep.

Nothing in this package imports Qt, the adapters or the services.
"""
