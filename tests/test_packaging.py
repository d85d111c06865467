"""What the packaged app relies on: workers start without `python -m` in a frozen build, the
desktop entry and icons install for the current user, the icon sizes exist."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtGui import QImage

from app.adapters.child import module_command
from app.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_workers_start_through_the_bundle_executable_when_frozen(monkeypatch):
    assert module_command("app.adapters.quantizer") == [sys.executable, "-P", "-m", "app.adapters.quantizer"]
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert module_command("app.adapters.quantizer") == [sys.executable, "--run-module", "app.adapters.quantizer"]


@pytest.mark.filterwarnings("ignore:'app.adapters.llamacpp_probe' found in sys.modules:RuntimeWarning")
def test_run_module_runs_only_fitscopes_workers(capsys):
    assert main(["--run-module", "app.adapters.llamacpp_probe", "--help"]) == 0
    assert "Dry-run llama.cpp" in capsys.readouterr().out
    assert main(["--run-module", "os"]) == 2
    assert "only runs FitScope's own workers" in capsys.readouterr().err


def test_icons_exist_at_every_size(qapp):
    for size in (16, 24, 32, 48, 64, 128, 256):
        image = QImage(str(ROOT / "resources" / "icons" / f"fitscope-{size}.png"))
        assert (image.width(), image.height()) == (size, size)
    assert (ROOT / "resources" / "icons" / "fitscope.svg").read_text().startswith("<svg")


def test_desktop_entry_installs_and_uninstalls_for_this_user(tmp_path):
    exe = ROOT / ".venv" / "bin" / "fitscope"
    env = dict(os.environ, XDG_DATA_HOME=str(tmp_path), HOME=str(tmp_path))
    script = ROOT / "packaging" / "install-desktop.sh"
    subprocess.run(["bash", str(script), str(exe)], env=env, check=True, capture_output=True)
    entry = (tmp_path / "applications" / "fitscope.desktop").read_text()
    assert f'Exec="{exe}" window %f' in entry and "Icon=fitscope" in entry and "Type=Application" in entry
    for size in (16, 48, 256):
        assert (tmp_path / "icons" / "hicolor" / f"{size}x{size}" / "apps" / "fitscope.png").is_file()
    assert (tmp_path / "icons" / "hicolor" / "scalable" / "apps" / "fitscope.svg").is_file()
    subprocess.run(["bash", str(script), "--uninstall"], env=env, check=True, capture_output=True)
    assert not (tmp_path / "applications" / "fitscope.desktop").exists()
    bad = subprocess.run(["bash", str(script), str(tmp_path / "nope")], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "is not an executable" in bad.stderr
