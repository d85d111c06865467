"""Read a GGUF file's header: its metadata and its tensor list (:mod:`app.core.model.gguf_model`
reads the :class:`Architecture` they describe).

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

The buffer may also be a prefix of the file (the bytes a range request fetched so far) while the
caller knows the real file's size: when the header runs past the prefix, :class:`HeaderIncompleteError`
says how many bytes are needed at least, and the caller fetches more (``app.adapters.remote_gguf``).
Every check against "the whole file" uses the real size, so a prefix is judged as the file would be.
"""

from __future__ import annotations

import math
import mmap
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any, TypeVar

from app.core.common.errors import ModelFileError
from app.core.common.files import regular_file
from app.core.model.tensors import GGMLType, TensorInfo

_Read = TypeVar("_Read")

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
# A header read over the network stops here: the largest published headers (a 262k-token vocabulary
# with its merges) are about 10 MiB.
MAX_HEADER_BYTES = 64 * 1024 * 1024


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


class HeaderIncompleteError(Exception):
    """The buffer is a prefix of the file and the header runs past it: at least ``needed_bytes``
    from the file's start are needed to read on."""

    def __init__(self, needed_bytes: int) -> None:
        super().__init__(f"the header needs at least {needed_bytes:,} bytes")
        self.needed_bytes = needed_bytes


class _TruncatedError(Exception):
    """The header runs past the end of the buffer; ``args[0]`` is the offset it needed to reach."""


class _CorruptError(Exception):
    """The header holds something impossible; the message says what."""


@dataclass(slots=True)
class _RawTensor:
    name: str
    dims: tuple[int, ...]
    type_id: int
    offset: int


class _HeaderParser:
    """Walks the header in a buffer (a memory map of the file, or a prefix of it: ``size`` bytes of a
    ``file_size``-byte file); ``where`` tracks progress for errors."""

    __slots__ = ("buf", "size", "file_size", "off", "where")

    def __init__(self, buf: Any, size: int, file_size: int) -> None:
        self.buf = buf
        self.size = size
        self.file_size = file_size
        self.off = 0
        self.where = "while reading the file's preamble"

    # -- primitives ------------------------------------------------------------------------------
    def _need(self, n: int) -> None:
        if self.off + n > self.size:
            raise _TruncatedError(self.off + n)

    def u32(self) -> int:
        self._need(4)
        value = _U32.unpack_from(self.buf, self.off)[0]
        self.off += 4
        return int(value)

    def u64(self) -> int:
        self._need(8)
        value = _U64.unpack_from(self.buf, self.off)[0]
        self.off += 8
        return int(value)

    def raw_string(self, what: str, limit: int | None = None) -> bytes:
        """A length-prefixed string; past ``limit`` bytes it is corrupt (names) or, with no limit
        given, stepped over without copying (values longer than MAX_STRING_VALUE_BYTES)."""
        n = self.u64()
        if n > self.file_size:
            raise _CorruptError(f"{what} claims a length of {n:,} bytes, more than the whole file")
        if limit is not None and n > limit:
            raise _CorruptError(f"{what} claims a length of {n:,} bytes (names are at most {limit:,})")
        self._need(n)
        if limit is None and n > MAX_STRING_VALUE_BYTES:
            self.off += n
            return f"<{n:,} bytes not read>".encode()
        data = bytes(self.buf[self.off : self.off + n])
        self.off += n
        return data

    def name_string(self, what: str, limit: int = MAX_NAME_BYTES) -> str:
        raw = self.raw_string(what, limit)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _CorruptError(f"{what} is not valid UTF-8 ({raw[:40]!r})") from exc

    # -- values ----------------------------------------------------------------------------------
    def value(self, vtype: int, key: str, depth: int = 0) -> Any:
        if vtype == _STRING:
            return self.raw_string(f"the value of '{key}'").decode("utf-8", errors="replace")
        if vtype == _ARRAY:
            return self.array(key, depth)
        st = _SCALAR_STRUCTS.get(vtype)
        if st is None:
            raise _CorruptError(f"metadata key '{key}' has an unknown value type ({vtype})")
        self._need(st.size)
        value = st.unpack_from(self.buf, self.off)[0]
        self.off += st.size
        return value

    def array(self, key: str, depth: int) -> Any:
        if depth >= MAX_ARRAY_DEPTH:
            raise _CorruptError(f"metadata key '{key}' nests arrays more than {MAX_ARRAY_DEPTH} deep")
        etype = self.u32()
        count = self.u64()
        if etype == _STRING:
            min_size = 8
        elif etype == _ARRAY:
            min_size = 12
        elif etype in _VALUE_TYPES:
            min_size = _VALUE_TYPES[etype][2]
        else:
            raise _CorruptError(f"metadata key '{key}' is an array of an unknown value type ({etype})")
        if count * min_size > self.size - self.off:
            if count * min_size > self.file_size:
                raise _CorruptError(
                    f"metadata key '{key}' claims {count:,} elements, more than the whole file could hold"
                )
            raise _TruncatedError(self.off + count * min_size)

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
            off = max(off + 8, self.size + 1)  # at least the length it could not read
        if off > self.size:
            if off <= self.file_size:
                raise _TruncatedError(off)  # a prefix of the file: the caller fetches more
            # Walk again, checking each string, to say precisely what is wrong.
            for _ in range(count):
                self.raw_string(f"a string in '{key}'")
            raise _TruncatedError(off)  # pragma: no cover - the careful walk raises first
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


