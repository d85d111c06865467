"""Every word readable: at 1024x768, 1280x720 (a projector) and 1920x1080, in normal and
presentation mode, on every tab the window shows, no widget text, table header or cell is cut off,
no wrapped label loses lines, and (in presentation mode) no chart text is smaller than a projector
needs. The long hardware names of the catalog are chosen on purpose, and "Which machine?" is shown
with its answer."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QTabWidget
from test_window import make_services, open_window, settle

from app.core.model.catalog import find_device, load_devices
from app.core.report.choices import Controls, HardwareChoice, ModelChoice
from app.ui.legibility import chart_text_problems, chart_text_sizes, clipped_texts
from app.ui.panels import device_label, device_tooltip

PRESENTATION_MIN_PT = 14.0
NORMAL_MIN_PT = 8.0


def test_device_labels_drop_the_vendor_and_details_and_price_the_whole_computer():
    from app.core.advisor.configs import machine_price

    rtx = find_device("rtx-4090")
    pc = machine_price(rtx).total_usd
    assert device_label(rtx) == f"RTX 4090 · 24 GiB · ${pc:,.0f} PC" and pc > 1599
    # The card's own price is said as the card's, with the rest of the machine, one hover away.
    assert "the $1,599 card + " in device_tooltip(rtx) and "assumed" in device_tooltip(rtx)
    assert device_label(find_device("threadripper-7980x")).startswith("Threadripper 7980X · 256 GiB · $")
    assert device_label(find_device("m2-ultra-192gb")) == "M2 Ultra · 192 GiB"  # no list price
    assert device_label(find_device("m4-max-128gb")) == "M4 Max · 128 GiB · $3,499 computer"
    labels = [device_label(d) for d in load_devices()]
    assert len(set(labels)) == len(labels)  # still tells every device apart
    assert max(map(len, labels)) <= 50


def _longest_device_id() -> str:
    device = max(load_devices(), key=lambda d: len(device_label(d)))
    return f"catalog:{device.id}"


@pytest.mark.parametrize("size", [(1024, 768), (1280, 720), (1920, 1080)], ids=["1024x768", "720p", "1080p"])
@pytest.mark.parametrize("presentation", [False, True], ids=["normal", "presentation"])
def test_nothing_is_clipped_and_chart_text_is_large_enough(qtbot, tmp_path, size, presentation):
    window = open_window(qtbot, make_services(tmp_path))
    window.resize(*size)
    window.set_presentation(presentation)
    longest = _longest_device_id().removeprefix("catalog:")
    window.set_scenario(
        model=ModelChoice(kind="catalog", ref="qwen3-32b"),
        hardware=HardwareChoice(kind="catalog", device_id=longest),
        controls=Controls(context_per_user_tokens=8192, users=12),
        compare=(
            HardwareChoice(kind="catalog", device_id="rtx-3090", count=2),
            HardwareChoice(kind="catalog", device_id="m4-max-128gb"),
            HardwareChoice(kind="catalog", device_id=longest),
        ),
    )
    settle(qtbot, window, lambda v: v.request.model.ref == "qwen3-32b" and len(v.comparison) == 3)
    # "Which machine?" with its answer on screen (its table is what a room reads).
    with qtbot.waitSignal(window.advisor_panel.advice_shown, timeout=60000):
        assert window.advisor_panel.find_machines()
    qtbot.wait(200)
    floor = PRESENTATION_MIN_PT if presentation else NORMAL_MIN_PT
    problems: list[str] = []
    tabs = window.findChild(QTabWidget)
    for i in range(tabs.count()):
        if not tabs.isTabVisible(i):
            continue
        tabs.setCurrentIndex(i)
        qtbot.wait(50)
        where = tabs.tabText(i).replace("&", "")
        problems += [f"{where}: {c}" for c in clipped_texts(window)]
        problems += [f"{where}: {what} at {pt:.1f} pt" for what, pt in chart_text_sizes(window) if pt < floor]
        problems += [f"{where}: {p}" for p in chart_text_problems(window)]
    assert not problems, "\n".join(problems)
    window.close()
