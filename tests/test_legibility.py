"""Every word readable: at 1280x720 and 1920x1080, in normal and presentation mode, on every tab,
no widget text is cut off and (in presentation mode) no chart text is smaller than a projector needs.
The long hardware names of the catalog are chosen on purpose."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QTabWidget
from test_window import make_services, open_window, settle

from app.core.model.catalog import load_devices
from app.ui.legibility import chart_text_problems, chart_text_sizes, clipped_texts
from app.ui.panels import device_label

PRESENTATION_MIN_PT = 14.0
NORMAL_MIN_PT = 8.0


def test_device_labels_drop_the_vendor_and_details_but_keep_memory_and_price():
    assert device_label("NVIDIA GeForce RTX 4090", 24, 1599) == "RTX 4090 · 24 GiB · $1,599"
    assert device_label("AMD Threadripper 7980X (64 cores, DDR5-5200 4ch, 256GB)", 256, 4999) == (
        "Threadripper 7980X · 256 GiB · $4,999"
    )
    assert device_label("Apple M2 Ultra (76-core GPU) 192GB", 192, None) == "M2 Ultra · 192 GiB"
    labels = [device_label(d.name, d.memory_gib, d.price_usd) for d in load_devices()]
    assert len(set(labels)) == len(labels)  # still tells every device apart
    assert max(map(len, labels)) <= 42


def _longest_device_id() -> str:
    device = max(load_devices(), key=lambda d: len(device_label(d.name, d.memory_gib, d.price_usd)))
    return f"catalog:{device.id}"


@pytest.mark.parametrize("size", [(1280, 720), (1500, 940), (1920, 1080)], ids=["720p", "1500", "1080p"])
@pytest.mark.parametrize("presentation", [False, True], ids=["normal", "presentation"])
def test_nothing_is_clipped_and_chart_text_is_large_enough(qtbot, tmp_path, size, presentation):
    window = open_window(qtbot, make_services(tmp_path))
    window.resize(*size)
    window.set_presentation(presentation)
    longest = _longest_device_id()
    window._select_combo(window.target_combo, longest)
    window._select_combo(window.compare_combos[0], longest)
    window.request_estimate()
    settle(qtbot, window)
    qtbot.wait(200)
    floor = PRESENTATION_MIN_PT if presentation else NORMAL_MIN_PT
    problems: list[str] = []
    tabs = window.findChild(QTabWidget)
    for i in range(tabs.count()):
        tabs.setCurrentIndex(i)
        qtbot.wait(50)
        where = tabs.tabText(i).replace("&", "")
        problems += [f"{where}: {c}" for c in clipped_texts(window)]
        problems += [f"{where}: {what} at {pt:.1f} pt" for what, pt in chart_text_sizes(window) if pt < floor]
        problems += [f"{where}: {p}" for p in chart_text_problems(window)]
    assert not problems, "\n".join(problems)
    window.close()
