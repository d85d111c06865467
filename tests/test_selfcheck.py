"""Setup's check that the installed llama.cpp decodes on this CPU (scripts/bootstrap.sh)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.adapters.selfcheck import check_runs, main

pytestmark = pytest.mark.llamacpp


def test_the_installed_llama_cpp_decodes_the_demo_model(demo_gguf: Path) -> None:
    assert check_runs(demo_gguf) is None
    assert main([str(demo_gguf)]) == 0


def test_an_illegal_instruction_is_named_with_the_rebuild_command(demo_gguf: Path) -> None:
    # A real SIGILL, raised the way a kernel for another CPU ends the process.
    message = check_runs(demo_gguf, code="import os, signal; os.kill(os.getpid(), signal.SIGILL)")
    assert message is not None
    assert "illegal instruction" in message
    assert "--no-binary llama-cpp-python" in message and "--no-cache-dir" in message


def test_a_model_llama_cpp_cannot_load_fails_setup_with_its_reason(tmp_path: Path, capsys) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x00" * 64)
    assert main([str(broken)]) == 1
    err = capsys.readouterr().err
    assert "could not decode the demo model (exit code 1)" in err
    assert "Error" in err or "error" in err
