"""The package's shape: no module over 1,000 lines; module-level imports form no cycle and go
down the layers of DESIGN.md (formats -> qtensor / options / reference -> runtime -> op families
-> nn / io / bench / cli)."""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "microscale"
MAX_LINES = 1000
#: modules that their owners are splitting (each must still exist and still be too long: the list only shrinks)
PENDING_SPLIT: set[str] = set()
#: layer of each top-level module or package (DESIGN.md); a module imports only from its layer or below
LAYERS = {"_paths": 0, "_names": 0, "_safetensors": 0, "formats": 1, "qtensor": 2, "options": 2, "reference": 2, "reference_fused": 2, "reference_scaled": 2, "runtime": 3,
          "quant": 4, "linear": 4, "moe": 4, "attention": 4, "ops": 4, "embedding": 4, "conv": 4,
          "nn": 5, "io": 5, "distributed": 5, "accuracy": 5, "bench": 5, "cli": 5, "demo": 5, "__main__": 5}


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _imports(name: str, path: pathlib.Path, mods: dict) -> set[str]:
    """The microscale modules ``name`` imports at module level (not inside functions)."""
    tree = ast.parse(path.read_text())
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()

    def visit(body):
        for node in body:
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "microscale":
                        found.add(a.name)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                if mod.split(".")[0] != "microscale":
                    continue
                subs = {f"{mod}.{a.name}" for a in node.names} & set(mods)
                if len(subs) < len(node.names):  # names defined in mod itself
                    found.add(mod)
                found.update(subs)  # (submodules: the package's own __init__ is no dependency)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for h in getattr(node, "handlers", []):
                    visit(h.body)

    visit(tree.body)
    return {m for m in found if m in mods and m != name}


def test_no_module_over_1000_lines():
    long = {str(p.relative_to(ROOT)): n for p in PKG.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert set(long) <= PENDING_SPLIT, {k: v for k, v in long.items() if k not in PENDING_SPLIT}
    stale = PENDING_SPLIT - set(long)
    assert not stale, f"no longer too long or gone: drop them from PENDING_SPLIT: {sorted(stale)}"


def test_import_graph_is_acyclic_and_layered():
    mods = _modules()
    graph = {m: _imports(m, p, mods) for m, p in mods.items()}
    assert {"microscale.linear.routing", "microscale.linear.plans"} <= graph["microscale.linear.op"]  # (parsed)

    def layer(m: str) -> int:
        parts = m.split(".")
        return 6 if len(parts) == 1 else LAYERS[parts[1]]

    upward = sorted(f"{m} -> {d}" for m, ds in graph.items() for d in ds
                    if len(d.split(".")) > 1 and layer(d) > layer(m))
    assert not upward, upward
    state: dict = {}
    stack: list = []

    def dfs(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(d):] + [d]))
            if d not in state:
                dfs(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            dfs(m)


def test_every_top_level_module_has_a_layer():
    tops = {m.split(".")[1] for m in _modules() if "." in m}
    assert tops <= set(LAYERS), sorted(tops - set(LAYERS))
