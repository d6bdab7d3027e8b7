"""Read the project's imports (AST, nothing imported) and report cycles and upward imports.

Why: the three layers (runtime < graphs < mstar_ros) and the runtime's own subpackage order
only stay a DAG if something checks them; `test/tools/test_import_graph.py` runs this.

    python tools/import_graph.py            # print the package graph's cycles and upward imports
    python tools/import_graph.py --json     # the same as JSON

An import counts wherever it is written (module level or inside a function): a lazy import is
still a dependency, and a cycle of lazy imports is still a cycle a reader has to untangle.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# import name -> folder (setup.py's package_dir)
FOLDERS = {"mstar": "runtime", "mstar_graphs": "graphs", "mstar_ros": "mstar_ros"}
TOP_PACKAGES = tuple(FOLDERS)
# The layers, lowest first: a package may import only its own layer or one below it.
LAYERS = {"mstar": 0, "mstar_graphs": 1, "mstar_ros": 2}
# The runtime's subpackages, lowest first (modules at runtime/'s top are leaves, below all).
RUNTIME_ORDER = ("parallel", "layers", "transport", "weights", "graph", "placement", "engine", "worker",
                 "conductor")


@dataclass
class ImportGraph:
    """Edges between packages (`runtime.engine`, `graphs.pi05`, `mstar_ros.ros`, ...)."""

    edges: dict[str, set[str]] = field(default_factory=dict)
    # (importing module, imported module) behind each package edge, for the report
    witnesses: dict[tuple[str, str], list[tuple[str, str]]] = field(default_factory=dict)

    def add(self, src_module: str, dst_module: str) -> None:
        src, dst = package_of(src_module), package_of(dst_module)
        if src == dst:
            return
        self.edges.setdefault(src, set()).add(dst)
        self.witnesses.setdefault((src, dst), []).append((src_module, dst_module))


def package_of(module: str) -> str:
    """`mstar.engine.ar_engine` -> `mstar.engine`; `mstar.progress` -> `mstar`."""
    parts = module.split(".")
    if len(parts) == 1 or (len(parts) == 2 and file_of(module).suffix == ".py"):
        return parts[0]  # the package itself, or a module at its top (mstar.progress)
    return ".".join(parts[:2])


def file_of(module: str) -> Path:
    """The file of a project module: a `.py`, or a package's folder."""
    parts = module.split(".")
    rel = ROOT / FOLDERS[parts[0]] / Path(*parts[1:]) if len(parts) > 1 else ROOT / FOLDERS[parts[0]]
    return rel.with_suffix(".py") if rel.with_suffix(".py").exists() else rel


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    parts[0] = {folder: name for name, folder in FOLDERS.items()}[parts[0]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path) -> list[str]:
    """Every project module `path` imports, absolute or relative, at any depth of the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    own = module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append(target)
            if target.split(".")[0] not in FOLDERS:
                continue
            # `from runtime.engine import sampler` imports the module runtime.engine.sampler
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if resolves(sub):
                    found.append(sub)
    return [name for name in found if name.split(".")[0] in TOP_PACKAGES]


def resolves(module: str) -> bool:
    path = file_of(module)
    return path.suffix == ".py" or (path / "__init__.py").exists()


def build() -> ImportGraph:
    graph = ImportGraph()
    for folder in FOLDERS.values():
        for path in sorted((ROOT / folder).rglob("*.py")):
            src = module_name(path)
            for dst in imported_modules(path):
                graph.add(src, dst)
    return graph


def cycles(graph: ImportGraph) -> list[list[str]]:
    """The strongly connected components with more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
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

    for node in sorted(set(graph.edges) | {d for ds in graph.edges.values() for d in ds}):
        if node not in index:
            visit(node)
    return sorted(found)


def rank(package: str) -> tuple[int, int]:
    """(layer, order inside runtime) of a package; runtime's top-level modules rank lowest."""
    parts = package.split(".")
    if parts[0] == "mstar" and len(parts) > 1:
        if parts[1] not in RUNTIME_ORDER:
            raise ValueError(f"{package}: a new runtime subpackage; place it in RUNTIME_ORDER")
        return 0, RUNTIME_ORDER.index(parts[1]) + 1
    return LAYERS[parts[0]], 0


def upward(graph: ImportGraph) -> list[tuple[str, str]]:
    """Edges into a higher layer, or into a later runtime subpackage."""
    return sorted((src, dst) for src, dsts in graph.edges.items() for dst in dsts
                  if rank(dst) > rank(src) and not (rank(dst)[0] == rank(src)[0] > 0))


def report(graph: ImportGraph) -> dict:
    def witness(src: str, dst: str) -> list[str]:
        return sorted({f"{a} -> {b}" for a, b in graph.witnesses[(src, dst)]})

    found_cycles = cycles(graph)
    cycle_edges = {}
    for component in found_cycles:
        members = set(component)
        for src in component:
            for dst in sorted(graph.edges.get(src, ()) & members):
                cycle_edges[f"{src} -> {dst}"] = witness(src, dst)
    return {
        "packages": len(set(graph.edges) | {d for ds in graph.edges.values() for d in ds}),
        "edges": sum(len(d) for d in graph.edges.values()),
        "cycles": found_cycles,
        "cycle_edges": cycle_edges,
        "upward": {f"{s} -> {d}": witness(s, d) for s, d in upward(graph)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    result = report(build())
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{result['packages']} packages, {result['edges']} package edges")
        print(f"{len(result['cycles'])} cycles")
        for component in result["cycles"]:
            print("  cycle: " + " <-> ".join(component))
        for edge, why in result["cycle_edges"].items():
            print(f"    {edge}: {'; '.join(why[:3])}{' ...' if len(why) > 3 else ''}")
        print(f"{len(result['upward'])} upward imports")
        for edge, why in result["upward"].items():
            print(f"  {edge}: {'; '.join(why[:3])}{' ...' if len(why) > 3 else ''}")
    return 1 if result["cycles"] or result["upward"] else 0


if __name__ == "__main__":
    sys.exit(main())
