"""GGUF models that live on a server, worked out without any network: what a user typed (a Hugging
Face repository or file, an Ollama model and tag), a repository's file listing grouped into models
(split parts together, vision projectors apart, each with its quantization read from its name),
the file a ``--quant`` names, and the layers of an Ollama manifest.

The fetching is I/O and lives in ``app.adapters`` (``remote_gguf``, ``hf_hub``,
``ollama_registry``); ``app.services.remote`` joins the two.

Names follow the publishers' habits: ``{model}-{QUANT}.gguf`` (bartowski, the ggml-org uploads,
lmstudio-community), Unsloth's dynamic ``UD-`` mixes, quant folders holding split parts
(``Q4_K_M/{model}-Q4_K_M-00001-of-00003.gguf``), and ``mmproj-*.gguf`` projectors beside the model.
Ollama's registry speaks the OCI distribution API: a manifest per tag, its layers content-addressed
blobs; the GGUF is the layer of media type ``application/vnd.ollama.image.model``, its vision
projector ``application/vnd.ollama.image.projector`` (ollama/ollama server/create.go, manifest/).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import Field

from app.core.common.errors import FitScopeError
from app.core.common.records import Frozen
from app.core.model.gguf_split import split_name_parts

Source = Literal["hf", "ollama"]

OLLAMA_MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
OLLAMA_PROJECTOR_MEDIA_TYPE = "application/vnd.ollama.image.projector"
OLLAMA_MANIFEST_ACCEPT = "application/vnd.docker.distribution.manifest.v2+json"
OLLAMA_DEFAULT_NAMESPACE, OLLAMA_DEFAULT_TAG = "library", "latest"

# A quantization in a file name: llama.cpp's type names (Q4_K_M, IQ4_XS, Q8_0, TQ1_0, MXFP4, BF16...),
# Unsloth's dynamic mixes (UD-Q4_K_XL) and the _L/_XL variants with a larger embedding/output.
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])((?:UD-)?(?:I?Q\d(?:_[A-Z0-9]{1,3})*|TQ\d_\d|MXFP4(?:_MOE)?|BF16|FP16|F16|FP32|F32))(?![A-Za-z0-9])",
    re.IGNORECASE,
)
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_OLLAMA_NAME = re.compile(
    r"^(?:(?P<ns>[a-z0-9][a-z0-9._-]{0,79})/)?(?P<model>[a-z0-9][a-z0-9._-]{0,79})"
    r"(?::(?P<tag>[A-Za-z0-9][A-Za-z0-9._-]{0,79}))?$"
)
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_HF_HOSTS = ("https://huggingface.co/", "http://huggingface.co/", "huggingface.co/", "hf.co/", "https://hf.co/")


class RemoteFile(Frozen):
    """A model (or projector) on a server: one GGUF file, or the parts of a split one."""

    path: str = Field(description="the file (a split model's first part), relative to the repository")
    parts: tuple[str, ...] = Field(description="every file to read, first part first")
    size_bytes: int = Field(ge=0, description="all parts together")
    quant: str = Field(default="", description="the quantization its name says, e.g. UD-Q4_K_XL; '' if none")
    missing_parts: tuple[str, ...] = ()
    digest: str = Field(default="", description="an Ollama blob's sha256 digest; '' on the Hub")

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


class RemoteListing(Frozen):
    """What a repository (or an Ollama tag) offers: its GGUF models and its vision projectors, at
    one revision (a Hub commit, or an Ollama tag's manifest digest)."""

    source: Source
    repo: str = Field(description="ORG/REPO on the Hub; NAMESPACE/MODEL:TAG for Ollama")
    revision: str
    host: str = Field(description="the server, as shown to people")
    models: tuple[RemoteFile, ...]
    projectors: tuple[RemoteFile, ...] = ()
    note: str = Field(default="", description="e.g. that this is the listing remembered from an earlier look")


# -- what people type ----------------------------------------------------------------------------


def quant_label(path: str) -> str:
    """The quantization a GGUF file's name (or its folder's) says, upper case; '' when none."""
    parts = path.rsplit("/", 1)
    name = parts[-1]
    split = split_name_parts(name)
    stem = split[0] if split else re.sub(r"\.gguf$", "", name, flags=re.IGNORECASE)
    for text in (stem, parts[0] if len(parts) > 1 else ""):
        found = _QUANT.findall(text)
        if found:
            return str(found[-1]).upper()
    return ""


def parse_hf_ref(text: str) -> tuple[str, str | None, str | None]:
    """(repo id, file path or None, revision or None) from ``ORG/REPO``, ``ORG/REPO/path/file.gguf``
    or a Hub address (``https://huggingface.co/ORG/REPO/blob/REV/file.gguf``). Raises FitScopeError."""
    raw = text.strip()
    for host in _HF_HOSTS:
        if raw.lower().startswith(host):
            raw = raw[len(host) :]
            break
    pieces = [p for p in raw.split("/") if p]
    if len(pieces) < 2 or not _REPO_ID.match("/".join(pieces[:2])):
        raise FitScopeError(
            f"'{text}' is not a Hugging Face repository: write ORG/REPO (e.g. bartowski/Qwen3-8B-GGUF), "
            "optionally followed by /path/file.gguf."
        )
    repo, rest, revision = "/".join(pieces[:2]), pieces[2:], None
    if len(rest) >= 2 and rest[0] in ("blob", "resolve", "tree"):
        revision, rest = rest[1], rest[2:]
    path = "/".join(rest) or None
    if path is not None and not path.lower().endswith(".gguf"):
        raise FitScopeError(f"'{path}' in {repo} is not a .gguf file; name a GGUF file, or the repository alone.")
    return repo, path, revision


def parse_ollama_ref(text: str) -> tuple[str, str]:
    """(NAMESPACE/MODEL, TAG) from ``MODEL[:TAG]`` or ``NAMESPACE/MODEL[:TAG]`` (the library's
    models are ``library/MODEL``; the tag defaults to ``latest``). Raises FitScopeError."""
    raw = text.strip()
    for prefix in ("https://ollama.com/", "ollama.com/", "registry.ollama.ai/"):
        if raw.lower().startswith(prefix):
            raw = raw[len(prefix) :]
    m = _OLLAMA_NAME.match(raw)
    if m is None:
        raise FitScopeError(
            f"'{text}' is not an Ollama model name: write MODEL:TAG as `ollama pull` takes it (e.g. qwen3:30b)."
        )
    return f"{m.group('ns') or OLLAMA_DEFAULT_NAMESPACE}/{m.group('model')}", m.group("tag") or OLLAMA_DEFAULT_TAG


# -- listings ------------------------------------------------------------------------------------


def is_projector(path: str) -> bool:
    return "mmproj" in path.rsplit("/", 1)[-1].lower()


def group_gguf_files(
    entries: Iterable[tuple[str, int | None]],
) -> tuple[tuple[RemoteFile, ...], tuple[RemoteFile, ...]]:
    """(models, projectors) among a repository's files (path, size in bytes or None): only ``.gguf``
    files, split parts gathered under their first part, sorted by size (smallest first)."""
    sizes: dict[str, int] = {}
    for path, size in entries:
        if path.lower().endswith(".gguf"):
            sizes[path] = max(0, size or 0)
    singles: list[RemoteFile] = []
    splits: dict[tuple[str, int], dict[int, str]] = {}
    for path in sizes:
        split = split_name_parts(path)
        if split is None or split[2] < 2:
            singles.append(RemoteFile(path=path, parts=(path,), size_bytes=sizes[path], quant=quant_label(path)))
        else:
            prefix, no, count = split
            splits.setdefault((prefix, count), {})[no] = path
    for (prefix, count), found in splits.items():
        names = [f"{prefix}-{n:05d}-of-{count:05d}.gguf" for n in range(1, count + 1)]
        parts = tuple(found.get(n, names[n - 1]) for n in range(1, count + 1))
        singles.append(
            RemoteFile(
                path=parts[0],
                parts=parts,
                size_bytes=sum(sizes.get(p, 0) for p in parts),
                quant=quant_label(parts[0]),
                missing_parts=tuple(p for p in parts if p not in sizes),
            )
        )
    singles.sort(key=lambda f: (f.size_bytes, f.path))
    models = tuple(f for f in singles if not is_projector(f.path))
    projectors = tuple(f for f in singles if is_projector(f.path))
    return models, projectors


def choose_file(listing: RemoteListing, quant: str | None = None, path: str | None = None) -> RemoteFile:
    """The model ``path`` names (any part of a split model names it), or the one file of
    quantization ``quant`` (``UD-`` mixes match their base name when they are the only one).
    Raises FitScopeError with the choices when none or several match."""
    where = f"{listing.repo} ({listing.host})"
    if not listing.models:
        only = " (only vision projectors)." if listing.projectors else "."
        raise FitScopeError(f"{where} holds no GGUF model{only}")
    if path is not None:
        for f in (*listing.models, *listing.projectors):
            if path in f.parts:
                if is_projector(f.path):
                    raise FitScopeError(
                        f"{path} is a vision projector; name the model, and add the projector with --projector."
                    )
                return f
        raise FitScopeError(f"{where} has no file {path}. Its GGUF models: {_names(listing.models)}.")
    if quant is None:
        if len(listing.models) == 1:
            return listing.models[0]
        raise FitScopeError(
            f"{where} holds {len(listing.models)} GGUF models; choose one with --quant: {_quants(listing.models)}."
        )
    wanted = quant.strip().upper()
    exact = [f for f in listing.models if f.quant == wanted]
    if not exact:
        exact = [f for f in listing.models if f.quant.removeprefix("UD-") == wanted.removeprefix("UD-")]
    if len(exact) == 1:
        return exact[0]
    if not exact:
        raise FitScopeError(f"{where} has no {wanted} file. It has: {_quants(listing.models)}.")
    raise FitScopeError(
        f"{where} has {len(exact)} {wanted} files ({_names(exact)}); name one as ORG/REPO/path/file.gguf."
    )


def choose_projector(listing: RemoteListing) -> RemoteFile:
    """The projector to load beside the model: the only one, else the F16 one (what llama.cpp's
    converter writes by default). Raises FitScopeError when there is none or the choice is unclear."""
    found = listing.projectors
    if not found:
        raise FitScopeError(f"{listing.repo} has no vision projector (mmproj file): the model reads text only.")
    if len(found) == 1:
        return found[0]
    f16 = [f for f in found if f.quant == "F16"]
    if len(f16) == 1:
        return f16[0]
    raise FitScopeError(f"{listing.repo} has several projectors ({_names(found)}); choose one in the window.")


def _names(files: Iterable[RemoteFile]) -> str:
    return ", ".join(f.path for f in files)


def _quants(files: Iterable[RemoteFile]) -> str:
    return ", ".join(dict.fromkeys(f.quant or f.name for f in files))


# -- Ollama ---------------------------------------------------------------------------------------


def ollama_listing(name: str, tag: str, host: str, manifest: Any) -> RemoteListing:
    """The model (and projector) an Ollama manifest names, as a listing of one. ``revision`` is the
    model layer's digest: the blob never changes while the tag may move. Raises FitScopeError for
    a manifest without a GGUF model layer or with a malformed one."""
    shown = f"{name}:{tag}"
    layers = manifest.get("layers") if isinstance(manifest, Mapping) else None
    if not isinstance(layers, list):
        raise FitScopeError(f"The registry's manifest for {shown} is not one FitScope can read (no layers).")
    typed = [layer for layer in layers if isinstance(layer, Mapping)]
    models = [layer for layer in typed if layer.get("mediaType") == OLLAMA_MODEL_MEDIA_TYPE]
    projectors = [layer for layer in typed if layer.get("mediaType") == OLLAMA_PROJECTOR_MEDIA_TYPE]
    if not models:
        kinds = sorted({str(layer.get("mediaType")) for layer in typed})
        raise FitScopeError(
            f"{shown} has no GGUF model layer (its layers: {', '.join(kinds) or 'none'}); "
            "FitScope reads models Ollama stores as GGUF."
        )

    def file_of(layer: Mapping[str, Any], role: str) -> RemoteFile:
        digest, size = layer.get("digest"), layer.get("size")
        if not isinstance(digest, str) or not _DIGEST.match(digest) or not isinstance(size, int) or size < 0:
            raise FitScopeError(
                f"The registry's manifest for {shown} names its {role} with a malformed digest or size."
            )
        return RemoteFile(path=f"{shown} ({role})", parts=(digest,), size_bytes=size, digest=digest)

    model = file_of(models[0], "model")
    return RemoteListing(
        source="ollama",
        repo=shown,
        revision=model.digest,
        host=host,
        models=(model,),
        projectors=tuple(file_of(p, "projector") for p in projectors[:1]),
    )
