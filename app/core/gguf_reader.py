"""Read a GGUF file's header: its metadata, its tensor list and the :class:`Architecture` it describes.

This is FitScope's own parser of the GGUF format (little-endian, versions 2 and 3). It never reads
tensor data and it skips large arrays (the tokenizer's token list, scores and merges) without
building them, so a header with a 262 144-token vocabulary is read in a few tens of milliseconds.
Everything that can go wrong with a file raises :class:`ModelFileError` with a message naming it.

Layout of a GGUF header::

    magic "GGUF" | version u32 | tensor_count u64 | kv_count u64
    kv_count x (key: string, value_type u32, value)
    tensor_count x (name: string, n_dims u32, dims u64 x n_dims, ggml_type u32, offset u64)
    padding to general.alignment (default 32), then the tensor data

Strings are a u64 byte length followed by UTF-8 bytes; arrays are an element type u32, a count u64
and the elements.
"""

from __future__ import annotations

import math
import mmap
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from app.core.architecture import Architecture, MLASpec, MoESpec, SSMSpec
from app.core.errors import ModelFileError
from app.core.files import regular_file
from app.core.tensors import GGMLType, TensorInfo

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# Arrays up to this many elements are read into the metadata; longer ones are summarised.
SHORT_ARRAY = 1024
# Sanity limits: no real file comes near these; a header that claims more is corrupt.
MAX_TENSORS = 1_000_000
MAX_KV = 1_000_000
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ELEMENTS = 1 << 50
MAX_ARRAY_DEPTH = 4
MAX_LAYERS = 1024  # the Architecture record's bound; the largest released models have ~160
MAX_NAME_BYTES = 64 * 1024  # metadata keys; tensor names are shorter still (GGML_MAX_NAME = 64)
MAX_TENSOR_NAME_BYTES = 64
MAX_STRING_VALUE_BYTES = 1024 * 1024  # longer string values (none that FitScope reads) are skipped

# llama.cpp's set_swa_pattern(N) for architectures whose GGUF files may omit
# attention.sliding_window_pattern (applies only when a sliding window is set).
ARCH_SWA_PATTERN: dict[str, int] = {
    "gemma2": 2,
    "gemma3": 6,
    "gemma-embedding": 6,
    "cohere2": 4,
    "gpt-oss": 2,
    "llama4": 4,
}

# GGUF value types -> (name, struct format char, size). 8 = string, 9 = array.
_STRING, _ARRAY = 8, 9
_VALUE_TYPES: dict[int, tuple[str, str, int]] = {
    0: ("uint8", "B", 1),
    1: ("int8", "b", 1),
    2: ("uint16", "H", 2),
    3: ("int16", "h", 2),
    4: ("uint32", "I", 4),
    5: ("int32", "i", 4),
    6: ("float32", "f", 4),
    7: ("bool", "?", 1),
    10: ("uint64", "Q", 8),
    11: ("int64", "q", 8),
    12: ("float64", "d", 8),
}
_TYPE_NAMES = {t: spec[0] for t, spec in _VALUE_TYPES.items()} | {_STRING: "string", _ARRAY: "array"}
_SCALAR_STRUCTS = {t: struct.Struct("<" + spec[1]) for t, spec in _VALUE_TYPES.items()}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_PREAMBLE = struct.Struct("<4sIQQ")  # magic, version, tensor_count, kv_count


@dataclass(frozen=True, slots=True)
class ArrayInfo:
    """Stands in the metadata for an array too long to load (e.g. ``tokenizer.ggml.tokens``)."""

    element_type: str
    length: int

    def __len__(self) -> int:
        return self.length

    def __str__(self) -> str:
        return f"[{self.length} x {self.element_type}]"


@dataclass(frozen=True, slots=True)
class GgufModel:
    """What FitScope knows about one GGUF file after reading its header."""

    path: Path
    file_size_bytes: int
    architecture: Architecture
    tensors: tuple[TensorInfo, ...]
    file_type: int | None  # general.file_type (llama_ftype), e.g. 15 = Q4_K_M
    name: str
    metadata: Mapping[str, Any] = field(repr=False)
    tokenizer_model: str | None
    vocab_size: int
    version: int = 3
    alignment: int = DEFAULT_ALIGNMENT
    data_offset: int = 0  # where the tensor data starts

    @property
    def weights_bytes(self) -> int:
        """Bytes of all tensor data (what llama.cpp loads as model weights)."""
        return sum(t.n_bytes for t in self.tensors)

    @property
    def arch(self) -> str:
        return self.architecture.arch


