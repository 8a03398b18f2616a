"""The folders' roles, as docs/ARCHITECTURE.md states them, checked on the imports themselves."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP_PACKAGES = ("engine", "storage", "app", "ui", "tools", "training", "scripts")
# What each folder may import of the others (docs/ARCHITECTURE.md).
ALLOWED = {
    "engine": set(),
    "storage": set(),
    "app": {"engine", "storage"},
    "ui": {"app", "engine", "storage"},
    "training": {"engine"},
    "tools": {"app", "engine", "storage", "training", "ui"},
}


def imported_packages(path: Path) -> set[str]:
    """The project's top packages a module imports, at any depth (lazy imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found |= {n.split(".")[0] for n in names if n.split(".")[0] in TOP_PACKAGES}
    return found


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_each_folder_imports_only_what_its_role_allows(folder):
    wrong = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        extra = imported_packages(path) - ALLOWED[folder] - {folder}
        if extra:
            wrong[str(path.relative_to(ROOT))] = sorted(extra)
    assert not wrong, f"imports across roles: {wrong}"


def test_the_check_sees_lazy_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from tools import bench\n    import app.service\n")
    assert imported_packages(module) == {"tools", "app"}
