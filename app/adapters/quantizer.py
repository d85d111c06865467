"""Make a quantized variant of a GGUF file with llama.cpp's own quantizer (``llama_model_quantize``
through llama-cpp-python), in a child process that reports its progress and can be cancelled.

The child prints one JSON line per tensor (``{"event": "progress", "done": i, "total": n}``),
read from llama.cpp's ``[ i/ n] name ...`` log lines, then ``done`` or ``error``. Cancelling kills
it and deletes the half-written file.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from app.adapters.child import start_child
from app.core.errors import FitScopeError
from app.core.quant import find_preset

_PROGRESS = re.compile(r"\[\s*(\d+)\s*/\s*(\d+)\s*\]")


class QuantizeError(FitScopeError):
    """The quantizer could not make the file, or was cancelled."""


class Quantization:
    """One running quantization; ``cancel()`` is safe from any thread."""

    def __init__(self, source: str | os.PathLike[str], target: str | os.PathLike[str], preset: str) -> None:
        self.source = Path(source)
        self.target = Path(target)
        self.preset = find_preset(preset)
        if not self.source.is_file():
            raise QuantizeError(f"{self.source} does not exist or is not a file.")
        if self.target.resolve() == self.source.resolve():
            raise QuantizeError("The quantized file must not replace its source; choose another name.")
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self._proc = start_child("app.adapters.quantizer")
        self.cancelled = threading.Event()
        self._stderr: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()
        assert self._proc.stdin is not None
        self._proc.stdin.write(
            json.dumps({"source": str(self.source), "target": str(self.target), "ftype": self.preset.ftype}) + "\n"
        )
        self._proc.stdin.close()

    def _drain(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._stderr.append(line)
            del self._stderr[:-50]

    def cancel(self) -> None:
        self.cancelled.set()
        with contextlib.suppress(OSError):
            self._proc.kill()

    def wait(self, on_progress: Callable[[int, int], None] | None = None) -> Path:
        """Follow the quantizer to its end. Returns the new file. Raises QuantizeError."""
        error = None
        finished = False
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("event") == "progress" and on_progress is not None:
                on_progress(int(event["done"]), int(event["total"]))
            elif event.get("event") == "error":
                error = event.get("message")
            elif event.get("event") == "done":
                finished = True
        code = self._proc.wait()
        if self.cancelled.is_set() or not finished:
            with contextlib.suppress(OSError):
                self.target.unlink()
        if self.cancelled.is_set():
            raise QuantizeError(f"Making {self.target.name} was cancelled; the partial file was removed.")
        if error or not finished:
            tail = "".join(self._stderr[-3:]).strip()
            raise QuantizeError(
                f"llama.cpp could not quantize {self.source.name} to {self.preset.name}: "
                + (error or f"it stopped with exit code {code}" + (f" ({tail})" if tail else ""))
            )
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


def _child() -> int:
    events_fd = os.dup(1)
    os.dup2(2, 1)
    out = os.fdopen(events_fd, "w", encoding="utf-8", buffering=1)

    def emit(event: dict) -> None:
        out.write(json.dumps(event) + "\n")
        out.flush()

    job = json.loads(sys.stdin.readline())
    import llama_cpp

    errors: list[str] = []

    def on_log(level: int, text: bytes | None, _user: ctypes.c_void_p) -> None:
        s = (text or b"").decode("utf-8", "replace")
        if m := _PROGRESS.search(s):
            emit({"event": "progress", "done": int(m[1]), "total": int(m[2])})
        if level == 4:
            errors.append(s.strip())

    callback = llama_cpp.llama_log_callback(on_log)  # referenced while llama.cpp may log
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = int(job["ftype"])
    params.nthread = os.cpu_count() or 1
    params.allow_requantize = True  # a Q8_0 source may be the best the user has
    code = llama_cpp.llama_model_quantize(job["source"].encode(), job["target"].encode(), ctypes.byref(params))
    if code != 0:
        emit({"event": "error", "message": (errors[0] if errors else f"llama_model_quantize returned {code}")})
        return 1
    emit({"event": "done"})
    return 0


if __name__ == "__main__":
    sys.exit(_child())
