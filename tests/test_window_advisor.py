"""The "Which machine?" tab: the workload in words (the same settings as the left-hand panel's),
the ranked table and chart, "open this configuration", the other question (which models this
machine runs well), and answers greyed when the settings change after them."""

from __future__ import annotations

import pytest
from test_window import make_services, open_window, settle

from app.core.advisor.configs import machine_price
from app.core.model.catalog import find_device
from app.core.report.choices import Controls, HardwareChoice, ModelChoice
from app.ui.advisor_chart import pareto_front

pytestmark = pytest.mark.usefixtures("demo_gguf")


def _show_tab(window):
    panel = window.advisor_panel
    window.tabs.setCurrentIndex(window.tabs.indexOf(panel.parentWidget().parentWidget()))
    return panel


def test_pareto_front_keeps_the_best_buys():
    points = [(1000, 5), (2000, 4), (3000, 9), (3000, 8), (5000, 20), (6000, 19)]
    assert pareto_front(points) == [0, 2, 4]


def test_tab_ranks_machines_and_opens_one_in_the_main_view(qtbot, tmp_path):
    window = open_window(qtbot, make_services(tmp_path))
    window.set_scenario(
        model=ModelChoice(kind="catalog", ref="llama-3.3-70b"), controls=Controls(context_per_user_tokens=4096)
    )
    settle(qtbot, window, lambda v: v.model is not None and "70B" in v.model.label)
    panel = _show_tab(window)
    form = panel.form
    assert form.context.tokens() == 4096  # the left panel's setting, one value
    # Edited here, the settings are the window's: the left panel shows them at once.
    form.context.spin.setValue(16384)
    form.users.setValue(4)
    form.speed_unit.setCurrentIndex(form.speed_unit.findData("tokens"))
    form.speed_unit.activated.emit(form.speed_unit.currentIndex())
    # The same speed said in the other unit: 7.5 words a second are 10 tokens a second, in both panels.
    assert form.speed.value() == 10.0 and window.controls.speed_spin.value() == 10.0
    form.speed.setValue(15)
    assert window.users_spin.value() == 4 and window.context_control.tokens() == 16384
    assert window.controls.speed_spin.value() == 15 and window.controls.speed_unit.currentData() == "tokens"
    assert window.preferences.controls.users == 4 and window.preferences.workload.min_speed == 15
    with qtbot.waitSignal(panel.advice_shown, timeout=30000):
        assert panel.find_machines()
    advice = panel.advice
    assert advice is not None and advice.workload.min_tokens_per_s == 15
    table = panel.table
    assert table.rowCount() == len(advice.ranked) > 10
    first = advice.ranked[0]
    assert table.item(0, 1).text() == "2x NVIDIA GeForce RTX 5090 (desktop, 64 GiB RAM)"
    # A whole computer's price, as everywhere: the cards and the desktop around them.
    whole = machine_price(find_device("rtx-5090"), 2, 64).total_usd
    assert first.price_usd == whole and table.item(0, 3).text() == f"${whole:,.0f}"
    assert "GPU cards" in table.item(0, 3).toolTip() and "assumed" in table.item(0, 3).toolTip()
    assert table.item(0, 7).text() == "does it"
    assert "Why not one NVIDIA GeForce RTX 5090: Q4_K_M: needs at least 59.0 GiB" in panel.why_text.toPlainText()
    assert "Apple: Apple M3 Ultra" in panel.why_text.toPlainText()
    assert panel.command_text.toPlainText().startswith("llama-server -m llama-3.3-70b-Q4_K_M.gguf -c 65536 -np 4")
    # The chart: every priced machine, the best buys on the front, the first one ringed.
    assert len(panel.chart.rows) == sum(c.price_usd is not None for c in advice.ranked)
    assert panel.chart.front_indices[0] == 0
    assert panel.chart.chosen.data["x"][0] == pytest.approx(whole)
    assert panel.copy_command().startswith("llama-server")
    assert not panel.results_stale and not panel.stale_note.isVisible()

    with qtbot.waitSignal(panel.configuration_opened):
        assert panel.open_selected() is advice.ranked[0]
    prefs = window.preferences
    assert prefs.model == ModelChoice(kind="catalog", ref="llama-3.3-70b", quant="Q4_K_M")
    assert prefs.hardware.device_id == "rtx-5090" and prefs.hardware.count == 2
    assert prefs.hardware.host_ram_gib == 64
    assert prefs.controls.context_per_user_tokens == 16384 and prefs.controls.users == 4
    assert window.tabs.currentIndex() == 0
    view = settle(qtbot, window, lambda v: v.request.hardware.count == 2)
    assert view.estimate is not None and view.estimate.fits


