"""No import cycle in core or an engine, imports inside functions and type-only ones included.

A cycle closed by an import inside a function works until someone moves that import to the top
(or imports the modules in another order); it also hides that two modules are one concept, or
that a shared piece belongs in a module of its own. A type-only cycle (``if TYPE_CHECKING:``)
says the same of the two modules, and breaks the day an annotation is needed at run time.
Edges are every first-party ``import`` / ``from ... import`` in a module (at the top, in a
function, or under ``if TYPE_CHECKING:``), resolved to the module imported (``from pkg import
name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = {
    "mizuoto": ROOT / "packages/mizuoto-core/src/mizuoto",
    "mizuoto_f5tts": ROOT / "packages/mizuoto-f5tts/src/mizuoto_f5tts",
    "mizuoto_voxcpm": ROOT / "packages/mizuoto-voxcpm/src/mizuoto_voxcpm",
}

# Cycles known and being removed elsewhere, each with why it is still here. Empty is the goal.
KNOWN: set[frozenset[str]] = set()


def _modules() -> dict[str, Path]:
    modules = {}
    for root in PACKAGES.values():
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _owner(name: str, modules) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


class _Imports(ast.NodeVisitor):
    """The first-party modules one module's body imports, anywhere in it (``targets``), and
    those it imports inside a function (``local``)."""

    def __init__(self, package: str, modules: dict[str, Path]) -> None:
        self.package, self.modules, self.targets = package, modules, set()
        self._outside_functions: set[str] = set()
        self._in_functions: set[str] = set()
        self._current = self._outside_functions  # where the import being visited goes

    @property
    def local(self) -> set[str]:
        return self._in_functions - self._outside_functions

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        current, self._current = self._current, self._in_functions
        self.generic_visit(node)
        self._current = current

    visit_AsyncFunctionDef = visit_FunctionDef

    def _add(self, target: str) -> None:
        self.targets.add(target)
        self._current.add(target)

    def visit_Import(self, node: ast.Import) -> None:
        for target in filter(None, (_owner(a.name, self.modules) for a in node.names)):
            self._add(target)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            anchor = self.package
            for _ in range(node.level - 1):
                anchor = anchor.rpartition(".")[0]
            base = f"{anchor}.{base}" if base else anchor
        for alias in node.names:
            full = f"{base}.{alias.name}"
            owner = full if full in self.modules else _owner(base, self.modules)
            if owner:
                self._add(owner)


def _imports(modules: dict[str, Path]) -> dict[str, _Imports]:
    found = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        imports = _Imports(package, modules)
        imports.visit(ast.parse(path.read_text(encoding="utf-8")))
        found[module] = imports
    return found


def import_edges(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each first-party module -> the first-party modules it imports anywhere in its body."""
    return {module: imports.targets - {module} for module, imports in _imports(modules).items()}


def local_import_edges(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each first-party module -> the first-party modules it imports inside a function only
    (not also at the top or under ``TYPE_CHECKING``)."""
    return {module: imports.local - {module} for module, imports in _imports(modules).items()}


def cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_no_import_cycle_beyond_the_known_ones():
    found = cycles(import_edges(_modules()))
    new = [sorted(c) for c in found if c not in KNOWN]
    assert not new, (f"import cycles (function-local imports included): {new}; move what both "
                     "modules need into a module of its own, below both")


def test_the_known_cycles_still_exist():
    """Remove an entry from KNOWN once its cycle is gone (it would hide a new one)."""
    found = set(cycles(import_edges(_modules())))
    assert KNOWN <= found, f"gone, remove from KNOWN: {[sorted(c) for c in KNOWN - found]}"


@pytest.mark.parametrize(("edges", "expected"), [
    ({"a": {"b"}, "b": {"a"}, "c": set()}, [{"a", "b"}]),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [{"a", "b", "c"}]),
    ({"a": {"b"}, "b": set()}, []),
])
def test_cycles_are_found(edges, expected):
    assert sorted(map(set, cycles(edges)), key=sorted) == expected


def test_function_local_and_type_only_imports_are_edges(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from pkg import b\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    from pkg import c\nfrom . import a\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    from pkg.b import x\n")
    modules = {"pkg": package / "__init__.py", "pkg.a": package / "a.py",
               "pkg.b": package / "b.py", "pkg.c": package / "c.py"}
    edges = import_edges(modules)
    assert edges == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a", "pkg.c"},
                     "pkg.c": {"pkg.b"}}
    assert cycles(edges) == [frozenset({"pkg.a", "pkg.b", "pkg.c"})]
    assert local_import_edges(modules)["pkg.a"] == {"pkg.b"}
    assert local_import_edges(modules)["pkg.b"] == set()
