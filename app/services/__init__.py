"""Qt-free services: the flows that both the command line (``app.cli``) and the window (``app.ui``)
run, written once. A service takes what the caller detected or chose (a ``Machine``, a choice of
hardware or model) and returns typed records; callers keep only presentation.

Layers: ``app.core`` (pure) < ``app.adapters`` (NVML, host, llama.cpp, files) < ``app.services`` <
``app.ui`` and ``app.cli``."""
