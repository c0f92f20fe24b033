"""The import graph of ``python/nearcache`` has no circle.

Every import counts: at module level, inside functions, and under
``if TYPE_CHECKING:``, since an import moved into a function to dodge a
circle still ties the two modules together.  A package's ``__init__``
only re-exports its modules, so its own imports are left out, and a name
taken from a package (``from nearcache import Cache``) is followed to the
module that defines it.  The layers this keeps apart are drawn in
``docs/design/python.md``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "nearcache"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(root: Path) -> dict[str, Path]:
    return {_module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


class _Graph:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.paths = _modules(root)
        self.trees = {
            name: ast.parse(path.read_text(), str(path)) for name, path in self.paths.items()
        }
        self.packages = {name for name, path in self.paths.items() if path.name == "__init__.py"}

    def _defining(self, package: str, name: str, seen: frozenset[str] = frozenset()) -> str:
        """The module a package's ``__init__`` takes ``name`` from (the package itself if none)."""
        if package in seen:
            return package
        for node in ast.walk(self.trees[package]):
            if isinstance(node, ast.ImportFrom):
                source = _absolute(package, True, node)
                for alias in node.names:
                    if (alias.asname or alias.name) == name and source in self.paths:
                        return self._target(source, alias.name, seen | {package})
        return package

    def _target(self, source: str, name: str, seen: frozenset[str] = frozenset()) -> str:
        if f"{source}.{name}" in self.paths:
            return f"{source}.{name}"
        if source in self.packages:
            return self._defining(source, name, seen)
        return source

    def imports(self, module: str) -> Iterator[tuple[str, int]]:
        """(imported module, line) for every import of ``module``, wherever it stands."""
        is_package = module in self.packages
        for node in ast.walk(self.trees[module]):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in self.paths:
                        yield alias.name, node.lineno
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(module, is_package, node)
                if source not in self.paths:
                    continue
                for alias in node.names:
                    yield self._target(source, alias.name), node.lineno

    def edges(self) -> dict[str, dict[str, int]]:
        graph: dict[str, dict[str, int]] = {name: {} for name in self.paths}
        for module in self.paths:
            if module in self.packages:
                continue  # re-exports
            for target, line in self.imports(module):
                if target != module:
                    graph[module].setdefault(target, line)
        return graph


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _describe(graph: dict[str, dict[str, int]], component: list[str]) -> str:
    members = set(component)
    lines = [
        f"  {source} -> {target} (line {line})"
        for source in component
        for target, line in sorted(graph[source].items())
        if target in members
    ]
    return "circle of " + ", ".join(component) + ":\n" + "\n".join(lines)


def test_the_package_has_no_import_circle() -> None:
    graph = _Graph(PACKAGE).edges()
    circles = _cycles(graph)
    assert not circles, "\n".join(_describe(graph, c) for c in circles)


def test_the_policies_import_no_store() -> None:
    # memoize, locks and tags work on any store through the protocol: they
    # never name a store's module, not even for typing.
    graph = _Graph(PACKAGE).edges()
    stores = {name for name in graph if name == "nearcache.cache" or ".drivers" in name}
    stores |= {name for name in graph if name.startswith(("nearcache.tiered", "nearcache.aio"))}
    for policy in ("nearcache.memoize", "nearcache.locks", "nearcache.tags"):
        assert not stores & set(graph[policy]), (policy, sorted(stores & set(graph[policy])))


# ------------------------------------------------------- the checker is a judge


def _write(root: Path, files: dict[str, str]) -> Path:
    package = root / "nearcache"
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package


@pytest.mark.parametrize(
    "files",
    [
        {  # an import deferred into a function
            "__init__.py": "",
            "a.py": "import nearcache.b\n",
            "b.py": "def f():\n    from nearcache.a import x\n",
        },
        {  # a type-only import
            "__init__.py": "",
            "a.py": "from nearcache import b\n",
            "b.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from nearcache.a import A\n"
            ),
        },
        {  # through a package's re-export, relative imports
            "__init__.py": "from nearcache.a import A\n",
            "a.py": "from .sub.c import C\nA = 1\n",
            "sub/__init__.py": "",
            "sub/c.py": "from .. import A\nC = 2\n",
        },
    ],
)
def test_the_checker_finds_circles(tmp_path: Path, files: dict[str, str]) -> None:
    assert len(_cycles(_Graph(_write(tmp_path, files)).edges())) == 1


def test_the_checker_leaves_re_exports_alone(tmp_path: Path) -> None:
    files = {
        "__init__.py": "from nearcache.a import A\nfrom nearcache.b import B\n",
        "a.py": "A = 1\n",
        "b.py": "from nearcache import A\nB = A\n",
    }
    graph = _Graph(_write(tmp_path, files)).edges()
    assert graph["nearcache.b"] == {"nearcache.a": 1}
    assert not _cycles(graph)
