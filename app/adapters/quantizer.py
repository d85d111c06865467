"""Make a quantized variant of a GGUF file with llama.cpp's own quantizer (``llama_model_quantize``
through llama-cpp-python), in a child process that reports its progress and can be cancelled.

The child speaks :mod:`app.adapters.child_protocol`: one
:class:`~app.adapters.child_protocol.Progress` event per tensor, read from llama.cpp's
``[ i/ n] name ...`` log lines, then :class:`~app.adapters.child_protocol.Done` or
:class:`~app.adapters.child_protocol.Failed`. Cancelling ends it and deletes the half-written file.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from app.adapters.child_protocol import (
    ChildChannel,
    ChildEvent,
    Done,
    Progress,
    WorkerProcess,
    install_llama_log,
    llama_failed,
    require_file,
    serve_child,
)
from app.core.common.errors import FitScopeError
from app.core.common.units import Frozen
from app.core.model.quant import find_preset

_PROGRESS = re.compile(r"\[\s*(\d+)\s*/\s*(\d+)\s*\]")
_SOURCE_NOT_LOADED = "failed to load model"  # llama_model_quantize's error when the source is unreadable


class QuantizeError(FitScopeError):
    """The quantizer could not make the file, or was cancelled."""


class QuantizeJob(Frozen):
    """What the child quantizes: ``source`` into ``target`` with llama.cpp's ``ftype``."""

    source: str
    target: str
    ftype: int
    preset: str


class Quantization:
    """One running quantization; ``cancel()`` is safe from any thread."""

    def __init__(self, source: str | os.PathLike[str], target: str | os.PathLike[str], preset: str) -> None:
        self.source = Path(source)
        self.target = Path(target)
        self.preset = find_preset(preset)
        require_file(self.source, QuantizeError)
        if self.target.resolve() == self.source.resolve():
            raise QuantizeError("The quantized file must not replace its source; choose another name.")
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.cancelled = threading.Event()
        job = QuantizeJob(
            source=str(self.source), target=str(self.target), ftype=self.preset.ftype, preset=self.preset.name
        )
        self._worker = WorkerProcess("app.adapters.quantizer", job, (Progress, Done), name=self.source.name)

    def cancel(self) -> None:
        """End the quantizer now (llama.cpp's quantizer has no point to stop at)."""
        self.cancelled.set()
        self._worker.kill()

    def wait(self, on_progress: Callable[[int, int], None] | None = None) -> Path:
        """Follow the quantizer to its end. Returns the new file. Raises QuantizeError."""

        def on_event(event: ChildEvent) -> None:
            if isinstance(event, Progress) and on_progress is not None:
                on_progress(event.done, event.total)

        self._worker.follow(on_event)
        if self.cancelled.is_set() or self._worker.done is None:
            with contextlib.suppress(OSError):
                self.target.unlink()
        if self.cancelled.is_set():
            raise QuantizeError(f"Making {self.target.name} was cancelled; the partial file was removed.")
        message = self._worker.failure(f"while quantizing {self.source.name} to {self.preset.name}")
        if message is not None:
            raise QuantizeError(message)
        return self.target


def quantize(
    source: str | os.PathLike[str],
    target: str | os.PathLike[str],
    preset: str,
    on_progress: Callable[[int, int], None] | None = None,
    on_start: Callable[[Quantization], None] | None = None,
) -> Path:
    """Quantize ``source`` into ``target`` with a llama.cpp preset ("Q4_K_M", "Q8_0"...).
    ``on_progress(done, total)`` counts tensors; ``on_start`` receives the job, to cancel it."""
    job = Quantization(source, target, preset)
    if on_start is not None:
        on_start(job)
    return job.wait(on_progress)


def default_variant_path(source: str | os.PathLike[str], preset: str) -> Path:
    """``model-F16.gguf`` + Q4_K_M -> ``model-Q4_K_M.gguf`` beside it (the preset replaces a known one)."""
    path = Path(source)
    stem = re.sub(r"[-_.](F32|F16|BF16|Q\d\w*|IQ\d\w*)$", "", path.stem, flags=re.IGNORECASE)
    return path.with_name(f"{stem}-{find_preset(preset).name}.gguf")


# -- child ---------------------------------------------------------------------------------------


def _child_run(child: ChildChannel, job: QuantizeJob) -> int:
    import llama_cpp

    def on_message(_level: int, text: str) -> None:
        if m := _PROGRESS.search(text):
            child.emit(Progress(done=int(m[1]), total=int(m[2])))

    log = install_llama_log(llama_cpp, on_message)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = job.ftype
    params.nthread = os.cpu_count() or 1
    params.allow_requantize = True  # a Q8_0 source may be the best the user has
    code = llama_cpp.llama_model_quantize(job.source.encode(), job.target.encode(), ctypes.byref(params))
    if code != 0:
        not_loaded = any(_SOURCE_NOT_LOADED in line for line in log.error_lines)
        action = "load it" if not_loaded else f"quantize it to {job.preset}"
        child.emit(llama_failed(action, log, f"llama_model_quantize returned {code}"))
        return 1
    child.emit(Done())
    return 0


if __name__ == "__main__":
    sys.exit(serve_child(QuantizeJob, _child_run))
