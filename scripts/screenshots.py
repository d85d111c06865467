"""Drive the window to a few views and save screenshots (run through scripts/screenshots.sh, which
starts a virtual X display with xvfb). Presentation mode is shot at 1280x720, a projector's size,
and every word on those shots is checked for clipping (app.ui.legibility).

    scripts/screenshots.sh [OUTPUT_DIR]                       # default docs/screenshots
    scripts/screenshots.sh [OUTPUT_DIR] --presentation-only   # only the 1280x720 presentation shots
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("FITSCOPE_CONFIG_DIR", tempfile.mkdtemp(prefix="fitscope-shots-"))
os.environ.setdefault("FITSCOPE_DATA_DIR", tempfile.mkdtemp(prefix="fitscope-shots-data-"))

from PySide6.QtCore import QEventLoop, Qt, QTimer
from PySide6.QtWidgets import QApplication


def wait_until(window, predicate, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    loop = QEventLoop()
    timer = QTimer(interval=20)

    def check() -> None:
        done = window.view is not None and not window.busy and predicate(window.view)
        if done or time.monotonic() > deadline:
            loop.quit()

    timer.timeout.connect(check)
    timer.start()
    loop.exec()
    timer.stop()
    if not (window.view is not None and predicate(window.view)):
        raise SystemExit("screenshots: the window did not reach the expected view in time")
    settle = QEventLoop()
    QTimer.singleShot(400, settle.quit)  # let it paint
    settle.exec()


def find_machines(window) -> None:
    """Run "Which machine?" for the workload on screen and wait for its answer."""
    from PySide6.QtCore import QEventLoop, QTimer

    advisor = window.advisor_panel
    advised = QEventLoop()
    advisor.advice_shown.connect(lambda *_: advised.quit())
    advisor.error_shown.connect(lambda *_: advised.quit())
    QTimer.singleShot(60_000, advised.quit)
    advisor.find_machines()
    advised.exec()
    wait_until(window, lambda v: True)


def presentation_shots(window, shot) -> None:
    """Presentation mode on a 1280x720 projector: a 12-person office choosing Qwen3 32B, on the
    charts, "Which machine?" and "Compare hardware"; every word on them checked for clipping."""
    from app.core.report.choices import Controls, HardwareChoice, ModelChoice
    from app.ui.legibility import chart_text_problems, clipped_texts

    qwen = ModelChoice(kind="catalog", ref="qwen3-32b", quant="Q4_K_M")
    window.resize(1280, 720)
    window.set_scenario(
        model=qwen,
        hardware=HardwareChoice(kind="catalog", device_id="rtx-5090", host_ram_gib=64),
        controls=Controls(context_per_user_tokens=8192, users=12),
        compare=(
            HardwareChoice(kind="catalog", device_id="rtx-3090", count=2),
            HardwareChoice(kind="catalog", device_id="m4-max-128gb"),
        ),
    )
    window.set_presentation(True)
    wait_until(window, lambda v: v.request.model == qwen and len(v.comparison) == 2)
    problems: list[str] = []

    def checked(name: str) -> None:
        wait_until(window, lambda v: True)
        problems.extend(f"{name}: {c}" for c in clipped_texts(window))
        problems.extend(f"{name}: {p}" for p in chart_text_problems(window))
        shot(name)

    window.tabs.setCurrentIndex(0)
    checked("presentation-charts")
    window.tabs.setCurrentIndex(window.tabs.indexOf(window.results.compare_page))
    checked("presentation-compare-hardware")
    advisor = window.advisor_panel
    window.tabs.setCurrentIndex(window.tabs.indexOf(advisor.parentWidget().parentWidget()))
    find_machines(window)
    checked("presentation-which-machine")
    print("presentation mode at 1280x720: " + ("nothing clipped" if not problems else "; ".join(problems)))
    window.set_presentation(False)
    window.resize(1500, 940)
    window.tabs.setCurrentIndex(0)


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    presentation_only = "--presentation-only" in sys.argv
    out = Path(args[0] if args else "docs/screenshots")
    out.mkdir(parents=True, exist_ok=True)
    qt_app = QApplication.instance() or QApplication(sys.argv[:1])
    from app.core.report.choices import Controls, HardwareChoice, ModelChoice
    from app.ui.app import create_window, real_services

    services = real_services()
    services.measure_bandwidth = False
    services.first_run_guide = False
    window = create_window(services)
    window.resize(1500, 940)
    window.show()
    wait_until(window, lambda v: True)
    shots = []

    def shot(name: str, widget=None) -> None:
        path = out / f"{name}.png"
        (widget or window).grab().save(str(path))
        shots.append(path)

    if presentation_only:
        presentation_shots(window, shot)
        window.close()
        for path in shots:
            print(f"{path} ({path.stat().st_size // 1024} KiB)")
        return 0

    llama8 = ModelChoice(kind="catalog", ref="llama-3.1-8b", quant="Q4_K_M")
    window.set_scenario(
        model=llama8,
        hardware=HardwareChoice(kind="catalog", device_id="rtx-4090", host_ram_gib=64),
        controls=Controls(context_per_user_tokens=16384),
        compare=(
            HardwareChoice(kind="catalog", device_id="rtx-3060-12gb"),
            HardwareChoice(kind="catalog", device_id="m4-pro-48gb"),
        ),
    )
    wait_until(window, lambda v: v.request.model == llama8 and v.request.controls.context_per_user_tokens == 16384)
    shot("fits-rtx-4090")
    window.tabs.setCurrentIndex(2)
    wait_until(window, lambda v: True)
    shot("compare-hardware")
    window.tabs.setCurrentIndex(0)

    # Which machine? Llama 3.3 70B for 4 people with 16k tokens each, at least 15 tokens/s.
    window.set_scenario(
        model=ModelChoice(kind="catalog", ref="llama-3.3-70b"), controls=Controls(context_per_user_tokens=16384)
    )
    wait_until(window, lambda v: v.request.model.ref == "llama-3.3-70b")
    advisor = window.advisor_panel
    window.tabs.setCurrentIndex(window.tabs.indexOf(advisor.parentWidget().parentWidget()))
    advisor.form.users.setValue(4)
    advisor.form.speed_unit.setCurrentIndex(advisor.form.speed_unit.findData("tokens"))
    advisor.form.speed_unit.activated.emit(advisor.form.speed_unit.currentIndex())
    advisor.form.speed.setValue(15)
    find_machines(window)
    shot("which-machine")
    window.tabs.setCurrentIndex(0)

    llama70 = ModelChoice(kind="catalog", ref="llama-3.1-70b", quant="Q4_K_M")
    window.set_scenario(
        model=llama70,
        hardware=HardwareChoice(kind="catalog", device_id="rtx-4090", host_ram_gib=64),
        controls=Controls(context_per_user_tokens=8192, gpu_layers=81),
        compare=(),
    )
    wait_until(window, lambda v: v.request.model == llama70 and v.request.controls.gpu_layers == 81)
    shot("does-not-fit")
    window.tabs.setCurrentIndex(1)
    wait_until(window, lambda v: True)
    shot("quantization-ladder")
    window.tabs.setCurrentIndex(0)

    presentation_shots(window, shot)

    # A live run of the demo model, measured against its estimate.
    window.set_scenario(
        model=ModelChoice(), hardware=HardwareChoice(kind="cpu"), controls=Controls(context_per_user_tokens=4096)
    )
    wait_until(window, lambda v: v.request.model.kind == "demo")
    window.tabs.setCurrentIndex(4)
    panel = window.run_panel
    panel.form.preset_combo.setCurrentText("Summarize a passage")
    panel.form.max_tokens.setValue(64)
    panel.form.repeat.setValue(2)
    done = QEventLoop()
    panel.run_finished.connect(lambda *_: done.quit())
    panel.run_failed.connect(lambda *_: done.quit())
    QTimer.singleShot(180_000, done.quit)
    panel.run_button.click()
    done.exec()
    wait_until(window, lambda v: True)
    shot("live-run")

    # Quantization A/B: a Q3_K_S variant made from the demo file, against it, on the chat suite.
    window.tabs.setCurrentIndex(5)
    ab = window.ab_panel
    for i in range(ab.suites.suite_list.count()):
        item = ab.suites.suite_list.item(i)
        item.setCheckState(Qt.CheckState.Checked if item.text().startswith("chat") else Qt.CheckState.Unchecked)
    finished = QEventLoop()
    ab.comparison_finished.connect(lambda *_: finished.quit())
    ab.error_shown.connect(lambda *_: finished.quit())
    ab.make_variant("Q3_K_S")
    while ab.busy:
        wait_until(window, lambda v: True, timeout_s=5)
    ab.add_variant(str(window.view.model.path))
    QTimer.singleShot(600_000, finished.quit)
    ab.compare_button.click()
    finished.exec()
    wait_until(window, lambda v: True)
    shot("quantization-ab")

    # Load: this machine's batching figures for the demo model, and the simulation they feed.
    window.tabs.setCurrentIndex(6)
    load = window.load_panel
    simulated = QEventLoop()
    load.simulated.connect(lambda *_: simulated.quit())
    load.error_shown.connect(lambda *_: simulated.quit())
    QTimer.singleShot(300_000, simulated.quit)
    (load.simulate_button if load.profile is not None else load.measure_button).click()
    simulated.exec()
    wait_until(window, lambda v: True)
    shot("load")
    window.close()
    qt_app.processEvents()
    for path in shots:
        print(f"{path} ({path.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