@dataclass(frozen=True, slots=True)
class GgufHeader:
    """A GGUF file's metadata and tensor list, read without interpreting what model they describe."""

    path: Path
    file_size_bytes: int
    metadata: Mapping[str, Any] = field(repr=False)
    tensors: tuple[TensorInfo, ...]
    version: int
    alignment: int
    data_offset: int

    @property
    def tensors_bytes(self) -> int:
        """Bytes of all tensor data."""
        return sum(t.n_bytes for t in self.tensors)


class _Truncated(Exception):
    """The header runs past the end of the file."""


class _Corrupt(Exception):
    """The header holds something impossible; the message says what."""


@dataclass(slots=True)
class _RawTensor:
    name: str
    dims: tuple[int, ...]
    type_id: int
    offset: int


class _HeaderParser:
    """Walks the header in a buffer (a memory map of the file); ``where`` tracks progress for errors."""

    __slots__ = ("buf", "size", "off", "where")

    def __init__(self, buf: Any, size: int) -> None:
        self.buf = buf
        self.size = size
        self.off = 0
        self.where = "while reading the file's preamble"

    # -- primitives ------------------------------------------------------------------------------
    def _need(self, n: int) -> None:
        if self.off + n > self.size:
            raise _Truncated

    def u32(self) -> int:
        self._need(4)
        value = _U32.unpack_from(self.buf, self.off)[0]
        self.off += 4
        return value

    def u64(self) -> int:
        self._need(8)
        value = _U64.unpack_from(self.buf, self.off)[0]
        self.off += 8
        return value

    def raw_string(self, what: str, limit: int | None = None) -> bytes:
        """A length-prefixed string; past ``limit`` bytes it is corrupt (names) or, with no limit
        given, stepped over without copying (values longer than MAX_STRING_VALUE_BYTES)."""
        n = self.u64()
        if n > self.size:
            raise _Corrupt(f"{what} claims a length of {n:,} bytes, more than the whole file")
        if limit is not None and n > limit:
            raise _Corrupt(f"{what} claims a length of {n:,} bytes (names are at most {limit:,})")
        self._need(n)
        if limit is None and n > MAX_STRING_VALUE_BYTES:
            self.off += n
            return f"<{n:,} bytes not read>".encode()
        data = self.buf[self.off : self.off + n]
        self.off += n
        return data

    def name_string(self, what: str, limit: int = MAX_NAME_BYTES) -> str:
        raw = self.raw_string(what, limit)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Corrupt(f"{what} is not valid UTF-8 ({raw[:40]!r})") from exc

    # -- values ----------------------------------------------------------------------------------
    def value(self, vtype: int, key: str, depth: int = 0) -> Any:
        if vtype == _STRING:
            return self.raw_string(f"the value of '{key}'").decode("utf-8", errors="replace")
        if vtype == _ARRAY:
            return self.array(key, depth)
        st = _SCALAR_STRUCTS.get(vtype)
        if st is None:
            raise _Corrupt(f"metadata key '{key}' has an unknown value type ({vtype})")
        self._need(st.size)
        value = st.unpack_from(self.buf, self.off)[0]
        self.off += st.size
        return value

    def array(self, key: str, depth: int) -> Any:
        if depth >= MAX_ARRAY_DEPTH:
            raise _Corrupt(f"metadata key '{key}' nests arrays more than {MAX_ARRAY_DEPTH} deep")
        etype = self.u32()
        count = self.u64()
        if etype == _STRING:
            min_size = 8
        elif etype == _ARRAY:
            min_size = 12
        elif etype in _VALUE_TYPES:
            min_size = _VALUE_TYPES[etype][2]
        else:
            raise _Corrupt(f"metadata key '{key}' is an array of an unknown value type ({etype})")
        if count * min_size > self.size - self.off:
            if count * min_size > self.size:
                raise _Corrupt(f"metadata key '{key}' claims {count:,} elements, more than the whole file could hold")
            raise _Truncated

        if count <= SHORT_ARRAY:
            if etype == _STRING:
                return [self.value(_STRING, key) for _ in range(count)]
            if etype == _ARRAY:
                return [self.array(key, depth + 1) for _ in range(count)]
            _, fmt, size = _VALUE_TYPES[etype]
            values = list(struct.unpack_from(f"<{count}{fmt}", self.buf, self.off))
            self.off += count * size
            return values

        if etype == _STRING:
            self._skip_strings(count, key)
        elif etype == _ARRAY:
            for _ in range(count):
                self.array(key, depth + 1)
        else:
            self.off += count * _VALUE_TYPES[etype][2]  # bounds checked above
        return ArrayInfo(_TYPE_NAMES[etype], count)

    def _skip_strings(self, count: int, key: str) -> None:
        """Step over ``count`` strings reading only their length prefixes (the hot loop)."""
        buf, off, unpack = self.buf, self.off, _U64.unpack_from
        try:
            for _ in repeat(None, count):
                off += 8 + unpack(buf, off)[0]
        except (struct.error, ValueError, OverflowError):
            off = self.size + 1
        if off > self.size:
            # Walk again, checking each string, to say precisely what is wrong.
            for _ in range(count):
                self.raw_string(f"a string in '{key}'")
            raise _Truncated  # pragma: no cover - the careful walk raises first
        self.off = off