def test_answers_found_for_other_settings_are_greyed_and_say_which(qtbot, tmp_path):
    window = open_window(qtbot, make_services(tmp_path))
    window.set_scenario(
        model=ModelChoice(kind="catalog", ref="qwen3-32b"), controls=Controls(context_per_user_tokens=8192, users=12)
    )
    settle(qtbot, window, lambda v: v.request.model.ref == "qwen3-32b")
    panel = _show_tab(window)
    with qtbot.waitSignal(panel.advice_shown, timeout=30000):
        assert panel.find_machines()
    assert not panel.results_stale
    # Another model on the left: the machines found for Qwen3 32B stay, greyed, under one line.
    window.choose_model(ModelChoice(kind="catalog", ref="gemma-3-27b"))
    settle(qtbot, window, lambda v: v.request.model.ref == "gemma-3-27b")
    assert panel.results_stale and panel.stale_note.isVisible()
    note = panel.stale_note.text()
    assert "model: Qwen3 32B (Q4_K_M) (now Gemma 3 27B (Q4_K_M))" in note and "press Find machines" in note
    assert panel.machines_results.graphicsEffect() is not None
    # Back to the settings they were found for: current again, nothing greyed.
    window.choose_model(ModelChoice(kind="catalog", ref="qwen3-32b"))
    settle(qtbot, window, lambda v: v.request.model.ref == "qwen3-32b")
    assert not panel.results_stale and not panel.stale_note.isVisible()
    assert panel.machines_results.graphicsEffect() is None
    # A workload setting changed on the left marks them too, and finding again clears it.
    window.users_spin.setValue(4)
    assert panel.results_stale and "people: 12 (now 4)" in panel.stale_note.text()
    with qtbot.waitSignal(panel.advice_shown, timeout=30000):
        assert panel.find_machines()
    assert not panel.results_stale


def test_which_models_this_machine_runs_well_best_answers_first(qtbot, tmp_path):
    window = open_window(qtbot, make_services(tmp_path))
    window.set_scenario(
        hardware=HardwareChoice(kind="catalog", device_id="rtx-5090", host_ram_gib=64),
        controls=Controls(context_per_user_tokens=8192, users=12),
    )
    settle(qtbot, window, lambda v: v.request.hardware.device_id == "rtx-5090")
    panel = _show_tab(window)
    panel.models_mode.setChecked(True)
    assert panel.find_button.text().replace("&", "") == "Find models"
    assert "RTX 5090" in panel.form.subject.text()
    with qtbot.waitSignal(panel.models_shown, timeout=120000) as blocker:
        assert panel.search()
    result = blocker.args[0]
    table = panel.models_view.table
    assert table.rowCount() == len(result.ranked) > 5
    # Ranked by published answer quality among the models that reach the speed each person needs.
    scores = [o.score.mmlu_pro_percent for o in result.ranked if o.score is not None]
    assert scores == sorted(scores, reverse=True)
    assert all(o.decode_typical * 0.75 >= 7.5 for o in result.ranked)
    assert table.item(0, 1).text() == result.ranked[0].name and "MMLU-Pro" in table.item(0, 2).toolTip()
    with qtbot.waitSignal(panel.model_opened) as opened:
        assert panel.models_view.open_selected() is result.ranked[0]
    assert opened.args[0].ref == result.ranked[0].model_id
    settle(qtbot, window, lambda v: v.request.model.ref == result.ranked[0].model_id)
    assert window.preferences.hardware.device_id == "rtx-5090"
