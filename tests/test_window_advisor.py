"""The "Which machine?" tab: the workload in words, the ranked table and chart, and "open this configuration"."""

from __future__ import annotations

import pytest
from test_window import make_services, open_window, settle

from app.core.report.choices import Controls, ModelChoice
from app.ui.advisor_panel import pareto_front

pytestmark = pytest.mark.usefixtures("demo_gguf")


def test_pareto_front_keeps_the_best_buys():
    points = [(1000, 5), (2000, 4), (3000, 9), (3000, 8), (5000, 20), (6000, 19)]
    assert pareto_front(points) == [0, 2, 4]


def test_tab_ranks_machines_and_opens_one_in_the_main_view(qtbot, tmp_path):
    window = open_window(qtbot, make_services(tmp_path))
    window.set_scenario(
        model=ModelChoice(kind="catalog", ref="llama-3.3-70b"), controls=Controls(context_per_user_tokens=4096)
    )
    settle(qtbot, window, lambda v: v.model is not None and "70B" in v.model.label)
    panel = window.advisor_panel
    window.tabs.setCurrentIndex(window.tabs.indexOf(panel.parentWidget().parentWidget()))
    assert panel.context.value() == 4096  # taken from the main view
    panel.context.setValue(16384)
    panel.users.setValue(4)
    panel.speed_unit.setCurrentIndex(panel.speed_unit.findData("tokens"))
    panel.speed.setValue(15)
    with qtbot.waitSignal(panel.advice_shown, timeout=30000):
        assert panel.find_machines()
    advice = panel.advice
    assert advice is not None and advice.workload.min_tokens_per_s == 15
    table = panel.table
    assert table.rowCount() == len(advice.ranked) > 10
    assert table.item(0, 1).text() == "2x NVIDIA GeForce RTX 5090 (desktop, 64 GiB RAM)"
    assert table.item(0, 3).text() == "$5,903"
    assert table.item(0, 7).text() == "does it"
    assert "Why not one NVIDIA GeForce RTX 4090: Q4_K_M: needs at least 59.0 GiB" in panel.why_text.toPlainText()
    assert "Apple: Apple M3 Ultra" in panel.why_text.toPlainText()
    assert panel.command_text.toPlainText().startswith("llama-server -m llama-3.3-70b-Q4_K_M.gguf -c 65536 -np 4")
    # The chart: every priced machine, the best buys on the front, the first one ringed.
    assert len(panel.chart.rows) == sum(c.price_usd is not None for c in advice.ranked)
    assert panel.chart.front_indices[0] == 0
    assert panel.chart.chosen.data["x"][0] == pytest.approx(5903)
    assert panel.copy_command().startswith("llama-server")

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
