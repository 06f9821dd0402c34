"""The package is layered and acyclic: every import inside src/vitkit (top-level or inside a function) goes
down or sideways, never up, and the package-level graph has no cycle.

    layers -> models -> weights -> api -> data / export -> analysis / training / inference -> bench / retrieval
        -> serve -> cli

`python tests/test_layering.py` prints the package-level import graph.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "vitkit"

# lower rank = lower layer; a module may import its own rank (if that makes no cycle) or any lower one
RANKS = {
    "errors": 0, "typed_config": 0, "_files": 0, "_lazy": 0, "runtime": 0, "_version": 0, "hardware": 0, "timing": 0,
    "onednn": 0,
    "layers": 1, "text": 1,
    "models": 2,
    "weights": 3,
    "api": 4,
    "data": 5, "export": 5,
    "analysis": 6, "training": 6, "inference": 6, "probe": 6, "zeroshot": 6,  # inference uses training.evaluate
    "bench": 7, "latency": 7, "tradeoff": 7, "peers": 7, "retrieval": 7,
    "serve": 8,
    "cli": 9,
    "__init__": 10, "__main__": 10, "demo": 10,
}


def unit(module: str) -> str:
    """'vitkit.models.config' -> 'models' (the package or top-level module that is a layer)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1] if len(parts) > 1 else parts
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[str, int]]:
    """(imported vitkit module, line) for every import statement in the file, at any depth."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "vitkit"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "vitkit":
                continue
            if target == "vitkit" or node.module is None:  # `from . import x` / `from vitkit import x`
                out += [(f"{target}.{a.name}" if target != "vitkit" or a.name in RANKS else target, node.lineno)
                        for a in node.names]
            else:
                out.append((target, node.lineno))
    return out


def edges() -> list[tuple[str, str, str]]:
    """(importing module 'file:line', from unit, to unit) for every cross-unit import."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        src = unit(module_name(path)) if module_name(path) != "vitkit" else "__init__"
        for target, line in imports_of(path):
            dst = unit(target)
            if dst != src:
                found.append((f"{path.relative_to(SRC)}:{line}", src, dst))
    return found


def graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = {u: set() for u in RANKS}
    for _, a, b in edges():
        g.setdefault(a, set()).add(b)
    return g


def test_every_unit_has_a_rank():
    units = {unit(module_name(p)) if module_name(p) != "vitkit" else "__init__" for p in SRC.rglob("*.py")}
    assert units <= set(RANKS), f"give these a layer in RANKS: {sorted(units - set(RANKS))}"


def test_no_upward_imports():
    up = [f"{where}: {a} (layer {RANKS[a]}) imports {b} (layer {RANKS[b]})"
          for where, a, b in edges() if RANKS.get(b, 99) > RANKS.get(a, -1)]
    assert not up, "upward imports:\n" + "\n".join(up)


def test_no_import_cycles():
    g = graph()
    state: dict[str, int] = {}

    def visit(u: str, stack: list[str]) -> list[str] | None:
        state[u] = 1
        for v in sorted(g.get(u, ())):
            if state.get(v) == 1:
                return stack + [u, v]
            if not state.get(v):
                cycle = visit(v, stack + [u])
                if cycle:
                    return cycle
        state[u] = 2
        return None

    for u in sorted(g):
        if not state.get(u):
            cycle = visit(u, [])
            assert cycle is None, "import cycle: " + " -> ".join(cycle[cycle.index(cycle[-1]):])


def test_nothing_imports_the_cli():
    """The CLI parses, calls the library, prints: no library module depends on it."""
    users = [where for where, a, b in edges() if b == "cli" and a not in ("__main__", "demo")]
    assert not users, f"library modules importing vitkit.cli: {users}"


def test_the_walk_sees_real_edges():
    """The checker itself: it finds the imports we know exist (so an empty result means something)."""
    g = graph()
    assert "layers" in g["models"] and "models" in g["weights"] and {"models", "weights"} <= g["api"]
    assert any(b == "layers" for _, a, b in edges() if a == "models")


if __name__ == "__main__":
    for a, bs in sorted(graph().items(), key=lambda kv: RANKS.get(kv[0], 99)):
        print(f"{a:12s} (layer {RANKS.get(a, '?')}) -> {', '.join(sorted(bs, key=lambda b: RANKS.get(b, 99))) or '-'}")
    sys.exit(0)
