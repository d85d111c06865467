"""The KL cache's files checked before they are trusted.

The cache (``<data>/divergence``) holds ``.npz`` archives that FitScope wrote: the reference's
top tokens and log-probabilities, each variant's per-position values. A file cut short by a crash,
damaged on disk or put there by someone else must not break every comparison until it is deleted
by hand, nor expand into gigabytes when read (an ``.npz`` is a zip archive, and a compressed member
can expand without bound). So each file is checked (:func:`cache_file_problem`) and an unusable
one is moved aside as ``NAME.bad`` and measured again (:func:`usable_cache_file`).
"""

from __future__ import annotations

import contextlib
import logging
import stat
from pathlib import Path
from typing import Literal

from app.core.common.files import move_aside

CACHE_LIMIT_BYTES = 512 * 1024**2
_log = logging.getLogger(__name__)

_REFERENCE_ARRAYS = {"tokens": 1, "top_ids": 2, "top_logp": 2, "nll": 1, "n_vocab": 0, "chunks": 0}
_VARIANT_ARRAYS = {"kl": 1, "nll": 1, "nll_ref": 1, "same_top": 1, "chunks": 0}


def cache_file_problem(path: Path, role: Literal["reference", "variant"]) -> str | None:
    """Why a cache file cannot be used (None when it can): not a regular file, over
    CACHE_LIMIT_BYTES, not the uncompressed .npz FitScope writes (a compressed member could expand
    without bound), arrays missing or of the wrong shape, lengths that disagree, or numbers that are
    not finite. Reads the arrays to check them; nothing is pickled."""
    import zipfile

    import numpy as np

    expected = _REFERENCE_ARRAYS if role == "reference" else _VARIANT_ARRAYS
    try:
        mode = path.lstat().st_mode
        if not stat.S_ISREG(mode):
            return "not a regular file"
        if path.stat().st_size > CACHE_LIMIT_BYTES:
            return "larger than the cache may be"
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            if any(m.compress_type != zipfile.ZIP_STORED for m in members):
                return "a compressed archive, which FitScope never writes"
            if sum(m.file_size for m in members) > CACHE_LIMIT_BYTES:
                return "its arrays are larger than the cache may be"
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in expected if name in data.files}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        return f"unreadable ({exc})"
    for name, ndim in expected.items():
        if name not in arrays:
            return f"it lacks the array '{name}'"
        if arrays[name].ndim != ndim or arrays[name].dtype.kind not in "biuf":
            return f"its array '{name}' has the wrong shape or type"
        if arrays[name].dtype.kind == "f" and not np.isfinite(arrays[name]).all():
            return f"its array '{name}' holds numbers that are not finite"
    rows = {len(arrays[n]) for n in expected if expected[n] and n != "tokens"}
    if len(rows) != 1 or int(arrays["chunks"]) < 1:
        return "its arrays disagree in length"
    if role == "reference":
        n_vocab = int(arrays["n_vocab"])
        ids = arrays["top_ids"]
        if (
            n_vocab < 1
            or arrays["top_logp"].shape != ids.shape
            or (ids.size and (ids.min() < 0 or ids.max() >= n_vocab))
        ):
            return "its top-token arrays do not fit its vocabulary"
    return None


def usable_cache_file(path: Path, role: Literal["reference", "variant"], notes: list[str]) -> bool:
    """Whether ``path`` is there and usable; a bad one is moved aside as ``.bad`` (and measured
    again), with a sentence in ``notes``."""
    if not path.exists() and not path.is_symlink():
        return False
    problem = cache_file_problem(path, role)
    if problem is None:
        return True
    moved = move_aside(path)
    if moved is None:
        with contextlib.suppress(OSError):
            path.unlink()
    notes.append(
        f"A cached KL measurement ({path.name}) was unusable ({problem}); it was set aside and measured again."
    )
    _log.warning("cache file %s unusable: %s", path, problem)
    return False
