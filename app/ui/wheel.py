"""Scrolling never changes a setting: the mouse wheel moves a spin box, a slider or a list box only
when that control has the keyboard focus (a click or Tab gives it). Over any other control the
wheel scrolls the page it is on, as a reader expects when they scroll down the settings.

:func:`guard_wheel` installs one filter on every such control under a widget; controls added later
are guarded when their panel calls it again (it skips the ones already guarded).
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import QAbstractSlider, QAbstractSpinBox, QComboBox, QWidget

_GUARDED = "fitscope_wheel_guarded"
WheelTarget = (QAbstractSpinBox, QAbstractSlider, QComboBox)


class WheelGuard(QObject):
    """Passes a wheel event on to the control's parent (the page scrolls) unless the control has
    the focus."""

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's name
        if event.type() == QEvent.Type.Wheel and isinstance(watched, QWidget) and not watched.hasFocus():
            # Ignored and reported handled: Qt then offers the event to the parent widgets, and the
            # scroll area around the control scrolls.
            event.ignore()
            return True
        return False


def guard_wheel(root: QWidget, guard: WheelGuard | None = None) -> WheelGuard:
    """Guard every spin box, slider and combo box under ``root`` (and ``root`` itself). Returns the
    filter (parented to ``root``, so it lives as long as the widgets)."""
    guard = guard or root.findChild(WheelGuard) or WheelGuard(root)
    controls = [w for w in root.findChildren(QWidget) if isinstance(w, WheelTarget)]
    if isinstance(root, WheelTarget):
        controls.append(root)
    for w in controls:
        if w.property(_GUARDED):
            continue
        w.installEventFilter(guard)
        # A click or Tab gives the focus (a wheel over it no longer does).
        w.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        w.setProperty(_GUARDED, True)
    return guard
