"""The shape of the code, checked: no import cycle anywhere, the rooms' import rules, short functions.

The rooms' rules are also import-linter contracts in pyproject.toml (``lint-imports`` in scripts/test.sh);
these tests give the same answer without the tool and add what it does not check (cycles, function length).
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("services", "api", "workers", "cli", "training", "lab")
MAX_FUNCTION_LINES = 60


def _packages() -> list[str]:
    return [p for p in PACKAGES if (ROOT / p / "__init__.py").exists()]


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*_packages(), include_external_packages=False)


def _cycles(nodes: set[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_cycle_between_modules(graph: grimp.ImportGraph) -> None:
    nodes = set(graph.modules)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) & nodes for m in nodes}
    assert _cycles(nodes, edges) == []


def test_no_import_cycle_between_rooms(graph: grimp.ImportGraph) -> None:
    """Packages (``services.raw``, ``services.pipeline`` ...) never import each other both ways."""
    def room(module: str) -> str:
        parts = module.split(".")
        return ".".join(parts[:2]) if parts[0] == "services" else parts[0]

    edges: dict[str, set[str]] = {}
    for m in graph.modules:
        for imported in graph.find_modules_directly_imported_by(m):
            if room(imported) != room(m):
                edges.setdefault(room(m), set()).add(room(imported))
    assert _cycles(set(edges) | {r for rs in edges.values() for r in rs}, edges) == []


@pytest.mark.parametrize(("source", "forbidden"), [
    ("services", ("api", "workers", "cli", "training", "lab")),
    ("services.pipeline", ("services.jobs", "services.db")),
    ("services.raw", ("services.pipeline", "services.jobs", "services.export", "services.db")),
    ("services.storage", ("services.pipeline", "services.jobs", "services.raw", "services.export", "services.db")),
    ("workers", ("api", "cli")),
])
def test_rooms_import_only_downwards(graph: grimp.ImportGraph, source: str, forbidden: tuple[str, ...]) -> None:
    bad = [(f, chain) for f in forbidden if f.split(".")[0] in _packages()
           for chain in [graph.find_shortest_chain(importer=source, imported=f, as_packages=True)] if chain]
    assert bad == []


def test_functions_are_short() -> None:
    """No function over MAX_FUNCTION_LINES lines outside tests and migrations."""
    long = []
    for top in [*_packages(), "scripts"]:
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []
