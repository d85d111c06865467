"""The durable store of finished live runs: one SQLite file in the user's data folder.

Each run is kept whole, as ``RunResult`` JSON, next to the few figures the history list shows
(so listing does not parse every run). Measured decode efficiencies per machine and target are
kept beside them, because the estimate uses them in place of its assumed ranges.

Durability: the file is in WAL journal mode with ``synchronous=FULL`` and ``add()`` commits before
it returns, so a crash of the app (or of the OS) after a run has finished loses nothing.

Times are seconds since the epoch, sizes bytes, rates tokens per second.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import math
import os
import sqlite3
import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from app.adapters.kept_runs import read_kept_run, unsaved_runs_dir
from app.adapters.paths import data_dir
from app.core.common.errors import FitScopeError
from app.core.common.files import move_aside, non_finite_problem
from app.core.speed import measure
from app.core.speed.measure import RunResult

__all__ = [
    "BUFFER_KINDS",
    "COMPARE_FIGURES",
    "DEFAULT_DB_NAME",
    "SCHEMA_VERSION",
    "Calibration",
    "HistoryRow",
    "RunHistory",
    "default_history_path",
    "hardware_label",
]

_log = logging.getLogger(__name__)

DEFAULT_DB_NAME = "runs.sqlite3"
SCHEMA_VERSION = 2

# The kinds MeasuredBuffers.total() accepts, in the order compare() lists them. "rs" (recurrent
# state: Mamba / RWKV / hybrid models) is the KV cache's counterpart there, so it is compared too.
BUFFER_KINDS: tuple[str, ...] = ("model", "kv", "rs", "compute", "output")

# The figure names compare() returns, in order.
COMPARE_FIGURES: tuple[str, ...] = (
    "ttft_s",
    "prefill_tokens_per_s",
    "decode_tokens_per_s",
    "itl_p50_s",
    "itl_p95_s",
    "load_s",
    "peak_rss_bytes",
    *(f"{kind}_buffer_bytes" for kind in BUFFER_KINDS),
)

# SQLite's primary result codes for "this is not (or no longer) a database file".
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26

# Tried in order for the short hardware label; the runner decides which keys it fills in.
_HARDWARE_LABEL_KEYS: tuple[str, ...] = ("label", "gpu", "gpu_name", "device", "cpu", "cpu_model", "cpu_name")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    started_at REAL NOT NULL,
    saved_at REAL NOT NULL,
    model_path TEXT NOT NULL,
    model_name TEXT NOT NULL,
    model_sha256 TEXT NOT NULL,
    hardware TEXT NOT NULL,
    mode TEXT NOT NULL,
    n_ctx INTEGER NOT NULL,
    n_gpu_layers INTEGER NOT NULL,
    repeat INTEGER NOT NULL,
    ttft_s REAL,
    prefill_tokens_per_s REAL,
    decode_tokens_per_s REAL,
    peak_rss_bytes INTEGER,
    llama_cpp_version TEXT NOT NULL,
    result_json TEXT NOT NULL,
    estimate_json TEXT
);
CREATE INDEX IF NOT EXISTS runs_started_at ON runs (started_at);
CREATE INDEX IF NOT EXISTS runs_model_sha256 ON runs (model_sha256);
CREATE TABLE IF NOT EXISTS efficiency (
    id INTEGER PRIMARY KEY,
    machine_key TEXT NOT NULL,
    target_name TEXT NOT NULL,
    efficiency REAL NOT NULL,
    run_id INTEGER NOT NULL,
    saved_at REAL NOT NULL,
    n_threads INTEGER
);
CREATE INDEX IF NOT EXISTS efficiency_machine ON efficiency (machine_key, target_name);
"""


OPEN_TIMEOUT_S = 5.0
"""How long a write waits for another process's lock (a run being saved by the other FitScope)."""
BUSY_TIMEOUT_S = 0.25
"""How long opening the history waits for another process's write lock before it opens without
importing kept runs (they are imported next time): start-up never waits on another FitScope."""


def default_history_path() -> Path:
    """``runs.sqlite3`` in FitScope's data folder (``FITSCOPE_DATA_DIR`` overrides the folder)."""
    return data_dir() / DEFAULT_DB_NAME


