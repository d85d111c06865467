"""Adapters to the outside world: NVML, the host, llama.cpp. No Qt here either."""
