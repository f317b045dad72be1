"""The package's folders are layers: every import (lazy ones included) goes to the same folder or
one below, there is no import cycle, no private name crosses a folder, and functions stay short."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "embedeval"
# Bottom to top; "" is the top level (the public namespace, the CLI, file formats, compat).
LAYERS = (
    "utils",
    "plots",
    "metrics",
    "engine",
    "search",
    "evaluation",
    "protocols",
    "report",
    "integrations",
    "",
)
MAX_CODE_LINES = 60


def _module_name(path: Path) -> tuple[str, ...]:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return parts[:-1] if parts[-1] == "__init__" else parts


def _folder(module: tuple[str, ...]) -> str:
    return module[1] if len(module) > 1 and module[1] in LAYERS else ""


def _imports(path: Path) -> list[tuple[tuple[str, ...], str]]:
    """(target module, imported name) for every import of embedeval in the file, at any depth."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            target = base + tuple(node.module.split(".") if node.module else ())
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("embedeval"):
            target = tuple(node.module.split("."))
        else:
            continue
        for alias in node.names:
            sub = PACKAGE.parent.joinpath(*target, alias.name)
            is_module = sub.with_suffix(".py").exists() or (sub / "__init__.py").exists()
            found.append(((*target, alias.name) if is_module else target, alias.name))
    return found


def _edges():
    for path in sorted(PACKAGE.rglob("*.py")):
        me = _module_name(path)
        for target, name in _imports(path):
            yield path, me, target, name


def test_the_layers_are_the_folders_of_the_package():
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders == set(LAYERS) - {""}
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 20, top


def test_no_module_imports_from_a_folder_above_its_own():
    upward = [
        f"{'.'.join(me)} imports {'.'.join(target)}"
        for _, me, target, _ in _edges()
        if LAYERS.index(_folder(target)) > LAYERS.index(_folder(me))
    ]
    assert upward == []


def test_no_private_name_crosses_a_folder():
    crossing = [
        f"{'.'.join(me)} imports {name} from {'.'.join(target)}"
        for _, me, target, name in _edges()
        if _folder(target) != _folder(me)
        and (
            (name.startswith("_") and not name.startswith("__"))
            or any(p.startswith("_") and not p.startswith("__") for p in target[1:])
        )
    ]
    assert crossing == []


def test_no_import_cycle():
    graph = defaultdict(set)
    for _, me, target, _ in _edges():
        if target != me:
            graph[me].add(target)
    state: dict[tuple, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt) :])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in list(graph):
        if node not in state:
            visit(node, [])
    assert cycles == []


def _code_lines(node: ast.FunctionDef, lines: list[str]) -> int:
    body = node.body
    has_doc = (
        isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    )
    start = body[1].lineno if has_doc and len(body) > 1 else body[0].lineno
    text = lines[start - 1 : node.end_lineno]
    return sum(1 for line in text if line.strip() and not line.strip().startswith("#"))


def test_functions_are_short_enough_to_read_at_once():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        lines = source.split("\n")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if _code_lines(node, lines) > MAX_CODE_LINES:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.name}")
    assert long == []


def test_the_walk_resolves_relative_imports_to_modules():
    # The walk itself: a relative import from a folder resolves to the module it names.
    path = PACKAGE / "engine" / "exact.py"
    targets = {".".join(t) for t, _ in _imports(path)}
    assert "embedeval.utils.errors" in targets
    assert _folder(("embedeval", "search", "local")) == "search"
    assert _folder(("embedeval", "cli")) == ""
    assert LAYERS.index(_folder(("embedeval", "report", "demo"))) > LAYERS.index("evaluation")
