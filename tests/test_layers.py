"""The house rule: app/core and app/adapters never import Qt (PySide6, pyqtgraph) or the Qt layer (app.ui).

Two checks: a static one over the source (names file and line), and a dynamic one that imports every
core/adapter module and runs the CLI in a fresh interpreter where Qt cannot be imported at all.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
APP = REPO / "app"
LAYERS = ("core", "adapters")
FORBIDDEN = ("PySide6", "pyqtgraph", "shiboken6", "app.ui")


def _forbidden(module: str) -> str | None:
    """The forbidden root ``module`` falls under, or None."""
    for root in FORBIDDEN:
        if module == root or module.startswith(root + "."):
            return root
    return None


def _resolve_relative(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a ``from ... import`` names (relative ones resolved against ``package``)."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = parts[: len(parts) - (node.level - 1)] if node.level - 1 <= len(parts) else []
    return ".".join(base + ([node.module] if node.module else []))


def forbidden_imports(source: str, filename: str = "<string>", package: str = "") -> list[str]:
    """Every Qt / app.ui import in ``source``, as 'file:line: import X'. ``package`` resolves relative imports."""
    tree = ast.parse(source, filename=filename)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = _resolve_relative(node, package)
            names = [module]
            if module == "app":  # `from app import ui`
                names += [f"app.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if _forbidden(name):
                found.append(f"{filename}:{node.lineno}: imports {name}")
    return found


def _layer_files() -> list[Path]:
    files = sorted(p for layer in LAYERS for p in (APP / layer).rglob("*.py"))
    assert files, "no source files found under app/core and app/adapters"
    return files


def _package_of(path: Path) -> str:
    """The package a file's relative imports resolve against (app/core/x.py and app/core/__init__.py: app.core)."""
    return ".".join(path.relative_to(REPO).parent.parts)


def test_core_and_adapters_source_never_imports_qt():
    problems = []
    for path in _layer_files():
        rel = path.relative_to(REPO).as_posix()
        problems += forbidden_imports(path.read_text(encoding="utf-8"), rel, _package_of(path))
    assert not problems, "Qt imported below the UI layer:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "source",
    [
        "import PySide6",
        "import PySide6.QtWidgets as w",
        "from PySide6.QtCore import QObject",
        "from PySide6 import QtCore",
        "import pyqtgraph as pg",
        "from pyqtgraph import PlotWidget",
        "import app.ui.main_window",
        "from app.ui import window",
        "from app import ui",
        "def later():\n    import numpy, pyqtgraph\n",
        "try:\n    import PySide6\nexcept ImportError:\n    pass\n",
    ],
)
def test_checker_catches_qt_imports(source):
    problems = forbidden_imports(source, "app/core/bad.py", "app.core")
    assert len(problems) == 1, problems
    assert problems[0].startswith("app/core/bad.py:")


