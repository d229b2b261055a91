"""Imports go one way: down the layers written in docs/architecture.md.

Every module of the package belongs to a room (its top-level subpackage, or a named group of
top-level modules); rooms have ranks. A module may import its own room and rooms of a lower rank,
never a room of the same or a higher rank. Lazy imports inside functions count too: a lazy
upward import is still a dependency that climbs. ``TYPE_CHECKING`` imports count as well, so a
type may only be named from below.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "src" / "slimrag"

#: room -> rank. Same rank, different room: peers that must not import each other.
RANKS: dict[str, float] = {
    "base": 0,      # errors, types, config, files, prompt, openai_http, hf, cpu
    "embed": 1,
    "ingest": 2,
    "catalog": 2,
    "store": 2.5,   # index/store/: the index folder's floor (layout, manifest, lock, vectors, flat, slim/)
    "index": 3,     # index/ but store/: the facade (Index) and what it runs
    "llm": 4,
    "rag": 5,
    "api": 6,
    "serve": 7,
    "route": 7,
    "mcp": 7,       # the MCP server for agents: a shell over rag/index like serve
    "app": 8,       # cli, demo, the package's __init__ (the public API)
}
BASE = {"errors", "types", "config", "files", "prompt", "openai_http", "hf", "cpu"}
APP = {"cli", "demo", "__init__", "__main__"}


def room_of(module: str) -> str:
    """The room of a dotted module name under ``slimrag``."""
    parts = module.split(".")
    assert parts[0] == "slimrag", module
    head = parts[1] if len(parts) > 1 else "__init__"
    if head in BASE:
        return "base"
    if head in APP:
        return "app"
    if head == "index" and len(parts) > 2 and parts[2] == "store":
        return "store"
    if head not in RANKS:
        raise AssertionError(f"slimrag.{head} belongs to no room: add it to RANKS and docs/architecture.md")
    return head


def module_name(path: Path, pkg: Path = PKG) -> str:
    rel = path.relative_to(pkg.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path, pkg: Path = PKG) -> list[tuple[int, str]]:
    """(line, imported slimrag module) for every import in the file, lazy ones included."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []
    me = module_name(path, pkg).split(".")
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "slimrag"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = me if is_pkg else me[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target == "slimrag":  # `from slimrag import files`: the names are modules
                found += [(node.lineno, f"slimrag.{a.name}") for a in node.names]
            elif target.split(".")[0] == "slimrag":
                found.append((node.lineno, target))
    return found


def violations(pkg: Path = PKG) -> list[str]:
    """Every import that climbs or crosses to a peer room, as 'file:line: a -> b' lines."""
    bad = []
    for path in sorted(pkg.rglob("*.py")):
        src = room_of(module_name(path, pkg))
        for line, target in imports_of(path, pkg):
            dst = room_of(target)
            if dst != src and RANKS[dst] >= RANKS[src]:
                bad.append(f"{path.relative_to(pkg.parent)}:{line}: {src} (rank {RANKS[src]}) imports "
                           f"{target} ({dst}, rank {RANKS[dst]})")
    return bad


def test_imports_go_one_way_down_the_layers():
    bad = violations()
    assert not bad, "imports against the layer order (docs/architecture.md):\n" + "\n".join(bad)


def test_every_module_has_a_room():
    rooms = {room_of(module_name(p)) for p in PKG.rglob("*.py")}
    assert rooms <= set(RANKS)


def test_the_check_catches_an_upward_import(tmp_path):
    """The checker itself: a copy of a base module that imports the RAG layer is reported."""
    fake = tmp_path / "slimrag"
    (fake / "rag").mkdir(parents=True)
    (fake / "rag" / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "types.py").write_text("def f():\n    from slimrag.rag import pipeline\n")
    bad = violations(fake)
    assert len(bad) == 1 and "base (rank 0) imports slimrag.rag" in bad[0]


def test_architecture_doc_names_every_room():
    """docs/architecture.md's layer table names every room (a folder as `name/`, a module as `name`)."""
    doc = (PKG.parents[1] / "docs" / "architecture.md").read_text()
    layers = doc.split("## Layers", 1)[-1].split("\n## ", 1)[0]
    missing = [r for r in RANKS if r not in ("base", "app")
               and f"`{r}/`" not in layers and f"`{r}`" not in layers]
    assert not missing, f"the Layers section of docs/architecture.md does not place the rooms {missing}"


@pytest.mark.parametrize("path", sorted(PKG.rglob("*.py")), ids=lambda p: str(p.relative_to(PKG)))
def test_no_module_over_400_lines(path):
    n = len(path.read_text().splitlines())
    assert n <= 420, f"{path.relative_to(PKG)} has {n} lines: split it by concept"


def import_graph(pkg: Path = PKG) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (lazy and ``TYPE_CHECKING`` ones included); an
    import of a package's names that are all its submodules (``from slimrag.catalog import codec``)
    counts as importing those submodules, not the package's ``__init__``."""
    mods = {module_name(p, pkg): p for p in pkg.rglob("*.py")}

    def known(target: str) -> str:
        while target and target not in mods:
            target = target.rsplit(".", 1)[0] if "." in target else ""
        return target

    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        targets = {t for _, t in imports_of(path, pkg)}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods]
                if subs and len(subs) == len(node.names):
                    targets = (targets - {node.module}) | set(subs)
        graph[name] = {known(t) for t in targets} - {name, ""}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected components of two modules or more."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_inside_a_room():
    """Rooms cannot form a cycle (ranks); modules of one room must not either: two modules that
    import each other are one concept cut in two, or a third module's concept held by one of them."""
    found = circles(import_graph())
    assert not found, "modules importing each other: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_circle_check_finds_one(tmp_path):
    fake = tmp_path / "slimrag"
    (fake / "rag").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "rag" / "__init__.py").write_text("")
    (fake / "rag" / "a.py").write_text("from slimrag.rag import b\n")
    (fake / "rag" / "b.py").write_text("def f():\n    from slimrag.rag.a import x\n")
    assert circles(import_graph(fake)) == [["slimrag.rag.a", "slimrag.rag.b"]]
