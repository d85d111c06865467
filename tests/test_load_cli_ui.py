"""The load simulation's entry points: `fitscope load` and the Load tab, on a tiny model written by
the test (the figures are this machine's, the simulation's are tested in test_loadsim.py)."""

from __future__ import annotations

import json

import pytest
from test_window import make_services, open_window, settle

from app.adapters.cpu_topology import llama_math_threads
from tests.support.tiny_gguf import write_tiny_llama

pytestmark = pytest.mark.llamacpp


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("load") / "tiny.gguf", n_layer=4, n_embd=128, n_ff=256)


def test_fitscope_load_json(tiny, capsys):
    from app.cli import main

    code = main(
        [
            "load",
            "--gguf",
            str(tiny),
            "--users",
            "1,2,4",
            "--prompt",
            "64",
            "--output",
            "32",
            "--requests",
            "60",
            "--json",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    profile = report["profile"]
    assert set(profile["decode_step_s"]) == {"1", "2", "4"} and profile["prefill_tokens_per_s"] > 0
    points = report["points"]
    assert [(p["users"], p["batching"]) for p in points] == [
        (1, True),
        (2, True),
        (4, True),
        (1, False),
        (2, False),
        (4, False),
    ]
    batched, single = points[2], points[5]
    assert batched["tokens_per_s"] > single["tokens_per_s"]  # four users, batched, beat one at a time
    assert report["max_slots_by_memory"] >= 4
    # The second call uses the figures kept from the first.
    code = main(["load", "--gguf", str(tiny), "--users", "2", "--json"])
    assert json.loads(capsys.readouterr().out)["profile"]["load_s"] == profile["load_s"]


def test_load_tab_measures_and_simulates(qtbot, tmp_path, tiny):
    window = open_window(qtbot, make_services(tmp_path))
    window.open_gguf(str(tiny))
    settle(qtbot, window, lambda v: v.request.model.kind == "gguf")
    panel = window.load_panel
    assert "tiny.gguf" in panel.model_label.text()
    panel.users.setText("1,2,4")
    panel.prompt_lo.setValue(32)
    panel.prompt_hi.setValue(64)
    panel.output_lo.setValue(16)
    panel.output_hi.setValue(32)
    panel.requests.setValue(40)
    # The buttons wait while a simulation of what was open before (the demo model) finishes.
    qtbot.waitUntil(lambda: not panel.busy, timeout=30000)
    with qtbot.waitSignal(panel.simulated, timeout=60000) as blocker:
        if panel.profile is None:
            panel.measure_button.click()
        else:
            panel.simulate_button.click()
    results = blocker.args[0]
    assert len(results) == 6 and panel.table.rowCount() == 6
    assert panel.table.item(0, 2).text() == f"{results[0].tokens_per_s:.1f}"
    xs, ys = panel.curves[(True, "e2e_p95_s")].getData()
    assert list(xs) == [1, 2, 4] and list(ys) == [r.e2e_p95_s for r in results if r.batching]
    assert list(panel.throughput[False].getData()[1]) == [r.tokens_per_s for r in results if not r.batching]
    assert f"Measured here with {llama_math_threads()} threads" in panel.summary.text()
    assert "(like llama-server): prefill" in panel.summary.text()
    panel.users.setText("1, two")
    assert panel.simulate() == 0 and "numbers separated by commas" in panel.status.text()


def test_load_tab_by_arrival_rate(qtbot, tmp_path, tiny):
    window = open_window(qtbot, make_services(tmp_path))
    window.open_gguf(str(tiny))
    settle(qtbot, window, lambda v: v.request.model.kind == "gguf")
    panel = window.load_panel
    qtbot.waitUntil(lambda: panel.profile is not None or panel.measure_button.isEnabled(), timeout=10000)
    if panel.profile is None:
        with qtbot.waitSignal(panel.simulated, timeout=60000):
            panel.measure_button.click()
    panel.mode.setCurrentIndex(panel.mode.findData("rate"))
    panel.users.setText("5,50")
    panel.requests.setValue(60)
    assert panel.simulate()
    # The simulation runs off the GUI thread; earlier ones (the mode change) may land first.
    qtbot.waitUntil(lambda: [r.rate_per_s for r in panel.results] == [5.0, 50.0, 5.0, 50.0], timeout=30000)
    qtbot.waitUntil(lambda: not panel.busy, timeout=30000)
    results = panel.results
    assert panel.table.item(0, 0).text() == "5/s"
    # Past what the endpoint can serve, requests queue: the 95th percentile wait grows.
    assert results[1].queue_wait_p95_s >= results[0].queue_wait_p95_s
