"""Hardware as records: the catalog's devices (GPUs, Apple and unified-memory machines, CPU servers),
what was detected on this machine (GPUs, host CPU and RAM), and the host memory kinds beside GPUs.
No detection happens here: the adapters fill these records in."""