def test_checker_names_the_line_and_resolves_relative_imports(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import json\n\n\nimport PySide6\nfrom ..ui import window\n", encoding="utf-8")
    problems = forbidden_imports(bad.read_text(), "app/core/bad.py", "app.core")
    assert problems == ["app/core/bad.py:4: imports PySide6", "app/core/bad.py:5: imports app.ui"]


@pytest.mark.parametrize(
    "source",
    [
        "import json",
        "from app.core.memory.estimate import estimate",
        "from .estimate import estimate",
        "import pyside6_helpers_not_qt",
        "import pyqtgraphics",
        "from app import core",
        "s = 'import PySide6'",
    ],
)
def test_checker_allows_other_imports(source):
    assert forbidden_imports(source, "app/core/ok.py", "app.core") == []


_DYNAMIC = textwrap.dedent(
    """
    import contextlib, importlib, io, json, pkgutil, sys

    BLOCKED = {"PySide6", "pyqtgraph", "shiboken6"}

    class NoQt:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"Qt is blocked in this test: {name}")
            return None

    sys.meta_path.insert(0, NoQt())

    import app.adapters, app.core, app.services

    imported = []
    for pkg in (app.core, app.adapters, app.services):
        def onerror(name):
            raise
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".", onerror=onerror):
            importlib.import_module(info.name)
            imported.append(info.name)

    import app.cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = app.cli.main(["estimate", "--model", "llama-3.1-8b", "--cpu", "--json"])
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    print(json.dumps({"rc": rc, "imported": imported, "leaked": leaked, "result": json.loads(out.getvalue())}))
    """
)


def test_core_adapters_and_cli_run_without_qt():
    proc = subprocess.run(
        [sys.executable, "-c", _DYNAMIC], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["rc"] == 0
    assert report["leaked"] == []
    assert "app.core.memory.estimate" in report["imported"]
    assert "app.adapters.host" in report["imported"]
    assert "app.services.runs" in report["imported"]
    assert report["result"]["weights_bytes"] > 0


def test_the_blocker_really_blocks_qt():
    """The dynamic test means something only if its finder stops a Qt import that would otherwise work."""
    script = _DYNAMIC.split("import app.adapters")[0] + textwrap.dedent(
        """
        try:
            import pyqtgraph
        except ImportError as exc:
            print("blocked:", exc)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("blocked:")


# -- the layer order: core < adapters < services < ui and cli ------------------------------------

LAYER_ORDER = {"core": 0, "adapters": 1, "services": 2, "ui": 3, "cli": 3}


def _layer_of(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != "app":
        return None
    return parts[1] if parts[1] in LAYER_ORDER else None


def upward_imports(source: str, filename: str, package: str) -> list[str]:
    """Every import in ``source`` (a file of layer ``package``) of a layer above its own, anywhere
    in the file (function bodies too), as 'file:line: imports X'."""
    own = _layer_of(package)
    if own is None:
        return []
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = _resolve_relative(node, package)
            names = [f"app.{a.name}" for a in node.names] if module == "app" else [module]
        else:
            continue
        for name in names:
            layer = _layer_of(name)
            if layer is not None and LAYER_ORDER[layer] > LAYER_ORDER[own]:
                found.append(f"{filename}:{node.lineno}: imports {name}")
    return found


def test_no_layer_imports_a_layer_above_it():
    problems = []
    for layer in ("core", "adapters", "services"):
        for path in sorted((APP / layer).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            problems += upward_imports(path.read_text(encoding="utf-8"), rel, _package_of(path))
    assert not problems, "an import against the layer order (core < adapters < services < ui/cli):\n" + "\n".join(
        problems
    )


def test_services_source_never_imports_qt():
    problems = []
    for path in sorted((APP / "services").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        problems += forbidden_imports(path.read_text(encoding="utf-8"), rel, _package_of(path))
    assert not problems, "Qt imported in the services layer:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("source", "package", "bad"),
    [
        ("from app.adapters.host import detect_host", "app.core", True),
        ("def f():\n    from app.services.runs import finish_run\n", "app.adapters", True),
        ("from app import cli", "app.services", True),
        ("from ..ui import window", "app.services", True),
        ("from app.core.memory.estimate import estimate", "app.services", False),
        ("from app.adapters.run_saving import record_run", "app.services", False),
        ("from .runs import finish_run", "app.services", False),
    ],
)
def test_the_layer_checker(source, package, bad):
    assert bool(upward_imports(source, "x.py", package)) is bad


# -- the core's packages, in their import order, and no circles anywhere ---------------------------

CORE_PACKAGES = ("common", "hardware", "model", "memory", "speed", "quality", "plans", "report", "advisor")


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every app import in the file, function bodies and TYPE_CHECKING blocks too;
    ``from package import module`` names the module."""
    package = _package_of(path)
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("app.")]
        elif isinstance(node, ast.ImportFrom):
            module = _resolve_relative(node, package)
            if not module.startswith("app"):
                continue
            for a in node.names:
                sub = f"{module}.{a.name}"
                is_module = (REPO / Path(*sub.split("."))).with_suffix(".py").exists() or (
                    REPO / Path(*sub.split(".")) / "__init__.py"
                ).exists()
                found.append((node.lineno, sub if is_module else module))
    return found


def core_order_problems(files: list[Path]) -> list[str]:
    """Every import in ``app/core`` of a core package later in :data:`CORE_PACKAGES` than the file's own."""
    rank = {p: i for i, p in enumerate(CORE_PACKAGES)}
    problems = []
    for path in files:
        parts = path.relative_to(APP / "core").parts
        if len(parts) < 2:
            continue
        own = parts[0]
        for line, module in _imports(path):
            bits = module.split(".")
            if len(bits) > 2 and bits[1] == "core" and bits[2] in rank and rank[bits[2]] > rank[own]:
                problems.append(f"{path.relative_to(REPO)}:{line}: {own} imports {module}")
    return problems


def test_every_core_module_is_in_a_package_of_the_order():
    loose = [p.name for p in (APP / "core").glob("*.py") if p.name != "__init__.py"]
    assert loose == [], "app/core holds only packages"
    packages = sorted(p.name for p in (APP / "core").iterdir() if (p / "__init__.py").exists())
    assert packages == sorted(CORE_PACKAGES)
    for name in CORE_PACKAGES:
        doc = ast.get_docstring(ast.parse((APP / "core" / name / "__init__.py").read_text(encoding="utf-8")))
        assert doc and len(doc) > 80, f"app/core/{name}/__init__.py says what the package is for"


def test_core_packages_import_only_those_before_them():
    problems = core_order_problems(sorted((APP / "core").rglob("*.py")))
    assert not problems, "a core package imports one after it:\n" + "\n".join(problems)


def test_the_core_order_checker_finds_a_backward_import(tmp_path):
    (tmp_path / "app" / "core" / "model").mkdir(parents=True)
    # A file placed inside the repository's tree is what the checker reads; it names the culprit.
    bad = APP / "core" / "model" / "_order_probe.py"
    bad.write_text("def f():\n    from app.core.memory.estimate import estimate\n", encoding="utf-8")
    try:
        assert core_order_problems([bad]) == [
            "app/core/model/_order_probe.py:2: model imports app.core.memory.estimate"
        ]
    finally:
        bad.unlink()


def import_cycles() -> list[list[str]]:
    """Groups of app modules that import one another round in a circle (Tarjan's strongly connected
    components of the import graph, every import in a file counted)."""
    modules = {_module_name(p): p for p in APP.rglob("*.py")}
    graph = {
        m: {t for _, t in _imports(p) if t in modules and t != m and not m.startswith(t + ".")}
        for m, p in modules.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_circles():
    assert import_cycles() == []


MAX_MODULE_LINES = 600


def oversized_modules(limit: int = MAX_MODULE_LINES) -> list[str]:
    """Modules under app/ longer than ``limit`` lines, as 'path: N lines' (a module that long does
    more than one job: split it by job)."""
    out = []
    for path in sorted(APP.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            out.append(f"{path.relative_to(REPO)}: {lines} lines")
    return out


def test_no_module_exceeds_600_lines():
    assert oversized_modules() == []
    # The rule itself: a long file is named with its length.
    assert oversized_modules(limit=100) and all(line.endswith(" lines") for line in oversized_modules(limit=100))
