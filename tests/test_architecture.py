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
    "ui": {"app"},
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


# A forward needs the weights, the attention backend and the layer halves: an engine.runner.Runner
# holds them, and only the model itself and the runner see them apart.
SEES_THE_PARTS = {"engine/model/transformer.py", "engine/runner.py", "engine/model/compiled_layers.py"}


def functions_taking_the_parts(path: Path) -> list[str]:
    """Functions (and methods) that take `layer_fns`, or both `model` and `attention`, by hand."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = {a.arg for a in node.args.args + node.args.kwonlyargs}
            if "layer_fns" in names or {"model", "attention"} <= names:
                found.append(node.name)
    return found


def test_no_module_passes_model_attention_and_layer_functions_by_hand():
    wrong = {}
    for folder in (*ALLOWED, "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel not in SEES_THE_PARTS and (names := functions_taking_the_parts(path)):
                wrong[rel] = names
    assert not wrong, f"take a Runner instead: {wrong}"


def test_the_parts_check_sees_a_function_taking_them(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f(model, attention, x):\n    pass\n\nclass A:\n    def g(self, y, *, layer_fns=None):\n"
                      "        pass\n\ndef h(runner, x):\n    pass\n")
    assert functions_taking_the_parts(module) == ["f", "g"]
