"""Runs kept aside in files of their own: written when the run history cannot take a finished run
(``unsaved-runs/run-*.json`` in the data folder), read back by the next open of the history.

What is read back is treated as hostile: a kept run must be a regular file (a FIFO would block
every start, a link to /dev/zero would be read for ever) of at most :data:`MAX_KEPT_RUN_BYTES`,
strict JSON (no NaN, no deep nesting), a kept run's shape, and finite numbers; anything else is
refused with a sentence (the history then moves the file aside as ``.bad``).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from app.adapters.paths import data_dir
from app.core.common.errors import FitScopeError
from app.core.common.files import non_finite_problem, read_json_file
from app.core.speed.measure import RunResult


def unsaved_runs_dir() -> Path:
    """Where a finished run goes when the history cannot take it; the next open imports it."""
    return data_dir() / "unsaved-runs"


MAX_KEPT_RUN_BYTES = 64 * 1024**2
"""A kept run is a RunResult with every token's time: a few hundred KiB for long runs."""


def keep_unsaved(result: RunResult, estimate: dict | None, reason: str) -> Path:
    """Writes a run the history could not store to its own JSON file (atomically) and returns the
    path. Raises OSError only when even that folder cannot be written; a partial file is never left
    behind (a full disk)."""
    folder = unsaved_runs_dir()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"run-{int(result.started_at * 1000)}-{os.getpid()}.json"
    partial = target.with_suffix(".partial")
    payload = {"result": json.loads(result.model_dump_json()), "estimate": estimate, "reason": reason}
    try:
        partial.write_text(json.dumps(payload), encoding="utf-8")
        os.replace(partial, target)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise
    return target


def read_kept_run(path: Path) -> tuple[RunResult, dict | None]:
    """The run and estimate in a kept-run file. Raises FitScopeError saying what is wrong: not a
    regular file (a FIFO, a link to a device), over MAX_KEPT_RUN_BYTES, not strict JSON (NaN,
    deep nesting), not a kept run's shape, or a figure that is not a finite number."""
    from pydantic import ValidationError

    payload = read_json_file(path, "kept run", MAX_KEPT_RUN_BYTES)
    if not isinstance(payload, dict) or not isinstance(payload.get("result"), dict):
        raise FitScopeError(f"{path.name} is not a kept run (no 'result' object).")
    estimate = payload.get("estimate")
    if estimate is not None and not isinstance(estimate, dict):
        raise FitScopeError(f"{path.name} is not a kept run (its 'estimate' is not an object).")
    try:
        result = RunResult.model_validate(payload["result"])
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise FitScopeError(f"{path.name} is not a kept run ({where}: {first['msg']}).") from None
    problem = non_finite_problem(result.model_dump())  # "nan" as text validates as a float
    if problem:
        raise FitScopeError(f"{path.name} is not a kept run: {problem}.")
    return result, estimate
