"""Tensors and ggml's storage types: how many bytes a tensor of a given type and shape takes."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from math import prod


class GGMLType(IntEnum):
    """ggml's tensor types (the ggml_type enum; values as stored in GGUF files)."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39


# (elements per block, bytes per block), as in ggml's type traits.
BLOCK: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4),
    GGMLType.F16: (1, 2),
    GGMLType.BF16: (1, 2),
    GGMLType.F64: (1, 8),
    GGMLType.I8: (1, 1),
    GGMLType.I16: (1, 2),
    GGMLType.I32: (1, 4),
    GGMLType.I64: (1, 8),
    GGMLType.Q4_0: (32, 18),
    GGMLType.Q4_1: (32, 20),
    GGMLType.Q5_0: (32, 22),
    GGMLType.Q5_1: (32, 24),
    GGMLType.Q8_0: (32, 34),
    GGMLType.Q8_1: (32, 36),
    GGMLType.Q2_K: (256, 84),
    GGMLType.Q3_K: (256, 110),
    GGMLType.Q4_K: (256, 144),
    GGMLType.Q5_K: (256, 176),
    GGMLType.Q6_K: (256, 210),
    GGMLType.Q8_K: (256, 292),
    GGMLType.IQ2_XXS: (256, 66),
    GGMLType.IQ2_XS: (256, 74),
    GGMLType.IQ3_XXS: (256, 98),
    GGMLType.IQ1_S: (256, 50),
    GGMLType.IQ4_NL: (32, 18),
    GGMLType.IQ3_S: (256, 110),
    GGMLType.IQ2_S: (256, 82),
    GGMLType.IQ4_XS: (256, 136),
    GGMLType.IQ1_M: (256, 56),
    GGMLType.TQ1_0: (256, 54),
    GGMLType.TQ2_0: (256, 66),
    GGMLType.MXFP4: (32, 17),
}

# KV-cache types accepted by llama.cpp's -ctk / -ctv.
CACHE_TYPES: dict[str, GGMLType] = {
    "f32": GGMLType.F32,
    "f16": GGMLType.F16,
    "bf16": GGMLType.BF16,
    "q8_0": GGMLType.Q8_0,
    "q4_0": GGMLType.Q4_0,
    "q4_1": GGMLType.Q4_1,
    "iq4_nl": GGMLType.IQ4_NL,
    "q5_0": GGMLType.Q5_0,
    "q5_1": GGMLType.Q5_1,
}


def is_quantized(ggml_type: GGMLType) -> bool:
    return BLOCK[ggml_type][0] > 1


def row_bytes(ggml_type: GGMLType, n_elements: int) -> int:
    """Bytes of one row of ``n_elements`` values (ggml_row_size). Raises ValueError on a bad width."""
    block_elems, block_bytes = BLOCK[ggml_type]
    if n_elements % block_elems:
        raise ValueError(f"{n_elements} values cannot be stored as {ggml_type.name} (blocks of {block_elems})")
    return n_elements // block_elems * block_bytes


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor: its GGUF name, storage type and shape (ggml order: ne[0] is the row width).

    ``n_bytes`` and ``layer`` (the block index of ``blk.N.*`` tensors, else None) are worked out
    once here, because the estimator reads them for every tensor on every slider step. Raises
    ValueError when the row width does not fit the type's block size.
    """

    name: str
    ggml_type: GGMLType
    shape: tuple[int, ...]
    n_bytes: int = field(init=False, repr=False, compare=False)
    layer: int | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        rows = prod(self.shape[1:]) if len(self.shape) > 1 else 1
        object.__setattr__(self, "n_bytes", rows * row_bytes(self.ggml_type, self.shape[0]))
        layer = int(self.name.split(".", 2)[1]) if self.name.startswith("blk.") else None
        object.__setattr__(self, "layer", layer)

    @property
    def n_elements(self) -> int:
        return prod(self.shape)