def _describe_start(head: bytes) -> str:
    """A short, readable rendering of a file's first bytes."""
    sample = head[:16]
    try:
        text = sample.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and all(c.isprintable() or c in "\t\r\n" for c in text):
        return repr(text + ("..." if len(head) > 16 else ""))
    return "bytes " + sample.hex(" ")


def _not_gguf_hint(head: bytes) -> str:
    if head.startswith(b"version https://git-lfs"):
        return " It is a Git LFS pointer, not the model itself: fetch the real file (git lfs pull)."
    if head[:4] in (b"lmgg", b"fmgg", b"tjgg", b"algg"):
        return " It is an old GGML/GGJT model file; convert it to GGUF with a recent llama.cpp."
    if head.startswith(b"PK\x03\x04"):
        return " It is a zip archive (perhaps a PyTorch checkpoint); FitScope reads GGUF files."
    if len(head) > 9 and head[8:10] == b'{"':
        return " It looks like a safetensors file; point FitScope at its config.json or at a GGUF file."
    if head.lstrip()[:1] in (b"{", b"["):
        return " It looks like a JSON file; config.json files are read with the Hugging Face option."
    return ""


def _open_buffer(path: Path) -> tuple[Any, int, Any]:
    """(buffer, size, closer). Raises ModelFileError for a missing, unreadable or empty file."""
    shown = str(path)
    if path.is_dir():
        raise ModelFileError(f"{shown} is a folder, not a GGUF file; choose the .gguf file inside it.")
    regular_file(path, "model file", ModelFileError)
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the caller through the closer
    except OSError as exc:
        raise ModelFileError(f"FitScope cannot open {shown}: {exc.strerror or exc}.") from exc
    try:
        size = path.stat().st_size
        if size == 0:
            raise ModelFileError(f"{shown} is empty (0 bytes); the download probably failed.")
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            data = f.read()  # a file that cannot be mapped (rare): read it whole
            size = len(data)
            f.close()
            return data, size, lambda: None

        def close() -> None:
            mm.close()
            f.close()

        return mm, size, close
    except ModelFileError:
        f.close()
        raise
    except OSError as exc:
        f.close()
        raise ModelFileError(f"FitScope cannot read {shown}: {exc.strerror or exc}.") from exc


def read_gguf(path: str | Path) -> GgufModel:
    """Read the header of the GGUF file at ``path``. Raises ModelFileError when it cannot."""
    return _with_buffer(path, _read)


def read_gguf_header(path: str | Path) -> GgufHeader:
    """Read only the metadata and tensor list of the GGUF file at ``path``, whatever it holds (a
    text model, a ``clip`` vision projector, ...): the same checks as :func:`read_gguf` but no
    :class:`Architecture`. Raises ModelFileError when the file cannot be read."""
    return _with_buffer(path, _read_header)


