"""Results that know what they are for. A tab's results (the advisor's machines, a run, an A/B
comparison, a load simulation, a scale-out plan) were computed for some settings; when the settings
on the left change, the results stay, greyed, under one line saying which settings they are for and
how to bring them up to date, until the tab computes again.

:class:`Basis` is what results were computed for, in words ("model: Qwen3 32B", "people: 12");
:class:`StaleMark` greys a tab's result widgets and shows its note when the current basis differs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from PySide6.QtWidgets import QGraphicsOpacityEffect, QLabel, QWidget

GREYED_OPACITY = 0.35


@dataclass(frozen=True)
class Basis:
    """The settings results depend on, each named and said in words, in order."""

    parts: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, parts: Mapping[str, str], keys: Iterable[str]) -> Basis:
        """The parts of ``parts`` named in ``keys`` (the ones a tab's results depend on)."""
        return cls(tuple((k, parts[k]) for k in keys if k in parts))

    def changes(self, now: Basis) -> list[str]:
        """What differs from ``now``, as "people: 12 (now 4)"."""
        mine = dict(self.parts)
        return [f"{k}: {mine[k]} (now {v})" for k, v in now.parts if k in mine and mine[k] != v]


class StaleMark:
    """Greys ``results`` and shows ``note`` while the results' basis differs from the current one.

    A tab tells it the settings now (:meth:`set_settings`, in words, every one the window has; it
    keeps the ``keys`` its results depend on), calls :meth:`begin` when it starts computing and
    :meth:`done` when the results are on screen."""

    def __init__(self, note: QLabel, results: Sequence[QWidget], action: str, keys: Sequence[str] = ()) -> None:
        """``action`` is what brings the results up to date ("press Run")."""
        self.note = note
        self.note.setWordWrap(True)
        self.note.setVisible(False)
        self.note.setAccessibleName("Results are out of date")
        self._results = list(results)
        self._action = action
        self._keys = tuple(keys)
        self._pending: Basis | None = None
        self.computed: Basis | None = None
        self.current: Basis | None = None

    def set_settings(self, parts: Mapping[str, str]) -> None:
        """The window's settings now, in words (the ones this tab's results depend on are kept)."""
        self.set_current(Basis.of(parts, self._keys))

    def begin(self) -> None:
        """A computation starts, for the settings now."""
        self._pending = self.current

    def done(self) -> None:
        """The computation begun last is on screen."""
        self.set_computed(self._pending)

    @property
    def stale(self) -> bool:
        return self.computed is not None and self.current is not None and bool(self.computed.changes(self.current))

    def set_computed(self, basis: Basis | None) -> None:
        """The results now on screen were computed for ``basis`` (None: there are none)."""
        self.computed = basis
        self._show()

    def set_current(self, basis: Basis) -> None:
        """The settings on the left now."""
        self.current = basis
        self._show()

    def _show(self) -> None:
        stale = self.stale
        for w in self._results:
            effect = w.graphicsEffect()
            if stale and not isinstance(effect, QGraphicsOpacityEffect):
                greyed = QGraphicsOpacityEffect(w)
                greyed.setOpacity(GREYED_OPACITY)
                w.setGraphicsEffect(greyed)
            elif not stale and isinstance(effect, QGraphicsOpacityEffect):
                w.setGraphicsEffect(None)  # type: ignore[arg-type]
        self.note.setVisible(stale)
        if stale and self.computed is not None and self.current is not None:
            changed = "; ".join(self.computed.changes(self.current))
            self.note.setText(f"⚠ These results are for other settings ({changed}): {self._action} to update them.")
