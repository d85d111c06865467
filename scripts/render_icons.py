"""Render resources/icons/fitscope.svg to the PNG sizes desktops ask for (16 to 256 pixels).

    QT_QPA_PLATFORM=offscreen .venv/bin/python scripts/render_icons.py
"""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

ICONS = Path(__file__).resolve().parents[1] / "resources" / "icons"
SIZES = (16, 24, 32, 48, 64, 128, 256)


def main() -> int:
    _app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])
    renderer = QSvgRenderer(str(ICONS / "fitscope.svg"))
    if not renderer.isValid():
        print("render_icons: fitscope.svg is not a valid SVG", file=sys.stderr)
        return 1
    for size in SIZES:
        image = QImage(size, size, QImage.Format.Format_ARGB32)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        renderer.render(painter)
        painter.end()
        out = ICONS / f"fitscope-{size}.png"
        image.save(str(out))
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