@dataclass(frozen=True)
class HistoryRow:
    """One line of the history list: medians over the completed repetitions.

    ``started_at`` is seconds since the epoch; ``ttft_s`` seconds; rates are tokens per second;
    ``peak_rss_bytes`` bytes. A figure is None when the run did not produce it.
    """

    run_id: int
    started_at: float
    model_name: str
    model_sha256: str
    hardware: str
    mode: str
    n_ctx: int
    n_gpu_layers: int
    repeat: int
    ttft_s: float | None
    prefill_tokens_per_s: float | None
    decode_tokens_per_s: float | None
    peak_rss_bytes: int | None
    llama_cpp_version: str


_ROW_COLUMNS = (
    "id, started_at, model_name, model_sha256, hardware, mode, n_ctx, n_gpu_layers, repeat, "
    "ttft_s, prefill_tokens_per_s, decode_tokens_per_s, peak_rss_bytes, llama_cpp_version"
)


# add() fills these in this order.
_INSERT_COLUMNS = (
    "started_at",
    "saved_at",
    "model_path",
    "model_name",
    "model_sha256",
    "hardware",
    "mode",
    "n_ctx",
    "n_gpu_layers",
    "repeat",
    "ttft_s",
    "prefill_tokens_per_s",
    "decode_tokens_per_s",
    "peak_rss_bytes",
    "llama_cpp_version",
    "result_json",
    "estimate_json",
)


def _row(values: Sequence[Any]) -> HistoryRow:
    return HistoryRow(*values)


def hardware_label(hardware: dict[str, str]) -> str:
    """A short label for the hardware a run used; empty when the runner recorded nothing usable."""
    for key in _HARDWARE_LABEL_KEYS:
        value = hardware.get(key)
        if value:
            return value
    return ""


def _median(spread: measure.Spread | None) -> float | None:
    return spread.median if spread is not None else None


def _is_corrupt(exc: sqlite3.DatabaseError) -> bool:
    # OperationalError covers "locked", "unable to open", disk I/O: the file may be fine, so it must
    # never be moved aside for those.
    if isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        return code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    return type(exc) is sqlite3.DatabaseError


