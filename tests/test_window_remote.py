"""The window's "Open from Hugging Face…" and "Open from Ollama…" dialogs, offscreen, against a real
HTTP server on 127.0.0.1 (tests/support/fake_remote.py): list a repository, pick a file and its
projector, and the window's estimate is the local file's; a failure is one sentence in the dialog,
which stays usable; Cancel stops a fetch.

The window's estimate worker is another process that never sees the test server: it reads the
headers the dialog cached, which is what makes a second estimate offline.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from test_window import make_services, open_window, settle

from app.core.model.catalog import find_model, find_projector
from tests.support.fake_remote import FakeRemote, HubRepo, OllamaModel
from tests.support.synthetic_gguf import write_sparse_gguf
from tests.support.synthetic_mmproj import write_sparse_mmproj

pytestmark = pytest.mark.usefixtures("demo_gguf")
REPO = "fitscope-test/gemma-3-4b-it-GGUF"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("window-gguf")
    gemma = find_model("gemma-3-4b")
    out = {
        "q4": root / "gemma-3-4b-it-Q4_K_M.gguf",
        "q8": root / "gemma-3-4b-it-Q8_0.gguf",
        "mmproj": root / "mmproj-gemma-3-4b-it-F16.gguf",
    }
    write_sparse_gguf(out["q4"], gemma, "Q4_K_M")
    write_sparse_gguf(out["q8"], gemma, "Q8_0")
    write_sparse_mmproj(out["mmproj"], find_projector("gemma-3-4b").spec())
    return out


@pytest.fixture
def server(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch):
    with FakeRemote() as s:
        s.hub[REPO] = HubRepo({p.name: p for p in files.values()})
        s.ollama["library/gemma3:4b"] = OllamaModel(files["q4"], files["mmproj"])
        monkeypatch.setenv("HF_ENDPOINT", s.url)
        monkeypatch.setenv("FITSCOPE_OLLAMA_REGISTRY", s.url)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield s


def list_in(qtbot, dialog, text: str) -> None:
    dialog.ref_edit.clear()
    qtbot.keyClicks(dialog.ref_edit, text)
    qtbot.mouseClick(dialog.list_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not dialog.runner.running, timeout=10000)


def device_totals(view) -> list[int]:
    return [d.total_bytes for d in view.estimate.devices]


def test_open_from_hugging_face_estimates_as_the_local_file(qtbot, tmp_path: Path, server, files) -> None:
    window = open_window(qtbot, make_services(tmp_path))
    dialog = window.open_remote_dialog("hf")
    assert not dialog.open_button.isEnabled()
    list_in(qtbot, dialog, REPO)
    table = dialog.files_table
    rows = [[table.item(r, c).text() for c in range(4)] for r in range(table.rowCount())]
    assert [r[0] for r in rows] == ["Q4_K_M", "Q8_0"] and rows[0][3] == files["q4"].name
    assert rows[0][1].endswith("GiB") and rows[0][2] == "1"
    assert dialog.projector_combo.currentData().path == files["mmproj"].name  # the F16 projector, preselected
    table.selectRow(0)
    assert dialog.open_button.isEnabled()
    with qtbot.waitSignal(dialog.model_opened, timeout=10000):
        qtbot.mouseClick(dialog.open_button, Qt.MouseButton.LeftButton)
    remote = settle(qtbot, window, lambda v: v.request.model.kind == "hf" and v.estimate is not None)
    assert remote.request.controls.projector is not None
    assert remote.model.label == "Gemma 3 4B" and remote.model.path is None
    # The same file, opened locally with the same projector: the same bytes everywhere.
    window.open_gguf(str(files["q4"]))
    window.choose_projector_file(files["mmproj"])
    local = settle(
        qtbot, window, lambda v: v.request.model.kind == "gguf" and v.request.controls.projector is not None
    )
    assert device_totals(remote) == device_totals(local)
    assert remote.estimate.projector.total_bytes == local.estimate.projector.total_bytes


def test_open_from_ollama_picks_the_tag_and_its_projector(qtbot, tmp_path: Path, server, files) -> None:
    window = open_window(qtbot, make_services(tmp_path))
    dialog = window.open_remote_dialog("ollama")
    list_in(qtbot, dialog, "gemma3:4b")
    assert dialog.files_table.rowCount() == 1 and dialog.open_button.isEnabled()  # the one file, selected
    assert dialog.projector_combo.currentData() is not None
    with qtbot.waitSignal(dialog.model_opened, timeout=10000):
        qtbot.mouseClick(dialog.open_button, Qt.MouseButton.LeftButton)
    view = settle(qtbot, window, lambda v: v.request.model.kind == "ollama" and v.estimate is not None)
    assert view.request.model.revision.startswith("sha256:")
    assert view.estimate.projector is not None


def test_failures_are_one_sentence_and_the_dialog_stays_usable(qtbot, tmp_path: Path, server, files) -> None:
    window = open_window(qtbot, make_services(tmp_path))
    before = window.view.request.model
    dialog = window.open_remote_dialog("hf")
    list_in(qtbot, dialog, "fitscope-test/missing")
    assert "No model repository fitscope-test/missing" in dialog.status_label.text()
    assert dialog.list_button.isEnabled() and dialog.ref_edit.isEnabled()
    list_in(qtbot, dialog, "not a repo")
    assert "is not a Hugging Face repository" in dialog.status_label.text()
    # Cancel while the server is slow to send the header: nothing is opened, the window is unchanged.
    # (A repository of its own, at a revision of its own: no header of it is in the cache yet.)
    server.hub["fitscope-test/slow"] = HubRepo({files["q8"].name: files["q8"]}, sha="5" * 40)
    list_in(qtbot, dialog, "fitscope-test/slow")
    server.mode, server.hang_s = "hang", 1.0
    dialog.files_table.selectRow(0)
    qtbot.mouseClick(dialog.open_button, Qt.MouseButton.LeftButton)
    assert dialog.runner.running and not dialog.list_button.isEnabled()
    qtbot.mouseClick(dialog.cancel_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not dialog.runner.running, timeout=10000)
    assert dialog.status_label.text().startswith("Cancelled")
    assert dialog.isVisible() and window.preferences.model == before
    qtbot.mouseClick(dialog.cancel_button, Qt.MouseButton.LeftButton)  # now it closes the dialog
    assert not dialog.isVisible()
