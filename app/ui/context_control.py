"""Conversation length per person: a logarithmic slider from 512 tokens to the model's trained
context, and a box to type an exact figure in tokens, words or pages (the unit chosen beside it),
with the length said in all three under it and the assumption behind the conversion
(:mod:`app.core.report.lengths`). Emits ``context_changed(tokens)`` when the person moves either,
``unit_changed(unit)`` when they pick another unit; ``set_tokens`` and ``set_unit`` emit nothing.
"""

from __future__ import annotations

import math

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QDoubleSpinBox, QHBoxLayout, QLabel, QSlider, QVBoxLayout, QWidget

from app.core.memory.records import MAX_CONTEXT_TOKENS
from app.core.report.choices import MIN_CONTEXT_TOKENS
from app.core.report.lengths import ASSUMPTION, from_unit, length_words, to_unit

STEPS_PER_OCTAVE = 16
UNITS = (("tokens", "tokens"), ("words", "words"), ("pages", "pages"))


class ContextControl(QWidget):
    """The slider, the value box with its unit, and the length in words."""

    context_changed = Signal(int)
    unit_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setSingleStep(1)
        self.slider.setPageStep(STEPS_PER_OCTAVE)
        self.slider.setAccessibleName("Context length slider")
        self.spin = QDoubleSpinBox()
        self.spin.setGroupSeparatorShown(True)
        self.spin.setAccessibleName("Context length")
        self.spin.setKeyboardTracking(False)
        self.unit_combo = QComboBox()
        for key, words in UNITS:
            self.unit_combo.addItem(words, key)
        self.unit_combo.setAccessibleName("Unit of the context length")
        self.unit_combo.setToolTip(f"Type the length in tokens, words or pages: {ASSUMPTION}.")
        self.words = QLabel("")
        self.words.setWordWrap(True)
        self.words.setToolTip(f"Assumed: {ASSUMPTION}.")
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.spin, 1)
        row.addWidget(self.unit_combo)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.slider)
        layout.addLayout(row)
        layout.addWidget(self.words)
        self._tokens = 4096
        self._top = 4096
        self._set_unit_range("tokens")
        self.set_trained_context(4096)
        self.set_tokens(4096)
        self.slider.valueChanged.connect(self._slider_moved)
        self.spin.valueChanged.connect(self._typed)
        self.unit_combo.activated.connect(self._unit_picked)

    @staticmethod
    def tokens_at(position: int) -> int:
        tokens = MIN_CONTEXT_TOKENS * 2 ** (position / STEPS_PER_OCTAVE)
        step = 256 if tokens >= 2048 else 64
        return int(round(tokens / step) * step)

    @staticmethod
    def position_of(tokens: int) -> int:
        return int(round(STEPS_PER_OCTAVE * math.log2(max(tokens, MIN_CONTEXT_TOKENS) / MIN_CONTEXT_TOKENS)))

    @property
    def unit(self) -> str:
        return str(self.unit_combo.currentData())

    def _set_unit_range(self, unit: str) -> None:
        was = self.spin.blockSignals(True)
        self.spin.setDecimals(1 if unit == "pages" else 0)
        self.spin.setRange(to_unit(1, unit) if unit == "tokens" else 0.1, to_unit(MAX_CONTEXT_TOKENS, unit))
        self.spin.setSingleStep({"tokens": 256, "words": 200, "pages": 1}[unit])
        self.spin.blockSignals(was)

    def set_trained_context(self, n_ctx_train: int) -> None:
        self._top = max(n_ctx_train, MIN_CONTEXT_TOKENS)
        was = self.slider.blockSignals(True)
        self.slider.setRange(0, self.position_of(self._top))
        self.slider.setValue(self.position_of(self._tokens))
        self.slider.blockSignals(was)
        self.slider.setToolTip(f"512 to {self._top:,} tokens (the model's trained context); type any value below")

    def set_unit(self, unit: str) -> None:
        """Show lengths in ``unit`` ("tokens", "words" or "pages")."""
        was = self.unit_combo.blockSignals(True)
        self.unit_combo.setCurrentIndex(max(0, self.unit_combo.findData(unit)))
        self.unit_combo.blockSignals(was)
        self._set_unit_range(self.unit)
        self._show_value()

    def set_tokens(self, tokens: int) -> None:
        self._tokens = tokens
        was = self.slider.blockSignals(True)
        self.slider.setValue(self.position_of(tokens))
        self.slider.blockSignals(was)
        self._show_value()

    def tokens(self) -> int:
        return self._tokens

    def _show_value(self) -> None:
        was = self.spin.blockSignals(True)
        self.spin.setValue(to_unit(self._tokens, self.unit))
        self.spin.blockSignals(was)
        self.words.setText(length_words(self._tokens))

    def _slider_moved(self, position: int) -> None:
        self._tokens = self._top if position >= self.slider.maximum() else self.tokens_at(position)
        self._show_value()
        self.context_changed.emit(self._tokens)

    def _typed(self, value: float) -> None:
        self._tokens = min(MAX_CONTEXT_TOKENS, from_unit(value, self.unit))
        was = self.slider.blockSignals(True)
        self.slider.setValue(self.position_of(self._tokens))
        self.slider.blockSignals(was)
        self.words.setText(length_words(self._tokens))
        self.context_changed.emit(self._tokens)

    def _unit_picked(self, _index: int) -> None:
        self._set_unit_range(self.unit)
        self._show_value()
        self.unit_changed.emit(self.unit)
