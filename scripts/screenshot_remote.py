"""Screenshot of File > Open from Hugging Face…, listing a repository served by a Hub-shaped HTTP server
in this process (tests/support/fake_remote.py) over sparse GGUF files written here: several
quantizations, a model split in two parts, and a vision projector. Run through
scripts/screenshots.sh (xvfb), or:

    xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python scripts/screenshot_remote.py docs/screenshots
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
os.environ["FITSCOPE_CACHE_DIR"] = tempfile.mkdtemp(prefix="fitscope-shots-cache-")

from PySide6.QtCore import QEventLoop, QTimer
from PySide6.QtWidgets import QApplication

REPO = "example-org/gemma-3-4b-it-GGUF"


def pump(ms: int) -> None:
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def wait_for(predicate, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("screenshot_remote: the dialog did not get there in time")
        pump(50)


def write_repository(folder: Path) -> dict[str, Path]:
    from app.core.model.catalog import find_model, find_projector
    from tests.support.synthetic_gguf import write_sparse_gguf, write_sparse_split_gguf
    from tests.support.synthetic_mmproj import write_sparse_mmproj

    arch = find_model("gemma-3-4b")
    files: dict[str, Path] = {}
    for quant in ("IQ4_XS", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0"):
        path = folder / f"gemma-3-4b-it-{quant}.gguf"
        write_sparse_gguf(path, arch, quant)
        files[path.name] = path
    split = folder / "BF16"
    split.mkdir()
    parts, _ = write_sparse_split_gguf(split, "gemma-3-4b-it-BF16", arch, "BF16", 2)
    files.update({f"BF16/{p.name}": p for p in parts})
    mmproj = folder / "mmproj-gemma-3-4b-it-F16.gguf"
    write_sparse_mmproj(mmproj, find_projector("gemma-3-4b").spec())
    files[mmproj.name] = mmproj
    return files


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/screenshots")
    out.mkdir(parents=True, exist_ok=True)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    from app.ui.app import create_window, real_services
    from tests.support.fake_remote import FakeRemote, HubRepo

    files = write_repository(Path(tempfile.mkdtemp(prefix="fitscope-shots-gguf-")))
    with FakeRemote() as server:
        server.hub[REPO] = HubRepo(files, sha="3f2a9c41d0b7e5a86c1f0e9d2b4a7c6e5d8f1a0b")
        os.environ["HF_ENDPOINT"] = server.url
        services = real_services()
        services.measure_bandwidth = False
        services.first_run_guide = False
        window = create_window(services)
        window.resize(1500, 940)
        window.show()
        wait_for(lambda: window.view is not None and not window.busy)
        dialog = window.open_remote_dialog("hf")
        dialog.ref_edit.setText(REPO)
        dialog.list_files()
        wait_for(lambda: dialog.files_table.rowCount() > 0 and not dialog.runner.running)
        dialog.files_table.selectRow(1)
        pump(400)
        target = out / "open-from-hugging-face.png"
        dialog.grab().save(str(target))
        print(target)
        dialog.reject()
        window.close()
    app.processEvents()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
