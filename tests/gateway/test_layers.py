"""Layers: ``policies/`` sits at the bottom, ``backends/`` above it (never importing ``gateway/``),
``gateway/`` on top; no module imports itself back through others (no import cycle); and between
packages only the arrows of the table in ``docs/architecture.md`` ("Layers"), with no cycle among them.
Every import counts, including those inside functions; only ``if TYPE_CHECKING:`` blocks are left out."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "policies", "backends", "loadtest")
DOC = ROOT / "docs" / "architecture.md"
# Modules that compose a package's parts from above them: a node of their own in the package graph.
COMPOSERS = ("gateway.cli", "policies.registry")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, modules: set[str], package: str) -> set[str]:
    found: set[str] = set()
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(p for p in [*parts[: len(parts) - node.level + 1], base] if p)
            names = [base, *(f"{base}.{a.name}" for a in node.names)]
        else:
            stack.extend(ast.iter_child_nodes(node))
            continue
        for name in names:
            # the longest known module the name is, or lies in
            parts = name.split(".")
            for i in range(len(parts), 0, -1):
                if ".".join(parts[:i]) in modules:
                    found.add(".".join(parts[:i]))
                    break
    return found


@functools.cache
def _graph() -> dict[str, set[str]]:
    files = {_module(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    modules = set(files)
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = _imports(ast.parse(path.read_text()), modules, package) - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_backends_never_import_gateway() -> None:
    graph = _graph()
    bad = {
        m: sorted(d for d in deps if d.split(".")[0] == "gateway")
        for m, deps in graph.items()
        if m.split(".")[0] == "backends"
    }
    assert not {m: d for m, d in bad.items() if d}


def test_policies_import_only_policies() -> None:
    graph = _graph()
    bad = {
        m: sorted(d for d in deps if d.split(".")[0] != "policies")
        for m, deps in graph.items()
        if m.split(".")[0] == "policies"
    }
    assert not {m: d for m, d in bad.items() if d}


def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _node(module: str) -> str:
    """The package a module belongs to in the layers table: ``top.sub`` for a module of a subpackage
    (however deep), ``top`` for the top package's own modules, a composer alone."""
    if module in COMPOSERS:
        return module
    parts = module.split(".")
    if len(parts) >= 2 and (ROOT / parts[0] / parts[1]).is_dir():
        return ".".join(parts[:2])
    return parts[0]


def _package_arrows(graph: dict[str, set[str]]) -> dict[tuple[str, str], str]:
    """Each arrow between packages, with one import that makes it."""
    arrows: dict[tuple[str, str], str] = {}
    for module, deps in sorted(graph.items()):
        for dep in sorted(deps):
            a, b = _node(module), _node(dep)
            if a != b:
                arrows.setdefault((a, b), f"{module} -> {dep}")
    return arrows


def _table() -> dict[str, set[str]]:
    text = DOC.read_text()
    body = text.split("<!-- layers:begin -->", 1)[1].split("<!-- layers:end -->", 1)[0]
    allowed: dict[str, set[str]] = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue
        allowed[cells[0].strip("`")] = {c.strip().strip("`") for c in cells[1].split(",") if c.strip() not in ("", "—")}
    return allowed


def test_every_package_arrow_is_in_the_table_and_every_table_arrow_is_taken() -> None:
    graph = _graph()
    arrows = _package_arrows(graph)
    allowed = _table()
    nodes = {_node(m) for m in graph}
    assert nodes == set(allowed), f"packages missing from the table or gone: {nodes ^ set(allowed)}"
    unlisted = {f"{a} -> {b}": why for (a, b), why in arrows.items() if b not in allowed[a]}
    assert not unlisted, f"imports the table in docs/architecture.md does not allow: {unlisted}"
    unused = sorted(f"{a} -> {b}" for a, deps in allowed.items() for b in deps if (a, b) not in arrows)
    assert not unused, f"arrows in the table no import takes (remove them): {unused}"


def test_no_package_cycle() -> None:
    packages: dict[str, set[str]] = {}
    for a, b in _package_arrows(_graph()):
        packages.setdefault(a, set()).add(b)
    assert _cycles(packages) == []


def test_the_service_imports_no_load_test_tool() -> None:
    """Only the CLI, above every package, reaches ``loadtest`` or the simulated SGLang."""
    graph = _graph()
    bad = {
        m: sorted(d for d in deps if d.split(".")[0] == "loadtest" or d.startswith("backends.sim"))
        for m, deps in graph.items()
        if m.split(".")[0] == "gateway" and m != "gateway.cli"
    }
    assert not {m: d for m, d in bad.items() if d}
