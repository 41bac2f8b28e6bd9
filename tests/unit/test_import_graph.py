"""No import circles between the modules of the package.

Parses every module under ``statefun/`` (``sdk/``, ``ingress/`` and ``egress/`` are
``statefun.sdk``, ``statefun.ingress`` and ``statefun.egress``) with ``ast`` and follows its
imports: those at module level and those inside functions (a deferred import is still a
dependency), but not those under ``if TYPE_CHECKING:`` (types only, never run). An import
of ``a.b.c`` is an edge to ``a.b.c`` (or to the package ``a.b`` when ``c`` is a name in it);
a package's ``__init__`` is a module like any other.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: the source folders and the package each is installed as (pyproject.toml's package-dir)
FOLDERS = {
    "statefun": "statefun",
    "sdk": "statefun.sdk",
    "ingress": "statefun.ingress",
    "egress": "statefun.egress",
}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder, package in FOLDERS.items():
        base = ROOT / folder
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if "_proto" in parts:
                continue
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> list[str]:
    """Every module name ``tree`` imports at run time (not under ``if TYPE_CHECKING``):
    ``from a.b import c`` is ``a.b.c`` when that is a module in ``known``, else ``a.b``."""
    names: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            for alias in node.names:
                submodule = f"{prefix}.{alias.name}"
                names.append(submodule if submodule in known else prefix)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        imported = _imports(tree, name, path.name == "__init__.py", known)
        graph[name] = {other for other in imported if other in known and other != name}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as a
    cycle through them that the failure message can print."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = [0]

    def strongconnect(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                strongconnect(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            strongconnect(node)
    return [_a_cycle(graph, component) for component in components]


def _a_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One closed path through a strongly connected component (a -> b -> ... -> a)."""
    members = set(component)
    start = component[0]
    # breadth-first from start back to start inside the component
    paths = {succ: [start, succ] for succ in sorted(graph[start] & members)}
    seen = set(paths)
    while paths:
        if start in paths:
            return paths[start]
        next_paths: dict[str, list[str]] = {}
        for node, path in paths.items():
            for succ in sorted(graph[node] & members):
                if succ == start:
                    return [*path, start]
                if succ not in seen:
                    seen.add(succ)
                    next_paths[succ] = [*path, succ]
        paths = next_paths
    return component


def test_the_graph_sees_the_package() -> None:
    graph = import_graph()
    assert "statefun.runtime._job" in graph
    assert "statefun.sdk" in graph
    assert "statefun.ingress.http" in graph
    assert "statefun.runtime._dispatcher" in graph["statefun.runtime._job"]


def test_a_cycle_is_found_and_printed() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_type_checking_imports_are_not_edges() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "import x.y\n"
        "if TYPE_CHECKING:\n"
        "    import x.z\n"
        "def f():\n"
        "    from x import w\n"
    )
    assert _imports(tree, "m", False, {"x.w"}) == ["typing", "x.y", "x.w"]


#: circles still to break, each as the set of its modules; the list only shrinks (a listed
#: circle that is gone fails the test, so that its entry is removed with it)
TOLERATED: list[frozenset[str]] = []


def test_no_import_circles() -> None:
    cycles = find_cycles(import_graph())
    new = [c for c in cycles if frozenset(c) not in TOLERATED]
    assert not new, "import circles:\n" + "\n".join(" -> ".join(c) for c in new)
    gone = [sorted(t) for t in TOLERATED if t not in {frozenset(c) for c in cycles}]
    assert not gone, f"no longer circles, remove them from TOLERATED: {gone}"


#: the modules that may import the job (they start one); the rest see it through Protocols
STARTS_JOBS = {"statefun.runtime", "statefun.runtime._plan", "statefun.cluster._worker"}


def test_nothing_below_the_job_imports_it() -> None:
    """Not even for types: the dispatcher, the checkpoint coordinator, recovery and the admin
    server see the job through narrow interfaces (Protocols), never the ``Job`` class."""
    importers = []
    for name, path in _modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "statefun.runtime._job":
                importers.append(name)
    assert set(importers) <= STARTS_JOBS, sorted(set(importers) - STARTS_JOBS)