def _with_buffer(path: str | Path, read: Any) -> Any:
    path = Path(path).expanduser()
    close = None
    try:
        buf, size, close = _open_buffer(path)
        return read(path, buf, size)
    except ModelFileError:
        raise
    except Exception as exc:  # anything unforeseen still reaches the user as one sentence
        raise ModelFileError(f"{path} could not be read as a GGUF file ({type(exc).__name__}: {exc}).") from exc
    finally:
        if close is not None:
            close()


def _read_header(path: Path, buf: Any, size: int) -> GgufHeader:
    shown = str(path)
    head = bytes(buf[:64])
    if head[:4] != GGUF_MAGIC:
        raise ModelFileError(
            f"{shown} is not a GGUF file (it starts with {_describe_start(head)})." + _not_gguf_hint(head)
        )
    if size < _PREAMBLE.size:
        raise ModelFileError(
            f"{shown} ends inside the header (it is only {size} bytes long); "
            "the file is incomplete - download it again."
        )
    _, version, n_tensors, n_kv = _PREAMBLE.unpack_from(buf, 0)
    if version not in SUPPORTED_VERSIONS:
        if version == 1:
            detail = "version 1, an early 2023 format that llama.cpp no longer reads"
        elif version & 0xFFFF == 0 and (version >> 24) in SUPPORTED_VERSIONS:
            detail = "a big-endian GGUF, which FitScope cannot read"
        else:
            detail = f"version {version}"
        raise ModelFileError(
            f"{shown} is GGUF {detail}; FitScope reads GGUF versions {', '.join(map(str, SUPPORTED_VERSIONS))}."
        )
    if n_tensors > MAX_TENSORS or n_kv > MAX_KV:
        raise ModelFileError(
            f"{shown} is corrupt: its header claims {n_tensors:,} tensors and {n_kv:,} metadata entries."
        )

    p = _HeaderParser(buf, size)
    p.off = _PREAMBLE.size
    metadata: dict[str, Any] = {}
    raw_tensors: list[_RawTensor] = []
    try:
        for i in range(n_kv):
            p.where = f"while reading metadata entry {i + 1} of {n_kv}"
            key = p.name_string(f"metadata key {i + 1}")
            p.where = f"while reading metadata entry {i + 1} of {n_kv}, '{key}'"
            metadata[key] = p.value(p.u32(), key)
        for i in range(n_tensors):
            p.where = f"while reading tensor {i + 1} of {n_tensors}"
            name = p.name_string(f"the name of tensor {i + 1}", MAX_TENSOR_NAME_BYTES)
            n_dims = p.u32()
            if n_dims > MAX_DIMS:
                raise _Corrupt(f"tensor '{name}' claims {n_dims} dimensions (ggml allows {MAX_DIMS})")
            p._need(8 * n_dims)
            dims = struct.unpack_from(f"<{n_dims}Q", buf, p.off)
            p.off += 8 * n_dims
            raw_tensors.append(_RawTensor(name, dims, p.u32(), p.u64()))
    except _Truncated:
        raise ModelFileError(
            f"{shown} ends inside the header ({p.where}); the file is incomplete - download it again."
        ) from None
    except _Corrupt as exc:
        raise ModelFileError(f"{shown} is corrupt: {exc} ({p.where}).") from None

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise ModelFileError(f"{shown} is corrupt: general.alignment is {alignment!r}, not a power of two.")
    data_offset = -(-p.off // alignment) * alignment

    tensors = _tensor_infos(shown, raw_tensors)
    _check_data_fits(shown, tensors, raw_tensors, data_offset, size)
    return GgufHeader(
        path=path,
        file_size_bytes=size,
        metadata=metadata,
        tensors=tensors,
        version=version,
        alignment=alignment,
        data_offset=data_offset,
    )


def _read(path: Path, buf: Any, size: int) -> GgufModel:
    header = _read_header(path, buf, size)
    shown, metadata, tensors = str(path), header.metadata, header.tensors
    version, alignment, data_offset = header.version, header.alignment, header.data_offset
    if metadata.get("general.architecture") == "clip":
        raise ModelFileError(
            f"{shown} is a vision projector (an mmproj file), not a language model: open the model's own "
            "GGUF file, and add this one as its projector (fitscope estimate --mmproj)."
        )
    try:
        architecture = _architecture(path, metadata, tensors)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the model"
        raise ModelFileError(f"{shown} describes a model FitScope cannot use: {where}: {first['msg']}.") from None
    file_type = metadata.get("general.file_type")
    tokenizer_model = metadata.get("tokenizer.ggml.model")
    return GgufModel(
        path=path,
        file_size_bytes=size,
        architecture=architecture,
        tensors=tensors,
        file_type=file_type if isinstance(file_type, int) else None,
        name=architecture.name,
        metadata=metadata,
        tokenizer_model=tokenizer_model if isinstance(tokenizer_model, str) else None,
        vocab_size=architecture.n_vocab,
        version=version,
        alignment=alignment,
        data_offset=data_offset,
    )


def _tensor_infos(shown: str, raw: list[_RawTensor]) -> tuple[TensorInfo, ...]:
    known = {t.value for t in GGMLType}
    infos = []
    for t in raw:
        if t.type_id not in known:
            raise ModelFileError(
                f"{shown}: tensor '{t.name}' is stored as ggml type {t.type_id}, which FitScope does not "
                "know (a newer llama.cpp format, or a corrupt file)."
            )
        if math.prod(t.dims) > MAX_ELEMENTS or t.offset > MAX_ELEMENTS:
            raise ModelFileError(
                f"{shown} is corrupt: tensor '{t.name}' claims the shape {list(t.dims)} at offset {t.offset:,}."
            )
        try:
            info = TensorInfo(t.name, GGMLType(t.type_id), tuple(t.dims) or (1,))
        except ValueError as exc:
            raise ModelFileError(f"{shown} is corrupt: tensor '{t.name}' {list(t.dims)}: {exc}.") from None
        infos.append(info)
    return tuple(infos)


def _check_data_fits(
    shown: str, tensors: tuple[TensorInfo, ...], raw: list[_RawTensor], data_offset: int, size: int
) -> None:
    if data_offset > size and tensors:
        raise ModelFileError(
            f"{shown} ends right after its header and holds none of its tensor data; "
            "the download is incomplete - download it again."
        )
    end, last = 0, None
    for info, t in zip(tensors, raw, strict=True):
        t_end = data_offset + t.offset + info.n_bytes
        if t_end > end:
            end, last = t_end, info.name
    if end > size:
        short = end - size
        raise ModelFileError(
            f"{shown} is {short:,} bytes short: tensor '{last}' ends at byte {end:,} but the file "
            f"has only {size:,}. The download is incomplete or the file was cut; download it again."
        )


# -- metadata -> Architecture --------------------------------------------------------------------


def model_id_from(text: str) -> str:
    """A catalog-style id: lowercase, runs of other characters turned into '-'."""
    slug = re.sub(r"[^a-z0-9.\-]+", "-", text.lower())
    slug = re.sub(r"-{2,}", "-", slug)
    slug = re.sub(r"^[^a-z0-9]+", "", slug).rstrip("-.")
    return slug


def _params_billions(label: Any) -> float | None:
    """general.size_label such as '270M', '8B' or '1.5B' in billions; None for '8x7B' and the like."""
    if not isinstance(label, str):
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMBT])\s*", label, flags=re.IGNORECASE)
    if not m:
        return None
    scale = {"K": 1e-6, "M": 1e-3, "B": 1.0, "T": 1e3}[m.group(2).upper()]
    value = float(m.group(1)) * scale
    return value if value > 0 else None


