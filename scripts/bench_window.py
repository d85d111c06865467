"""How fast the window follows the context slider, and how long the GUI thread is ever blocked.

For each scenario the slider is stepped N times (one notch each, as the arrow keys move it). A
step is timed from the slider's new value to the moment the new estimate is on screen: worker
computation, every chart updated, the verdict replaced and the chart area painted. A 5 ms
heartbeat timer on the GUI thread records the longest gap between its ticks over the whole run,
model switches included: that is the longest the window was unresponsive.

    QT_QPA_PLATFORM=offscreen .venv/bin/python scripts/bench_window.py [--steps 40]

Targets: a step within 50 ms (median and worst printed); no gap over 100 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("FITSCOPE_CONFIG_DIR", tempfile.mkdtemp(prefix="fitscope-bench-"))

from PySide6.QtCore import QElapsedTimer, QEventLoop, QTimer
from PySide6.QtWidgets import QApplication

SCENARIOS = [
    ("demo model, this CPU", ("demo", ""), ("cpu", None, 1)),
    (
        "Qwen2.5 14B Q4_K_M, RTX 4060 Ti 16GB, ladder tab shown",
        ("catalog", "qwen2.5-14b"),
        ("catalog", "rtx-4060-ti-16gb", 1),
    ),
    ("Llama 3.1 8B Q4_K_M, RTX 4090", ("catalog", "llama-3.1-8b"), ("catalog", "rtx-4090", 1)),
    ("Llama 3.1 70B Q4_K_M, RTX 4090 (partial offload)", ("catalog", "llama-3.1-70b"), ("catalog", "rtx-4090", 1)),
    ("Llama 3.1 405B Q4_K_M, 8x H100", ("catalog", "llama-3.1-405b"), ("catalog", "h100-sxm", 8)),
    ("DeepSeek-V3 Q4_K_M, 8x H200", ("catalog", "deepseek-v3"), ("catalog", "h200", 8)),
]


class Heartbeat:
    """Longest gap between ticks of a 5 ms timer on the GUI thread."""

    def __init__(self) -> None:
        self.clock = QElapsedTimer()
        self.clock.start()
        self.last = 0
        self.worst_ms = 0.0
        self.timer = QTimer(interval=5)
        self.timer.timeout.connect(self._tick)
        self.timer.start()

    def _tick(self) -> None:
        now = self.clock.elapsed()
        if self.last:
            self.worst_ms = max(self.worst_ms, now - self.last)
        self.last = now

    def reset(self) -> None:
        self.last = 0
        self.worst_ms = 0.0


def wait_for(window, predicate, timeout_s: float = 30.0) -> None:
    loop = QEventLoop()
    deadline = time.perf_counter() + timeout_s

    def check(*_args) -> None:
        if (window.view is not None and not window.busy and predicate(window.view)) or time.perf_counter() > deadline:
            loop.quit()

    window.view_changed.connect(check)
    poll = QTimer(interval=10)
    poll.timeout.connect(check)
    poll.start()
    check()
    if loop.isRunning() or not (window.view is not None and not window.busy and predicate(window.view)):
        loop.exec()
    poll.stop()
    window.view_changed.disconnect(check)


def idle(ms: int) -> None:
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()

    qt_app = QApplication.instance() or QApplication([])
    from app.core.report.choices import Controls, HardwareChoice, ModelChoice
    from app.ui.app import create_window, real_services

    services = real_services()
    services.measure_bandwidth = False
    services.first_run_guide = False
    window = create_window(services)
    window.resize(1440, 900)
    window.show()
    beat = Heartbeat()
    wait_for(window, lambda v: True)

    print(f"{'scenario':58s} {'median ms':>9s} {'worst ms':>9s} {'switch ms':>9s} {'GUI gap ms':>10s}")
    all_steps: list[float] = []
    worst_gap = 0.0
    for label, (mkind, mref), (hkind, dev, count) in SCENARIOS:
        beat.reset()
        t0 = time.perf_counter()
        window.set_scenario(
            model=ModelChoice(kind=mkind, ref=mref),
            hardware=HardwareChoice(kind=hkind, device_id=dev, count=count, host_ram_gib=128),
            controls=Controls(context_per_user_tokens=4096),
        )
        wait_for(window, lambda v, r=mref, d=dev: v.request.model.ref == r and v.request.hardware.device_id == d)
        switch_ms = (time.perf_counter() - t0) * 1e3
        idle(300)  # let the switch's repaint happen before timing steps
        window.tabs.setCurrentIndex(1 if "ladder tab" in label else 0)
        idle(200)
        slider = window.context_control.slider
        steps = []
        for _ in range(args.steps):
            target = slider.value() + 1
            if target > slider.maximum():
                target = 0
            t = time.perf_counter()
            slider.setValue(target)
            tokens = window.context_control.tokens()
            wait_for(window, lambda v, n=tokens: v.request.controls.context_per_user_tokens == n)
            window.tabs.repaint()  # the charts and tables, painted now rather than at the next frame
            window.banner.repaint()
            steps.append((time.perf_counter() - t) * 1e3)
            if os.environ.get("BENCH_TRACE"):
                print(f"    {tokens:>8,} tokens {steps[-1]:6.1f} ms")
        worst_gap = max(worst_gap, beat.worst_ms)
        all_steps += steps
        print(f"{label:58s} {statistics.median(steps):9.1f} {max(steps):9.1f} {switch_ms:9.0f} {beat.worst_ms:10.0f}")
    print(
        f"\nall {len(all_steps)} steps: median {statistics.median(all_steps):.1f} ms, worst {max(all_steps):.1f} ms "
        f"(target 50 ms); longest GUI-thread gap {worst_gap:.0f} ms (target 100 ms)"
    )
    window.close()
    qt_app.processEvents()
    return 0


if __name__ == "__main__":
    sys.exit(main())
