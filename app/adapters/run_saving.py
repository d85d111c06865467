"""Keeping a finished run: in the run history with the efficiency it measured (which calibrates
this machine's estimates), or, when the history cannot take it, in a file of its own that the next
start adds to the history (:mod:`app.adapters.kept_runs`). Nothing a person measured is lost.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.adapters.history import RunHistory
from app.adapters.kept_runs import keep_unsaved
from app.core.common.errors import FitScopeError
from app.core.speed.measure import RunResult


@dataclass(frozen=True)
class SaveOutcome:
    """Where a finished run went: the history (``history_id``) or, when the history could not take
    it, a file of its own (``unsaved_path``, None if even that failed) with a message saying so."""

    history_id: int | None = None
    unsaved_path: str | None = None
    message: str | None = None


def record_run(
    result: RunResult,
    estimate: dict[str, Any] | None,
    efficiency: tuple[str, float, int | None] | None,
    machine_key: str,
    *,
    history: RunHistory | None = None,
    path: Path | None = None,
) -> SaveOutcome:
    """Saves a finished run with the estimate it was held against and, when given, the decode
    efficiency it measured (target, share of the roofline, threads) for this machine's calibration.
    Uses ``history`` when the caller holds one open, else opens the one at ``path`` (default: the
    user's). Never raises for a history that cannot be written: the run then goes to a file of its
    own (imported on the next start) and the outcome says where."""

    def save(into: RunHistory) -> int:
        run_id = into.add(result, estimate)
        if efficiency is not None:
            target, value, n_threads = efficiency
            into.set_efficiency(machine_key, target, value, run_id, n_threads)
        return run_id

    try:
        if history is not None:
            return SaveOutcome(history_id=save(history))
        with RunHistory(path) as opened:
            return SaveOutcome(history_id=save(opened))
    except (FitScopeError, OSError, sqlite3.Error) as exc:
        reason = str(exc)
    try:
        kept = keep_unsaved(result, estimate, reason)
    except OSError as exc:
        return SaveOutcome(message=f"The run could not be saved ({reason}); nor kept aside: {exc}.")
    return SaveOutcome(
        unsaved_path=str(kept),
        message=f"The run history could not take this run ({reason}); it was kept in {kept} and will be "
        "added to the history the next time FitScope opens it.",
    )
