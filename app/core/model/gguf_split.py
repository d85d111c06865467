"""Models split over several GGUF files (``gguf-split``, and the parts large uploads come in):
their names and how their headers make one model, as llama.cpp's ``llama_model_loader`` reads them
(src/llama-model-loader.cpp of the vendored llama.cpp).

A split model's parts are named ``{prefix}-{n:05d}-of-{count:05d}.gguf`` (``llama_split_path``,
src/llama.cpp), ``n`` counting from 1. The first part holds every metadata entry; each part says
which it is (``split.no``, from 0) and how many there are (``split.count``), and the first says how
many tensors all of them hold together (``split.tensors.count``). llama.cpp loads a split model
from its first part only, checks each part's number and the tensor total, and refuses a tensor
name seen twice: the checks below are the same, so a model it refuses is refused here too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from app.core.common.errors import ModelFileError
from app.core.model.gguf_reader import GgufHeader

SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"
SPLIT_NAME = re.compile(r"-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
MAX_SPLITS = 9999  # the five-digit names allow more; gguf-split's own tools never go near it


def _int(metadata: Mapping[str, Any], key: str) -> int | None:
    value = metadata.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def split_count(metadata: Mapping[str, Any]) -> int:
    """How many files the model is split over (1 for a model in one file)."""
    count = _int(metadata, SPLIT_COUNT)
    return count if count is not None and count > 1 else 1


def split_name_parts(name: str) -> tuple[str, int, int] | None:
    """(prefix, part number from 1, part count) of a split part's file name, or None."""
    m = SPLIT_NAME.search(name)
    if m is None:
        return None
    return name[: m.start()], int(m.group("no")), int(m.group("count"))


def split_part_names(name: str, count: int) -> list[str]:
    """The names of every part of the split model whose part ``name`` is, in order.

    Raises ModelFileError when ``name`` does not follow llama.cpp's split naming."""
    parts = split_name_parts(name)
    if parts is None or parts[2] != count:
        raise ModelFileError(
            f"{name} says it is split into {count} files, but its name does not end in "
            f"'-0000N-of-{count:05d}.gguf', so FitScope cannot tell the other parts' names."
        )
    prefix = parts[0]
    return [f"{prefix}-{n:05d}-of-{count:05d}.gguf" for n in range(1, count + 1)]


def check_first_part(header: GgufHeader) -> int:
    """The part count of a split model's first part (1 for an unsplit file). Raises ModelFileError
    for a later part: llama.cpp loads a split model from its first part only."""
    count = split_count(header.metadata)
    if count == 1:
        return 1
    if count > MAX_SPLITS:
        raise ModelFileError(f"{header.path} is corrupt: it says it is split into {count:,} files.")
    no = _int(header.metadata, SPLIT_NO)
    if no != 0:
        first = split_part_names(header.path.name, count)[0]
        raise ModelFileError(
            f"{header.path} is part {(no or 0) + 1} of {count} of a split model; open its first part ({first})."
        )
    return count


def merge_split_headers(headers: Sequence[GgufHeader]) -> GgufHeader:
    """One header for a split model: the first part's metadata and every part's tensors, in order.

    ``headers`` are the parts' headers, first part first. Raises ModelFileError for parts that do
    not belong together (wrong numbers, a tensor twice, a tensor total other than the first part's
    ``split.tensors.count``)."""
    first = headers[0]
    count = check_first_part(first)
    if count != len(headers):
        raise ModelFileError(f"{first.path} is split into {count} files, but {len(headers)} were read.")
    seen: set[str] = set()
    tensors = []
    for no, part in enumerate(headers):
        part_no, part_count = _int(part.metadata, SPLIT_NO), _int(part.metadata, SPLIT_COUNT)
        if part_no != no or part_count != count:
            raise ModelFileError(
                f"{part.path} is not part {no + 1} of {count} of {first.path.name} "
                f"(its split.no is {part_no}, its split.count {part_count})."
            )
        for t in part.tensors:
            if t.name in seen:
                raise ModelFileError(f"{part.path}: tensor '{t.name}' is also in an earlier part (a corrupt split).")
            seen.add(t.name)
            tensors.append(t)
    expected = _int(first.metadata, SPLIT_TENSORS)
    if expected is not None and expected != len(tensors):
        raise ModelFileError(
            f"{first.path} and its parts hold {len(tensors):,} tensors, but split.tensors.count says {expected:,}: "
            "a part is from another upload or incomplete."
        )
    return replace(
        first,
        tensors=tuple(tensors),
        file_size_bytes=sum(h.file_size_bytes for h in headers),
    )
