"""The Quantization A/B and Scale out tabs, offscreen: a variant made from the open file by
llama.cpp's quantizer, compared with it on a suite, advice and routing export; multi-GPU plans."""

from __future__ import annotations

import tomllib

import pytest
from test_window import make_services, open_window, settle

from app.adapters.cpu_topology import llama_math_threads
from app.core.report.choices import ModelChoice
from tests.support.tiny_gguf import write_tiny_llama

pytestmark = pytest.mark.llamacpp


def test_make_a_variant_compare_and_export_the_routing_config(qtbot, tmp_path):
    source = write_tiny_llama(tmp_path / "tiny-F32.gguf", n_layer=4, n_embd=256, n_ff=512)
    window = open_window(qtbot, make_services(tmp_path))
    window.open_gguf(str(source))
    settle(qtbot, window, lambda v: v.request.model.kind == "gguf")
    panel = window.ab_panel
    assert panel.make_button.isEnabled()
    panel.make_variant("Q4_0")
    qtbot.waitUntil(lambda: not panel.busy and panel.variant_list.count() == 1, timeout=30000)
    made = panel.variants()[0]
    assert made.endswith("tiny-Q4_0.gguf")
    panel.add_variant(str(source))
    with qtbot.waitSignal(panel.comparison_finished, timeout=120000) as blocker:
        panel.compare_button.click()
    comparison = blocker.args[0]
    assert [v.label for v in comparison.variants] == ["tiny-F32", "tiny-Q4_0"]
    assert panel.table.rowCount() == 2 and panel.table.item(0, 0).text() == "tiny-F32 (reference)"
    assert comparison.variants[1].top1_agreement is not None
    assert panel.table.item(1, 9).text() == f"{comparison.variants[1].top1_agreement:.0%}"
    # Each variant ran with llama-server's thread count, and the table says so.
    assert all(v.n_threads == llama_math_threads() for v in comparison.variants)
    assert panel.table.item(1, 7).text() == str(llama_math_threads())
    assert "needs ≥" in panel.advice.text()
    out = tmp_path / "routing.toml"
    panel.export_routing(out, "toml")
    parsed = tomllib.loads(out.read_text())
    assert {v["name"] for v in parsed["variants"]} == {"tiny-F32", "tiny-Q4_0"}


def test_a_bad_suite_in_the_editor_points_at_the_line(qtbot):
    from app.ui.ab_dialogs import SuiteEditor

    editor = SuiteEditor("name: x\ntask: chat\nprompts:\n  - id: a\n    prompt: hi\n    check: {regx: y}\n")
    qtbot.addWidget(editor)
    assert editor.validate() is None
    assert "line 6" in editor.message.text()
    assert editor.editor.textCursor().blockNumber() == 5


def test_scale_out_plans_both_ways(qtbot, tmp_path):
    window = open_window(qtbot, make_services(tmp_path))
    window.choose_model(ModelChoice(kind="catalog", ref="llama-3.1-70b", quant="Q4_K_M"))
    settle(qtbot, window, lambda v: v.request.model.ref == "llama-3.1-70b")
    panel = window.scale_panel
    panel.count.setValue(4)
    with qtbot.waitSignal(panel._job.finished, timeout=20000):
        assert panel.plan()
    assert panel.plan_button.isEnabled()
    assert "-ngl 81 --split-mode layer --tensor-split 1,1,1,1" in panel.llama_text.toPlainText()
    assert "vllm serve meta-llama/Llama-3.1-70B --tensor-parallel-size 4" in panel.vllm_text.toPlainText()
    assert panel.split is not None and sum(g.layers for g in panel.split.gpus) == 80


def test_a_plan_for_a_model_file_removed_meanwhile_says_so_and_the_tab_stays_usable(qtbot, tmp_path):
    gone = write_tiny_llama(tmp_path / "gone.gguf", n_layer=2, n_embd=128, n_ff=256)
    window = open_window(qtbot, make_services(tmp_path))
    window.open_gguf(str(gone))
    settle(qtbot, window, lambda v: v.request.model.kind == "gguf")
    gone.unlink()
    panel = window.scale_panel
    with qtbot.waitSignal(panel._job.failed, timeout=20000):
        assert panel.plan()
    assert "gone.gguf" in panel.message.text()
    assert panel.plan_button.isEnabled() and panel.split is None


def test_a_vanished_variant_or_an_unwritable_folder_leaves_the_tab_usable(qtbot, tmp_path):
    # An OSError used to kill the worker thread silently: the tab stayed "busy", Compare disabled.
    source = write_tiny_llama(tmp_path / "tiny-F32.gguf", n_layer=2, n_embd=128, n_ff=256)
    gone = write_tiny_llama(tmp_path / "gone.gguf", n_layer=2, n_embd=128, n_ff=256)
    window = open_window(qtbot, make_services(tmp_path))
    window.open_gguf(str(source))
    settle(qtbot, window, lambda v: v.request.model.kind == "gguf")
    panel = window.ab_panel
    panel.add_variant(str(source))
    panel.add_variant(str(gone))
    gone.unlink()
    with qtbot.waitSignal(panel.error_shown, timeout=60000) as blocker:
        panel.compare_button.click()
    assert "gone.gguf" in blocker.args[0]
    qtbot.waitUntil(lambda: not panel.busy, timeout=5000)
    assert panel.compare_button.isEnabled() and not panel.stop_button.isEnabled()

    # The quantizer cannot write its output (a folder stands where the file would go; a read-only
    # folder behaves so for any user but root): a message, and the tab is usable again.
    (tmp_path / "tiny-Q4_0.gguf").mkdir()
    window.open_gguf(str(source))
    settle(qtbot, window, lambda v: v.request.model.kind == "gguf")
    with qtbot.waitSignal(panel.error_shown, timeout=60000) as blocker:
        panel.make_variant("Q4_0")
    assert blocker.args[0]
    qtbot.waitUntil(lambda: not panel.busy, timeout=5000)
    assert panel.make_button.isEnabled() and not panel.make_progress.isVisible()
