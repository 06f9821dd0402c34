"""The module-level import graph of src/vitkit: no cycle between modules (imports inside functions
included), and no shared code that compares a model family's name with a literal.

tests/test_layering.py checks the package ranks (layers -> models -> ... -> cli); it reduces each module to
its package, so a cycle inside one layer (weights.convert <-> weights.importers.x) or across two modules of
the same rank is invisible to it. This walk keeps whole module names.

`python tests/test_import_graph.py` prints every cycle and every family-name comparison it finds.
"""
from __future__ import annotations

import ast
import sys
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "vitkit"


def module_of(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_of(p): p for p in sorted(SRC.rglob("*.py"))}


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom names (`from ..x import y` in vitkit.a.b -> vitkit.x)."""
    if not node.level:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str) -> set[tuple[str, int]]:
    """(vitkit module, line) for each import in module `name`, at any depth. `from pkg import sub` names the
    submodule when `sub` is one; otherwise the package (its __init__), since that is what runs."""
    path = modules()[name]
    known = modules()
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {(a.name, node.lineno) for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(name, path.name == "__init__.py", node)
            if target not in known:
                continue
            subs = {f"{target}.{a.name}" for a in node.names} & known.keys()
            found |= {(s, node.lineno) for s in subs}
            if len(subs) < len(node.names):  # some names are attributes of the package itself
                found.add((target, node.lineno))
    return {(t, line) for t, line in found if t != name}


def graph() -> dict[str, set[str]]:
    return {m: {t for t, _ in imports_of(m)} for m in modules()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def connect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                connect(w)
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
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(g):
        if v not in index:
            connect(v)
    return found


def family_names() -> set[str]:
    """The names passed to register_family anywhere in the package (read from the source, not imported)."""
    names = set()
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None))
                    == "register_family" and node.args and isinstance(node.args[0], ast.Constant)):
                names.add(node.args[0].value)
    return names


def _mentions_family(node: ast.AST) -> bool:
    """True for an expression that reads a family: `family`, `x.family`, `x["family"]`, `x.get("family")`."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and "family" in sub.id.lower():
            return True
        if isinstance(sub, ast.Attribute) and "family" in sub.attr.lower():
            return True
        if isinstance(sub, ast.Constant) and sub.value == "family":
            return True
    return False


def _literals(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def family_branches() -> list[str]:
    """'file:line' of every `<family> ==/!=/in/not in <literal family name>` outside weights/ (importers
    declare the family they read, which is data, not a branch) and models/ (each family's own file)."""
    names = family_names()
    hits = []
    for name, path in modules().items():
        if name.startswith("vitkit.weights"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            literal = set().union(*(_literals(s) for s in sides)) & names
            if literal and any(_mentions_family(s) for s in sides if not _literals(s)):
                hits.append(f"{path.relative_to(SRC)}:{node.lineno} compares a family with {sorted(literal)}")
    return hits


def test_the_walk_sees_real_edges():
    """The checker itself: known imports are found, so an empty cycle list means something."""
    g = graph()
    assert "vitkit.models.registry" in g["vitkit.models.vit_variants"]
    assert any(t.startswith("vitkit.layers.") for t in g["vitkit.models.vision_transformer"])
    assert {"vit", "swin", "resnet", "clip"} <= family_names()


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# What issue 21 has not yet taken apart, named so that the list can only shrink: a new cycle or branch fails,
# and so does one of these once it is gone (then delete its line here).
KNOWN_CYCLES: list[list[str]] = []  # none left: a teacher recipe is trained by training/pipeline.py
KNOWN_FAMILY_BRANCHES: set[str] = set()  # files (relative to src/vitkit) still branching on a family name


def test_no_module_level_import_cycles():
    found = cycles(graph())
    new = [c for c in found if c not in KNOWN_CYCLES]
    gone = [c for c in KNOWN_CYCLES if c not in found]
    assert not new, "import cycles between modules:\n" + "\n".join(" <-> ".join(c) for c in new)
    assert not gone, "no longer a cycle, delete it from KNOWN_CYCLES: " + "; ".join(" <-> ".join(c) for c in gone)


def test_no_family_name_branches_outside_weights():
    """Shared code asks the model contract or a capability, never which family it holds."""
    hits = family_branches()
    where = {h.split(":")[0] for h in hits}
    new = [h for h in hits if h.split(":")[0] not in KNOWN_FAMILY_BRANCHES]
    assert not new, "family-name branches in shared code:\n" + "\n".join(new)
    assert where >= KNOWN_FAMILY_BRANCHES, f"delete from KNOWN_FAMILY_BRANCHES: {KNOWN_FAMILY_BRANCHES - where}"


if __name__ == "__main__":
    for c in cycles(graph()):
        print("cycle:", " <-> ".join(c))
    for h in family_branches():
        print(h)
