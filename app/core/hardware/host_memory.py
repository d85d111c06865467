"""Host memory beside catalog GPUs, by what the box would have: the kinds ``--host-memory`` names.

Plain data, imported by the command line's parser without the records of ``app.core.hardware.snapshots``.
"""

from __future__ import annotations

# Theoretical peak = channels x 8 bytes x transfers/s (JEDEC speed grades), in GB/s. Decode reads
# experts and CPU layers from it.
HOST_MEMORY: dict[str, tuple[str, float]] = {
    "ddr4-3200-2ch": ("DDR4-3200, 2 channels (desktop)", 51.2),
    "ddr5-5600-2ch": ("DDR5-5600, 2 channels (desktop)", 89.6),
    "ddr5-6400-4ch": ("DDR5-6400, 4 channels (Threadripper)", 204.8),
    "ddr5-4800-8ch": ("DDR5-4800, 8 channels (Xeon, Threadripper PRO)", 307.2),
    "ddr5-6000-12ch": ("DDR5-6000, 12 channels (EPYC 9005)", 576.0),
}
DEFAULT_HOST_MEMORY = "ddr5-5600-2ch"