class _Meta:
    """Typed access to ``{arch}.*`` keys with messages that name the key and the file."""

    def __init__(self, shown: str, arch: str, metadata: Mapping[str, Any]) -> None:
        self.shown, self.arch, self.md = shown, arch, metadata

    def key(self, suffix: str) -> str:
        return f"{self.arch}.{suffix}"

    def has(self, suffix: str) -> bool:
        return self.key(suffix) in self.md

    def missing(self, suffix: str, why: str = "") -> ModelFileError:
        return ModelFileError(f"{self.shown} has no '{self.key(suffix)}' entry, which a {self.arch} model needs{why}.")

    def maybe(self, suffix: str) -> int | None:
        """The whole number under ``{arch}.suffix``, or None when the file does not have it."""
        key = self.key(suffix)
        if key not in self.md:
            return None
        value = self.md[key]
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or value < 0:
            raise ModelFileError(f"{self.shown}: '{key}' is {value!r}, not a whole number.")
        return int(value)

    def get(self, suffix: str, default: int) -> int:
        value = self.maybe(suffix)
        return default if value is None else value

    def req(self, suffix: str, why: str = "") -> int:
        value = self.maybe(suffix)
        if value is None:
            raise self.missing(suffix, why)
        return value

    def per_layer(self, suffix: str, n_layer: int, default: Any = None, required: bool = False) -> Any:
        """A scalar, or a list with one entry per layer."""
        key = self.key(suffix)
        if key not in self.md:
            if required:
                raise self.missing(suffix)
            return default
        value = self.md[key]
        if isinstance(value, ArrayInfo):
            raise ModelFileError(
                f"{self.shown}: '{key}' has {len(value):,} entries; FitScope reads models of at most "
                f"{SHORT_ARRAY} layers."
            )
        if isinstance(value, list):
            if len(value) != n_layer:
                raise ModelFileError(f"{self.shown}: '{key}' has {len(value)} entries for {n_layer} layers.")
            if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
                raise ModelFileError(f"{self.shown}: '{key}' holds entries that are not whole numbers.")
            return list(value)
        return self.maybe(suffix)


