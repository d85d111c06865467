"""A cold ``fitscope estimate`` for catalog hardware stays quick: in a fresh interpreter it imports
none of the heavy modules (Qt, numpy, llama.cpp, NVML) and prints what the same call prints here;
``fitscope --help`` does not even import pydantic. Neither imports the modules of the other commands
(live runs, A/B comparisons, planning). ``scripts/bench_cli_start.py`` times both."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app import cli

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("PySide6", "pyqtgraph", "shiboken6", "numpy", "llama_cpp", "pynvml")

# Runs the command as `fitscope` would, then reports which modules it left imported.
_FRESH = textwrap.dedent(
    """
    import contextlib, io, json, sys

    import app.cli

    argv = json.loads(sys.argv[1])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            rc = app.cli.main(argv)
        except SystemExit as exc:
            rc = exc.code
    roots = sorted({name.split(".")[0] for name in sys.modules})
    cli = sorted(name for name in sys.modules if name.startswith("app.cli"))
    print(json.dumps({"rc": rc, "roots": roots, "cli": cli, "output": out.getvalue()}))
    """
)


def run_fresh(*argv: str) -> dict:
    """``fitscope ARGV`` in a new interpreter: its exit code, output and imported top-level modules."""
    proc = subprocess.run(
        [sys.executable, "-c", _FRESH, json.dumps(argv)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def run_here(capsys, *argv: str) -> str:
    assert cli.main(list(argv)) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ("estimate", "--model", "llama-3.1-8b", "-c", "8192", "--gpu", "rtx-4090", "--json"),
        ("estimate", "--model", "llama-3.3-70b", "--gpu", "rtx-4090", "--gpu", "rtx-3090", "--host-ram-gib", "64"),
        ("estimate", "--model", "llama-3.1-8b", "--gpu", "epyc-9655", "--json"),
    ],
    ids=["json-4090", "text-two-gpus", "catalog-cpu-box"],
)
def test_catalog_estimate_imports_nothing_heavy_and_prints_the_same(capsys, argv):
    fresh = run_fresh(*argv)
    assert fresh["rc"] == 0
    assert [m for m in fresh["roots"] if m in HEAVY] == []
    assert fresh["cli"] == ["app.cli", "app.cli.estimate", "app.cli.parser"]
    assert fresh["output"] == run_here(capsys, *argv)
    if "--json" in argv:
        assert json.loads(fresh["output"])["weights_bytes"] > 0


def test_help_imports_neither_pydantic_nor_anything_heavy():
    fresh = run_fresh("--help")
    assert fresh["rc"] == 0
    assert "estimate" in fresh["output"]
    assert [m for m in fresh["roots"] if m in (*HEAVY, "pydantic", "pydantic_core", "psutil")] == []
    assert fresh["cli"] == ["app.cli", "app.cli.parser"]


def test_the_check_sees_a_heavy_import():
    """The fresh-interpreter report would catch a regression: numpy shows up once measured."""
    fresh = run_fresh("estimate", "--model", "llama-3.1-8b", "--cpu", "--json")
    assert fresh["rc"] == 0
    assert "numpy" in fresh["roots"]