def read_gguf_header(path: str | Path) -> GgufHeader:
    """Read only the metadata and tensor list of the GGUF file at ``path``, whatever it holds (a
    text model, a ``clip`` vision projector, ...): the same checks as :func:`read_gguf` but no
    :class:`Architecture`. Raises ModelFileError when the file cannot be read."""
    return with_file_buffer(path, header_from_buffer)


def with_file_buffer(path: str | Path, read: Callable[[Path, Any, int], _Read]) -> _Read:
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


def header_from_buffer(path: Path, buf: Any, size: int, file_size: int | None = None) -> GgufHeader:
    """The header in ``buf``: the whole file (``size`` bytes), or its first ``size`` bytes of a
    ``file_size``-byte file. Raises ModelFileError for a file that is not a readable GGUF, and
    HeaderIncompleteError when ``buf`` is a prefix that ends inside the header."""
    shown = str(path)
    file_size = size if file_size is None else file_size
    if size < min(file_size, _PREAMBLE.size):
        raise HeaderIncompleteError(_PREAMBLE.size)
    head = bytes(buf[:64])
    if head[:4] != GGUF_MAGIC:
        raise ModelFileError(
            f"{shown} is not a GGUF file (it starts with {_describe_start(head)})." + _not_gguf_hint(head)
        )
    if file_size < _PREAMBLE.size:
        raise ModelFileError(
            f"{shown} ends inside the header (it is only {file_size} bytes long); "
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

    p = _HeaderParser(buf, size, file_size)
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
                raise _CorruptError(f"tensor '{name}' claims {n_dims} dimensions (ggml allows {MAX_DIMS})")
            p._need(8 * n_dims)
            dims = struct.unpack_from(f"<{n_dims}Q", buf, p.off)
            p.off += 8 * n_dims
            raw_tensors.append(_RawTensor(name, dims, p.u32(), p.u64()))
    except _TruncatedError as exc:
        if size < file_size:
            raise HeaderIncompleteError(min(exc.args[0], file_size)) from None
        raise ModelFileError(
            f"{shown} ends inside the header ({p.where}); the file is incomplete - download it again."
        ) from None
    except _CorruptError as exc:
        raise ModelFileError(f"{shown} is corrupt: {exc} ({p.where}).") from None

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise ModelFileError(f"{shown} is corrupt: general.alignment is {alignment!r}, not a power of two.")
    data_offset = -(-p.off // alignment) * alignment

    tensors = _tensor_infos(shown, raw_tensors)
    _check_data_fits(shown, tensors, raw_tensors, data_offset, file_size)
    return GgufHeader(
        path=path,
        file_size_bytes=file_size,
        metadata=metadata,
        tensors=tensors,
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