def _first_tensor(tensors: tuple[TensorInfo, ...], *suffixes: str) -> TensorInfo | None:
    for t in tensors:
        if t.name.endswith(suffixes):
            return t
    return None


def _swa_pattern(meta: _Meta, n_layer: int) -> int | None:
    """attention.sliding_window_pattern in the project's terms (1 = every layer SWA)."""
    key = meta.key("attention.sliding_window_pattern")
    if key not in meta.md:
        return ARCH_SWA_PATTERN.get(meta.arch)
    value = meta.md[key]
    if isinstance(value, bool):
        value = [value] * n_layer
    if isinstance(value, int):
        # llama.cpp: layer il is SWA when n == 0 or il % n < n - 1 (so 0 = all, 1 = none)
        if value == 0:
            return 1
        return None if value == 1 else value
    if isinstance(value, list) and len(value) == n_layer:
        flags = [bool(v) for v in value]
        if all(flags):
            return 1
        if not any(flags):
            return None
        for n in range(2, n_layer + 1):
            if all(flags[i] == (i % n < n - 1) for i in range(n_layer)):
                return n
        return None  # a layout the model cannot express: count every layer as full attention
    raise ModelFileError(f"{meta.shown}: '{key}' is {value!r}, which FitScope cannot interpret.")


def _architecture(path: Path, metadata: Mapping[str, Any], tensors: tuple[TensorInfo, ...]) -> Architecture:
    shown = str(path)
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelFileError(
            f"{shown} has no 'general.architecture' entry, so FitScope cannot tell what model it holds."
        )
    m = _Meta(shown, arch, metadata)
    names = {t.name for t in tensors}

    n_layer = m.req("block_count")
    if not 1 <= n_layer <= MAX_LAYERS:
        # Checked before any per-layer list is built from it.
        raise ModelFileError(f"{shown} is corrupt: '{m.key('block_count')}' is {n_layer:,} (1 to {MAX_LAYERS:,}).")
    beyond = max((t.layer for t in tensors if t.layer is not None), default=-1)
    if beyond >= n_layer:
        raise ModelFileError(
            f"{shown} is corrupt: it holds tensors of layer {beyond} but '{m.key('block_count')}' "
            f"says {n_layer} layers."
        )
    n_embd = m.req("embedding_length")
    n_ctx_train = m.req("context_length")
    is_ssm = m.has("ssm.conv_kernel") or m.has("ssm.state_size") or arch.startswith("mamba")
    n_expert = m.get("expert_count", 0)
    is_moe = n_expert >= 2

    n_head = m.per_layer("attention.head_count", n_layer, default=0 if is_ssm else None, required=not is_ssm)
    n_head_kv = m.per_layer("attention.head_count_kv", n_layer, default=n_head)
    n_ff = m.per_layer(
        "feed_forward_length",
        n_layer,
        default=0 if (is_ssm or is_moe) else None,
        required=not (is_ssm or is_moe),
    )
    head_dim_k = m.maybe("attention.key_length") or None
    head_dim_v = m.maybe("attention.value_length") or None

    # vocabulary
    n_vocab = m.maybe("vocab_size")
    if not n_vocab:
        tokens = metadata.get("tokenizer.ggml.tokens")
        if isinstance(tokens, (list, ArrayInfo)) and len(tokens):
            n_vocab = len(tokens)
    if not n_vocab:
        embd = next((t for t in tensors if t.name == "token_embd.weight"), None)
        if embd is not None and len(embd.shape) >= 2:
            n_vocab = embd.shape[1]
    if not n_vocab:
        raise ModelFileError(
            f"{shown} does not say how large its vocabulary is (no '{arch}.vocab_size', "
            "no 'tokenizer.ggml.tokens' and no 'token_embd.weight' tensor)."
        )

    # sliding window
    sliding_window = m.maybe("attention.sliding_window") or None
    if arch == "llama4" and m.maybe("attention.sliding_window") != 0:
        # Chunked attention of 8192 tokens unless the file says 0, whatever window it gives
        # (llama_model_llama4::load_arch_hparams).
        sliding_window = 8192
    pattern = _swa_pattern(m, n_layer) if sliding_window else None

    moe = None
    if is_moe:
        n_used = m.req("expert_used_count")
        expert_ff = m.maybe("expert_feed_forward_length")
        if not expert_ff:
            t = _first_tensor(tensors, ".ffn_up_exps.weight", ".ffn_gate_exps.weight")
            if t is not None and len(t.shape) >= 2:
                expert_ff = t.shape[1]
            else:
                t = _first_tensor(tensors, ".ffn_gate_up_exps.weight")
                if t is not None and len(t.shape) >= 2:
                    expert_ff = t.shape[1] // 2
        if not expert_ff and isinstance(n_ff, int) and n_ff > 0:
            expert_ff = n_ff  # Mixtral-style files: every FFN is an expert of feed_forward_length
        if not expert_ff:
            raise m.missing("expert_feed_forward_length", " (and no ffn_up_exps tensor shows it)")
        shexp = _first_tensor(tensors, ".ffn_up_shexp.weight", ".ffn_gate_shexp.weight")
        n_shared = m.maybe("expert_shared_count")
        if n_shared is None:
            n_shared = 1 if shexp is not None else 0
        shared_ff = m.maybe("expert_shared_feed_forward_length") or None
        if shared_ff is None and shexp is not None and len(shexp.shape) >= 2 and n_shared:
            shared_ff = shexp.shape[1]
        moe = MoESpec(
            n_expert=n_expert,
            n_expert_used=n_used,
            expert_ff=expert_ff,
            n_shared_expert=n_shared,
            shared_expert_ff=shared_ff if n_shared else None,
            n_dense_lead_layers=m.get("leading_dense_block_count", 0),
            layer_step=max(1, m.get("interleave_moe_layer_step", 1)) if arch == "llama4" else 1,
        )

    mla = None
    if arch == "deepseek2" or m.has("attention.kv_lora_rank"):
        kv_lora_rank = m.req("attention.kv_lora_rank")
        rope_dims = m.req("rope.dimension_count")
        k_len = m.maybe("attention.key_length_mla") or head_dim_k
        v_len = m.maybe("attention.value_length_mla") or head_dim_v
        if not k_len:
            raise m.missing("attention.key_length_mla", " (or attention.key_length)")
        if not v_len:
            raise m.missing("attention.value_length_mla", " (or attention.value_length)")
        if k_len <= rope_dims:
            raise ModelFileError(f"{shown}: the MLA key width {k_len} is not larger than the RoPE width {rope_dims}.")
        mla = MLASpec(
            q_lora_rank=m.get("attention.q_lora_rank", 0),
            kv_lora_rank=kv_lora_rank,
            qk_rope_head_dim=rope_dims,
            qk_nope_head_dim=k_len - rope_dims,
            v_head_dim=v_len,
        )
        head_dim_k = head_dim_v = None  # the MLA block carries the widths

    ssm = None
    attention_layers = None
    ffn_only_layers = None
    if is_ssm:
        group_count = m.maybe("ssm.group_count")
        version: Literal[1, 2] = 2 if arch == "mamba2" or group_count is not None else 1
        dt_rank = m.get("ssm.time_step_rank", 0)
        ssm = SSMSpec(
            version=version,
            d_conv=m.req("ssm.conv_kernel"),
            d_inner=m.req("ssm.inner_size"),
            d_state=m.req("ssm.state_size"),
            dt_rank=dt_rank if version == 1 else 0,
            n_group=group_count or 1,
            n_head=dt_rank if version == 2 else 0,  # Mamba-2 stores its head count as time_step_rank
        )
        kv = n_head_kv if isinstance(n_head_kv, list) else [n_head_kv] * n_layer
        attention_layers = [i for i, v in enumerate(kv) if v > 0] or None
        if m.has("attention.recurrent_layers") or m.has("full_attention_interval"):
            attention_layers = _full_attention_layers(m, n_layer, _nextn_layers(m, n_layer))
        if arch in ("nemotron_h", "nemotron_h_moe") and isinstance(n_ff, list):
            # Each block is one of Mamba-2, attention or MLP: layers with a feed-forward width are MLPs
            # (llama_model_nemotron_h::load_arch_hparams).
            ffn_only_layers = [i for i, f in enumerate(n_ff) if f > 0] or None
    conv_l_cache = m.maybe("shortconv.l_cache") or None
    if conv_l_cache is not None:
        if conv_l_cache < 2:
            raise ModelFileError(f"{shown}: '{m.key('shortconv.l_cache')}' is {conv_l_cache} (at least 2).")
        # LFM2: layers with 0 KV heads are short convolutions (llama_model_lfm2::load_arch_hparams).
        kv = n_head_kv if isinstance(n_head_kv, list) else [n_head_kv] * n_layer
        attention_layers = [i for i, v in enumerate(kv) if v > 0]

    name = metadata.get("general.name")
    if not isinstance(name, str) or not name.strip():
        name = path.stem
    model_id = model_id_from(name) or model_id_from(path.stem) or "model"

    return Architecture(
        id=model_id,
        name=name.strip(),
        arch=arch,
        source=shown,
        params_billions=_params_billions(metadata.get("general.size_label")),
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        n_ff=n_ff,
        n_vocab=n_vocab,
        tied_embeddings="output.weight" not in names,
        n_ctx_train=n_ctx_train,
        sliding_window=sliding_window,
        sliding_window_pattern=pattern,
        attn_bias=any(n.endswith((".attn_q.bias", ".attn_qkv.bias")) for n in names),
        qk_norm=any(n.endswith(".attn_q_norm.weight") for n in names),
        moe=moe,
        mla=mla,
        ssm=ssm,
        attention_layers=attention_layers,
        n_nextn_layers=_nextn_layers(m, n_layer),
        conv_l_cache=conv_l_cache,
        ffn_only_layers=ffn_only_layers,
    )


def _full_attention_layers(m: _Meta, n_layer: int, n_nextn: int) -> list[int]:
    """Qwen3-Next style layouts: ``attention.recurrent_layers`` flags, else every
    ``full_attention_interval``-th layer is full attention; NextN layers are never recurrent
    (llama_model_qwen3next::load_arch_hparams)."""
    key = m.key("attention.recurrent_layers")
    flags = m.md.get(key)
    if isinstance(flags, list) and len(flags) == n_layer:
        recurrent = [bool(v) for v in flags]
    else:
        interval = m.get("full_attention_interval", 4)
        if interval < 1:
            raise ModelFileError(f"{m.shown}: '{m.key('full_attention_interval')}' is {interval}.")
        recurrent = [(i + 1) % interval != 0 for i in range(n_layer)]
    trunk = n_layer - n_nextn
    return [i for i in range(n_layer) if not (i < trunk and recurrent[i])]


def _nextn_layers(m: _Meta, n_layer: int) -> int:
    n = m.get("nextn_predict_layers", 0)
    if not 0 <= n < n_layer:
        raise ModelFileError(f"{m.shown}: '{m.key('nextn_predict_layers')}' is {n} for {n_layer} layers.")
    return n
