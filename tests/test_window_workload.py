"""The window's workload settings and what they drive: one set shared by every tab and remembered
after a restart, a wheel that scrolls instead of changing settings, a search that never ends in a
blank list, "up to N people" that does not move with N (the users chart agrees with the verdict),
the calibration line with its Reset, and tab results marked when the settings change after them."""

from __future__ import annotations

import re

import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QApplication
from test_history import _gemma_run
from test_window import make_services, open_window, settle

from app.adapters.history import RunHistory
from app.core.hardware.snapshots import machine_key
from app.core.report.choices import Controls, HardwareChoice, ModelChoice

pytestmark = pytest.mark.usefixtures("demo_gguf")


def _wheel(widget, steps: int = 1) -> None:
    """A mouse wheel turn over ``widget``."""
    target = widget
    pos = QPointF(target.width() / 2, target.height() / 2)
    event = QWheelEvent(
        pos,
        QPointF(target.mapToGlobal(pos.toPoint())),
        QPoint(0, 0),
        QPoint(0, 120 * steps),
        Qt.MouseButton.NoButton,
        Qt.KeyboardModifier.NoModifier,
        Qt.ScrollPhase.NoScrollPhase,
        False,
    )
    QApplication.sendEvent(target, event)


def test_the_wheel_changes_a_setting_only_when_it_has_the_focus(qtbot, tmp_path):
    window = open_window(qtbot, make_services(tmp_path))
    users, slider = window.users_spin, window.context_control.slider
    window.model_search.setFocus()
    qtbot.waitUntil(lambda: window.model_search.hasFocus() or not window.isActiveWindow(), timeout=2000)
    before = (users.value(), slider.value(), window.preferences.controls)
    # Scrolling down the settings passes over them: nothing changes.
    _wheel(users, -1)
    _wheel(slider, -1)
    _wheel(window.quant_combo, -1)
    assert (users.value(), slider.value(), window.preferences.controls) == before
    # A control that has the focus (a click, or Tab) does take the wheel.
    users.setFocus(Qt.FocusReason.TabFocusReason)
    qtbot.waitUntil(users.hasFocus, timeout=2000)
    _wheel(users, 1)
    assert users.value() == before[0] + 1 and window.preferences.controls.users == before[0] + 1


def test_one_set_of_workload_settings_in_every_tab_remembered_after_a_restart(qtbot, tmp_path):
    services = make_services(tmp_path)
    window = open_window(qtbot, services)
    form = window.advisor_panel.form
    # On the left: people, conversation length in pages, the speed needed.
    window.users_spin.setValue(12)
    unit = window.context_control.unit_combo
    unit.setCurrentIndex(unit.findData("pages"))
    unit.activated.emit(unit.currentIndex())
    window.context_control.spin.setValue(100)  # 100 pages
    window.controls.speed_spin.setValue(5.0)
    assert window.preferences.controls.users == 12
    assert window.preferences.controls.context_per_user_tokens == 66_667
    assert "about 100 pages" in window.context_control.words.text() and "66,667 tokens" in (
        window.context_control.words.text()
    )
    # The advisor's form shows the same values at once, and an edit there shows on the left.
    assert form.users.value() == 12 and form.context.tokens() == 66_667 and form.speed.value() == 5.0
    assert form.context.unit == "pages"
    form.budget.setValue(5000)
    form.users.setValue(10)
    assert window.users_spin.value() == 10 and window.preferences.workload.budget_usd == 5000
    view = settle(qtbot, window, lambda v: v.request.controls.users == 10)
    assert view.request.min_tokens_per_s == pytest.approx(5.0 / 0.75)
    window.close()
    # Started again: every one of them is back.
    again = open_window(qtbot, services)
    prefs = again.preferences
    assert (prefs.controls.users, prefs.controls.context_per_user_tokens) == (10, 66_667)
    assert (prefs.workload.min_speed, prefs.workload.budget_usd, prefs.workload.length_unit) == (5.0, 5000, "pages")
    assert again.users_spin.value() == 10 and again.controls.speed_spin.value() == 5.0
    assert again.advisor_panel.form.budget.value() == 5000 and again.context_control.unit == "pages"