def _move_aside(path: Path) -> Path:
    """Renames ``path`` (and any WAL / shared-memory files beside it) to ``<name>.corrupt-<timestamp>``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():  # two corrupt files within a second must not overwrite each other
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    os.replace(path, target)
    # A leftover WAL would otherwise be replayed into the fresh, empty database that replaces it.
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            with contextlib.suppress(OSError):
                os.replace(side, target.with_name(target.name + suffix))
    return target


class RunHistory:
    """Finished live runs and measured efficiencies, in one SQLite file.

    Every public method holds one lock, so the store may be shared between threads, although the
    window only calls it from the GUI thread.
    """

    def __init__(self, path: Path | None = None) -> None:
        """Opens (or creates, with its folders) the store at ``path``; None means
        ``default_history_path()``.

        Raises FitScopeError when the file is not a database (after moving it aside as
        ``<name>.corrupt-<timestamp>``, so that the next open starts an empty store) or when a
        newer FitScope wrote it (the file is left as it is).
        """
        self.path = Path(path) if path is not None else default_history_path()
        self._lock = threading.RLock()
        self.notices: list[str] = []
        """Sentences for the user about this open: kept runs refused or left for later."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise FitScopeError(f"Cannot create the folder for the run history {self.path}: {exc}.") from exc
        if self.path.is_dir():
            raise FitScopeError(f"The run history {self.path} is a folder, not a file; move it away.")
        self._conn = self._open()
        if path is None:
            # Start-up must not wait on another process's write lock: a short wait, then the kept
            # runs stay for the next open.
            self._conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            try:
                self.import_unsaved()
            finally:
                self._conn.execute(f"PRAGMA busy_timeout = {int(OPEN_TIMEOUT_S * 1000)}")

    def import_unsaved(self, folder: Path | None = None) -> int:
        """Adds the runs kept aside while the history could not be written (see keep_unsaved) and
        removes their files; returns how many. A file that is not a kept run is moved aside as
        ``NAME.bad``; while the history is busy (another process writing) the files stay for the
        next open. What happened is added to ``notices``, one sentence each."""
        folder = folder or unsaved_runs_dir()
        count = 0
        try:
            kept_files = sorted(folder.glob("run-*.json")) if folder.is_dir() else []
        except OSError:
            return 0
        for kept in kept_files:
            try:
                result, estimate = read_kept_run(kept)
            except FitScopeError as exc:
                moved = move_aside(kept)
                where = f"; it was moved aside as {moved.name}" if moved is not None else ""
                self.notices.append(f"A run kept aside could not be added to the history: {exc}{where}")
                _log.warning("kept run %s refused: %s", kept, exc)
                continue
            try:
                self.add(result, estimate)
            except sqlite3.OperationalError as exc:
                self.notices.append(
                    f"The run history is busy ({exc}); the runs kept in {folder} will be added the next time."
                )
                break
            except (ValueError, sqlite3.Error) as exc:
                moved = move_aside(kept)
                where = f"; it was moved aside as {moved.name}" if moved is not None else ""
                self.notices.append(f"A run kept aside could not be added to the history ({exc}){where}.")
                continue
            with contextlib.suppress(OSError):
                kept.unlink()
            count += 1
        return count

    def _open(self) -> sqlite3.Connection:
        try:
            # isolation_level=None: transactions are explicit (_transaction), so nothing is left
            # uncommitted by an implicit BEGIN.
            conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=OPEN_TIMEOUT_S)
        except sqlite3.Error as exc:
            raise FitScopeError(f"Cannot open the run history {self.path}: {exc}.") from exc
        try:
            # Read before anything writes: switching to WAL rewrites the header, and a file from a
            # newer FitScope must be left untouched.
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise FitScopeError(
                    f"The run history {self.path} was written by a newer FitScope (schema version {version}; "
                    f"this one reads up to {SCHEMA_VERSION}). Update FitScope, or move the file away to start "
                    "a new history."
                )
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                # Some network file systems refuse WAL; a rollback journal with FULL sync is as safe.
                _log.warning("The run history %s is in %s journal mode, not WAL.", self.path, mode)
            conn.execute("PRAGMA synchronous=FULL")
            if version < SCHEMA_VERSION:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    # Statement by statement: executescript() would COMMIT the open transaction first,
                    # and the tables and the version must appear together or not at all.
                    for statement in _SCHEMA.split(";"):
                        if statement.strip():
                            conn.execute(statement)
                    columns = {row[1] for row in conn.execute("PRAGMA table_info(efficiency)")}
                    if "n_threads" not in columns:
                        # Version 1 kept no thread count: its efficiencies stay, but never calibrate.
                        conn.execute("ALTER TABLE efficiency ADD COLUMN n_threads INTEGER")
                    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                    conn.execute("COMMIT")
                except BaseException:
                    # A failed ROLLBACK (no transaction left) must not hide the error that caused it.
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                    raise
        except FitScopeError:
            conn.close()
            raise
        except sqlite3.DatabaseError as exc:
            conn.close()
            if not _is_corrupt(exc):
                busy = "locked" in str(exc) or "busy" in str(exc)
                why = " (another FitScope is writing to it; runs are saved again once it is free)" if busy else ""
                raise FitScopeError(f"Cannot open the run history {self.path}: {exc}{why}.") from exc
            try:
                moved = _move_aside(self.path)
            except OSError as move_exc:
                raise FitScopeError(
                    f"The run history {self.path} is not a valid database ({exc}), and it could not be moved "
                    f"aside: {move_exc}. Move or delete it to start a new history."
                ) from exc
            raise FitScopeError(
                f"The run history {self.path} is not a valid database ({exc}). It was moved aside as "
                f"{moved.name}; FitScope starts a new, empty history."
            ) from exc
        return conn

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def __enter__(self) -> RunHistory:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def add(self, result: RunResult, estimate: dict | None = None) -> int:
        """Stores a finished (or stopped) run and the estimate it was compared with (any JSON-able
        dict, or None). Committed to disk before it returns; returns the new run id. Raises
        FitScopeError for a run with a figure that is not a finite number (SQLite would store a
        NaN start time as NULL and refuse the row)."""
        problem = non_finite_problem(result.model_dump()) or non_finite_problem(estimate)
        if problem:
            raise FitScopeError(f"This run cannot be stored: {problem}.")
        figures = measure.summary(result)
        settings = result.settings
        values = (
            result.started_at,
            time.time(),
            settings.gguf_path,
            _file_name(settings.gguf_path),
            result.model_sha256,
            hardware_label(result.hardware),
            settings.mode,
            settings.context_tokens,
            settings.n_gpu_layers,
            len(result.completed_runs),
            _median(figures["ttft_s"]),
            _median(figures["prefill_tokens_per_s"]),
            _median(figures["decode_tokens_per_s"]),
            result.peak_rss_bytes,
            result.llama_cpp_version,
            result.model_dump_json(),
            json.dumps(estimate) if estimate is not None else None,
        )
        with self._transaction() as conn:
            cursor = conn.execute(
                f"INSERT INTO runs ({', '.join(_INSERT_COLUMNS)}) VALUES ({', '.join('?' * len(_INSERT_COLUMNS))})",
                values,
            )
            run_id = cursor.lastrowid
        assert run_id is not None
        return run_id

    def rows(self, limit: int = 500) -> list[HistoryRow]:
        """The newest ``limit`` runs, newest (by start time) first."""
        with self._lock:
            found = self._conn.execute(
                f"SELECT {_ROW_COLUMNS} FROM runs ORDER BY started_at DESC, id DESC LIMIT ?", (max(0, limit),)
            ).fetchall()
        return [_row(v) for v in found]

    def get(self, run_id: int) -> tuple[RunResult, dict | None]:
        """The stored run and its estimate (None when none was stored). KeyError when there is no such run."""
        with self._lock:
            found = self._conn.execute("SELECT result_json, estimate_json FROM runs WHERE id = ?", (run_id,)).fetchone()
        if found is None:
            raise KeyError(run_id)
        result_json, estimate_json = found
        return RunResult.model_validate_json(result_json), (
            json.loads(estimate_json) if estimate_json is not None else None
        )

    def compare(self, a: int, b: int) -> list[tuple[str, float | None, float | None, float | None]]:
        """Run ``a`` against run ``b``, one tuple per name in ``COMPARE_FIGURES``: (name, value in a,
        value in b, b / a - 1). The change is a fraction (0.25 = 25 % more in b) and None when either
        value is missing or a's is zero. Times in seconds, rates in tokens per second, sizes in bytes;
        a buffer total is None when llama.cpp reported no buffer of that kind."""
        first, _ = self.get(a)
        second, _ = self.get(b)
        va, vb = _compare_values(first), _compare_values(second)
        out: list[tuple[str, float | None, float | None, float | None]] = []
        for name in COMPARE_FIGURES:
            x, y = va[name], vb[name]
            change = y / x - 1 if x is not None and y is not None and x != 0 else None
            out.append((name, x, y, change))
        return out

    def export_csv(self, path: Path, run_ids: Sequence[int] | None = None) -> int:
        """Writes one CSV line per run (the ``HistoryRow`` fields, then ``settings`` as JSON text) to
        ``path``, UTF-8. ``run_ids`` None exports every run, newest first; otherwise those runs in
        that order, skipping ids that are not stored. Returns the number of runs written."""
        names = [f.name for f in fields(HistoryRow)]
        with self._lock:
            if run_ids is None:
                found = self._conn.execute(
                    f"SELECT {_ROW_COLUMNS}, result_json FROM runs ORDER BY started_at DESC, id DESC"
                ).fetchall()
            else:
                found = []
                for run_id in run_ids:
                    one = self._conn.execute(
                        f"SELECT {_ROW_COLUMNS}, result_json FROM runs WHERE id = ?", (run_id,)
                    ).fetchone()
                    if one is not None:
                        found.append(one)
        path = Path(path)
        # Written beside the target then renamed, so a failed export never leaves half a file there.
        partial = path.with_name(path.name + ".partial")
        try:
            with partial.open("w", newline="", encoding="utf-8") as fh:
                writer = csv.writer(fh)
                writer.writerow([*names, "settings"])
                for values in found:
                    row = asdict(_row(values[:-1]))
                    settings = json.loads(values[-1]).get("settings", {})
                    writer.writerow([*(row[n] for n in names), json.dumps(settings, sort_keys=True)])
            os.replace(partial, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                partial.unlink()
            raise FitScopeError(f"Cannot write {path}: {exc}.") from exc
        return len(found)

    def delete(self, run_id: int) -> None:
        """Removes a run and the efficiencies measured from it (the next newest then applies).
        KeyError when there is no such run."""
        with self._transaction() as conn:
            if conn.execute("DELETE FROM runs WHERE id = ?", (run_id,)).rowcount == 0:
                raise KeyError(run_id)
            conn.execute("DELETE FROM efficiency WHERE run_id = ?", (run_id,))

    def set_efficiency(
        self, machine_key: str, target_name: str, efficiency: float, run_id: int, n_threads: int | None
    ) -> None:
        """Records the decode efficiency (measured / bandwidth-bound tokens per second, a fraction
        above 0) that run ``run_id`` measured for ``target_name`` on ``machine_key`` with
        ``n_threads`` CPU threads. Earlier values are kept; the median of them all calibrates
        (:meth:`efficiencies`). ValueError for a value
        that is not a positive finite number, KeyError when there is no such run."""
        if not math.isfinite(efficiency) or efficiency <= 0:
            raise ValueError(f"efficiency must be a positive finite number, not {efficiency!r}")
        with self._transaction() as conn:
            if conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
                raise KeyError(run_id)
            conn.execute(
                "INSERT INTO efficiency (machine_key, target_name, efficiency, run_id, saved_at, n_threads)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (machine_key, target_name, float(efficiency), run_id, time.time(), n_threads),
            )

    def efficiencies(self, machine_key: str, n_threads: int) -> dict[str, float]:
        """Target name -> the median decode efficiency recorded on ``machine_key`` by runs with
        ``n_threads`` threads (llama-server's count, so that estimates follow what llama-server does;
        values measured with other or unrecorded thread counts never calibrate). The median, so that
        one run measured while something else used the machine cannot move the calibration much."""
        return {name: c.efficiency for name, c in self.calibration(machine_key, n_threads).items()}

    def calibration(self, machine_key: str, n_threads: int) -> dict[str, Calibration]:
        """Target name -> its :class:`Calibration` (see :meth:`efficiencies`)."""
        with self._lock:
            found = self._conn.execute(
                "SELECT target_name, efficiency, saved_at FROM efficiency WHERE machine_key = ? AND n_threads = ?"
                " ORDER BY id",
                (machine_key, n_threads),
            ).fetchall()
        values: dict[str, list[tuple[float, float]]] = {}
        for name, value, saved_at in found:
            values.setdefault(name, []).append((value, saved_at))
        return {
            name: Calibration(statistics.median(v for v, _ in rows), len(rows), max(t for _, t in rows))
            for name, rows in values.items()
        }

    def reset_calibration(self, machine_key: str) -> int:
        """Forget the efficiencies measured on ``machine_key`` (the runs stay). Returns how many."""
        with self._transaction() as conn:
            return conn.execute("DELETE FROM efficiency WHERE machine_key = ?", (machine_key,)).rowcount

    def close(self) -> None:
        """Closes the file (safe to call twice). Nothing is pending: every change was committed."""
        with self._lock:
            self._conn.close()


def _file_name(gguf_path: str) -> str:
    # The path may come from another OS (a history copied between machines), so split on both.
    return gguf_path.replace("\\", "/").rsplit("/", 1)[-1]


def _compare_values(result: RunResult) -> dict[str, float | None]:
    figures = measure.summary(result)
    values: dict[str, float | None] = {
        name: _median(figures[name])
        for name in ("ttft_s", "prefill_tokens_per_s", "decode_tokens_per_s", "itl_p50_s", "itl_p95_s")
    }
    values["load_s"] = result.load_s
    values["peak_rss_bytes"] = result.peak_rss_bytes
    for kind in BUFFER_KINDS:
        # An empty dict means llama.cpp printed none (or the runner did not parse them), not zero bytes.
        reported = getattr(result.buffers, f"{kind}_buffers")
        values[f"{kind}_buffer_bytes"] = result.buffers.total(kind) if reported else None
    return values


@dataclass(frozen=True)
class Calibration:
    """How one device of a machine is calibrated: the median ``efficiency`` of ``runs`` good runs,
    the newest saved at ``latest_s`` (seconds since the epoch)."""

    efficiency: float
    runs: int
    latest_s: float