def test_a_search_the_catalog_cannot_answer_says_its_date_the_nearest_and_how_to_add_one(qtbot, tmp_path):
    window = open_window(qtbot, make_services(tmp_path))
    help_label = window.controls.search_help
    window.model_search.setText("qwen3")
    assert not help_label.isVisible()
    window.model_search.setText("gpt oss 200b")
    visible = [window.model_list.item(i) for i in range(window.model_list.count())]
    assert not any(not item.isHidden() for item in visible)
    assert help_label.isVisible()
    text = help_label.text()
    assert "The catalog was brought up to date on 1 December 2026" in text
    assert re.search(r'Nearest: <a href="model:gpt-oss-20b">gpt-oss-20b</a>', text)
    assert 'href="gguf:"' in text and 'href="config:"' in text and 'href="hf:"' in text and 'href="ollama:"' in text
    # A nearest model is picked from the link; the ways to add one open the window's dialogs.
    help_label.linkActivated.emit("model:gpt-oss-20b")
    settle(qtbot, window, lambda v: v.request.model.ref == "gpt-oss-20b")
    with qtbot.waitSignal(window.controls.add_model_requested) as asked:
        window.controls._search_link("hf:")
    assert asked.args == ["hf"]


def test_up_to_n_people_does_not_grow_with_n_and_the_chart_agrees_with_the_verdict(qtbot, tmp_path):
    window = open_window(qtbot, make_services(tmp_path))
    window.set_scenario(
        model=ModelChoice(kind="catalog", ref="llama-3.1-8b"),
        hardware=HardwareChoice(kind="catalog", device_id="rtx-4090", host_ram_gib=64),
        controls=Controls(context_per_user_tokens=8192, users=1),
    )
    view = settle(qtbot, window, lambda v: v.request.hardware.device_id == "rtx-4090")
    fit = view.users_that_fit
    said = set()
    for users in (1, fit, fit + 1, 2 * fit):
        window.users_spin.setValue(users)
        view = settle(qtbot, window, lambda v, n=users: v.request.controls.users == n)
        assert view.users_that_fit == fit  # counted by one rule, whatever the number chosen
        words = window.banner.details.text()
        count = re.search(r"(?:Up to|up to|at least) (\d+) people", words)
        if count:
            said.add(int(count.group(1)))
        chart = window.concurrency_chart
        # The line passes through the verdict's count at the chosen length...
        x, y = chart.line.getData()
        here = next(yy for xx, yy in zip(x, y, strict=True) if abs(xx - 13.0) < 1e-9)  # log2(8192)
        assert here == fit
        # ...and the choice is never drawn as fitting when the verdict says it does not.
        assert chart.choice_fits == (users <= fit and view.verdict.level != "red")
        assert view.estimate.fits or not chart.choice_fits
        if users > fit:
            assert not chart.choice_fits
    assert said == {fit}


def test_the_calibration_line_says_how_many_good_runs_and_resets(qtbot, tmp_path):
    services = make_services(tmp_path)
    with RunHistory(services.history_path) as history:
        # Three runs on this machine: two good, one measured while something else used it.
        probe = open_window(qtbot, services)
        key = machine_key(probe.machine.host, probe.machine.gpus)
        probe.close()
        from app.adapters.cpu_topology import llama_math_threads

        threads = llama_math_threads()
        for value in (0.62, 0.58, 0.01):
            run_id = history.add(_gemma_run())
            history.set_efficiency(key, "CPU", value, run_id, threads)
    window = open_window(qtbot, services)
    line = window.results.calibration
    assert line.isVisible()
    assert "calibrated from 3 runs" in line.text() and "the median of the runs nothing disturbed" in line.text()
    assert window.current_request().measured_efficiency == (("CPU", 0.58),)  # the bad one moves nothing
    line.linkActivated.emit("reset")
    assert not line.isVisible() and window.current_request().measured_efficiency == ()
    assert window.history.efficiencies(key, threads) == {}
    assert len(window.history.rows()) == 3  # the runs stay


def test_a_scale_out_plan_made_for_other_settings_is_greyed_until_planned_again(qtbot, tmp_path):
    window = open_window(qtbot, make_services(tmp_path))
    window.set_scenario(
        model=ModelChoice(kind="catalog", ref="llama-3.1-70b"), controls=Controls(context_per_user_tokens=8192)
    )
    settle(qtbot, window, lambda v: v.request.model.ref == "llama-3.1-70b")
    panel = window.scale_panel
    with qtbot.waitSignal(panel._job.finished, timeout=20000):
        assert panel.plan()
    assert not panel.stale.stale and not panel.stale_note.isVisible()
    window.users_spin.setValue(4)
    assert panel.stale.stale
    assert "people: 1 (now 4)" in panel.stale_note.text() and "press Plan" in panel.stale_note.text()
    assert panel.llama_text.graphicsEffect() is not None
    # The Run tab's results (none yet) are not marked: nothing on it is out of date.
    assert not window.run_panel.stale.stale
    with qtbot.waitSignal(panel._job.finished, timeout=20000):
        assert panel.plan()
    assert not panel.stale.stale and panel.llama_text.graphicsEffect() is None
