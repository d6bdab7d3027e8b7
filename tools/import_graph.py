"""Read the project's imports (AST, nothing imported) and report cycles and upward imports.

Why: the three layers (runtime < graphs < mstar_ros) and the runtime's own subpackage order
only stay a DAG if something checks them; `test/tools/test_import_graph.py` runs this.

    python tools/import_graph.py            # print the package graph's cycles and upward imports
    python tools/import_graph.py --json     # the same as JSON

An import counts wherever it is written (module level, inside a function, under
TYPE_CHECKING): a lazy import is still a dependency, and a cycle of lazy imports is still a
cycle a reader has to untangle. Modules collapse to packages (`mstar.engine`,
`mstar_graphs.pi05`, `mstar_ros.ros`); a module at a layer's top (`mstar.progress`)
collapses to the layer itself (`mstar`), which therefore may import none of its subpackages.
`mstar_graphs.common` is the models' shelf: it may import no model folder.

Inside a package, modules may refer back to each other lazily, but the imports that run when a
module is imported (its top level and class bodies, not functions, not `if TYPE_CHECKING:`)
must form no cycle either: such a cycle fails or half-initialises a module depending on which
one is imported first.
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
# The layers, lowest first: a package may import only its own layer or one below it.
LAYERS = {"mstar": 0, "mstar_graphs": 1, "mstar_ros": 2}
# The runtime's subpackages, lowest first (modules at runtime/'s top are leaves, below all).
RUNTIME_ORDER = ("parallel", "layers", "transport", "weights", "graph", "placement", "engine", "worker", "conductor")
# A layer's shared shelf sits below that layer's other subpackages.
SHELVES = {"mstar_graphs": "common"}


@dataclass
class ImportGraph:
    """Edges between packages, and the module imports behind each edge."""

    edges: dict[str, set[str]] = field(default_factory=dict)
    # (importing package, imported package) -> [(importing module, imported module)], for the report
    witnesses: dict[tuple[str, str], list[tuple[str, str]]] = field(default_factory=dict)

    def add(self, src: str, dst: str, src_module: str, dst_module: str) -> None:
        if src == dst:
            return
        self.edges.setdefault(src, set()).add(dst)
        self.witnesses.setdefault((src, dst), []).append((src_module, dst_module))

    def packages(self) -> set[str]:
        return set(self.edges) | {dst for dsts in self.edges.values() for dst in dsts}


@dataclass(frozen=True)
class SourceTree:
    """The project's folders under ``root``, named by their import names."""

    root: Path

    def file_of(self, module: str) -> Path:
        """A project module's `.py`, or a package's folder."""
        top, *rest = module.split(".")
        path = self.root / FOLDERS[top] / Path(*rest)
        return path.with_suffix(".py") if rest and path.with_suffix(".py").exists() else path

    def resolves(self, module: str) -> bool:
        path = self.file_of(module)
        return path.suffix == ".py" or (path / "__init__.py").exists()

    def package_of(self, module: str) -> str:
        """`mstar.engine.ar_engine` -> `mstar.engine`; `mstar.progress` -> `mstar`."""
        parts = module.split(".")
        if len(parts) == 1 or (len(parts) == 2 and self.file_of(module).suffix == ".py"):
            return parts[0]
        return ".".join(parts[:2])

    def module_name(self, path: Path) -> str:
        folder, *rest = path.relative_to(self.root).with_suffix("").parts
        names = [{f: name for name, f in FOLDERS.items()}[folder], *rest]
        return ".".join(names[:-1] if names[-1] == "__init__" else names)

    def sources(self) -> list[Path]:
        return [path for folder in FOLDERS.values() for path in sorted((self.root / folder).rglob("*.py"))]

    def imported_modules(self, path: Path) -> list[str]:
        """Every project module ``path`` imports, absolute or relative, at any depth of the file."""
        tree = ast.parse(path.read_text(), filename=str(path))
        own = self.module_name(path)
        package = own if path.name == "__init__.py" else own.rpartition(".")[0]
        found = [name for node in ast.walk(tree) for name in self._imported_by(node, package)]
        return [name for name in found if name.split(".")[0] in FOLDERS]

    def _imported_by(self, node: ast.AST, package: str) -> list[str]:
        """The modules one statement imports (none if it is no import)."""
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        if not isinstance(node, ast.ImportFrom):
            return []
        target = _absolute(node, package)
        if target.split(".")[0] not in FOLDERS:
            return [target]
        # `from mstar.engine import sampler` imports the module mstar.engine.sampler
        return [target, *(sub for alias in node.names if self.resolves(sub := f"{target}.{alias.name}"))]

    def import_time_modules(self, path: Path) -> list[str]:
        """The project modules importing ``path`` imports at once: top level and class bodies,
        not function bodies and not ``if TYPE_CHECKING:`` blocks. Its own ancestor packages are
        left out: Python initialises them before the module itself."""
        own = self.module_name(path)
        package = own if path.name == "__init__.py" else own.rpartition(".")[0]
        ancestors = {".".join(own.split(".")[:i]) for i in range(1, own.count(".") + 1)}
        found: list[str] = []

        def visit(nodes: list[ast.stmt]) -> None:
            for node in nodes:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue  # runs when called, not when imported
                if isinstance(node, ast.If) and _is_type_checking(node.test):
                    visit(node.orelse)
                    continue
                found.extend(self._imported_by(node, package))
                # statements nested in class bodies, if/for/while/with/try run at import time too
                for name in ("body", "orelse", "finalbody"):
                    visit([child for child in getattr(node, name, []) if isinstance(child, ast.stmt)])
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

        visit(ast.parse(path.read_text(), filename=str(path)).body)
        return [name for name in found if name.split(".")[0] in FOLDERS and name not in ancestors]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def build(root: Path = ROOT) -> ImportGraph:
    """The package graph of the project under ``root``."""
    tree = SourceTree(root)
    graph = ImportGraph()
    for path in tree.sources():
        src = tree.module_name(path)
        for dst in tree.imported_modules(path):
            graph.add(tree.package_of(src), tree.package_of(dst), src, dst)
    return graph


def build_modules(root: Path = ROOT) -> ImportGraph:
    """The graph of the imports that run at import time, between modules."""
    tree = SourceTree(root)
    graph = ImportGraph()
    for path in tree.sources():
        src = tree.module_name(path)
        for dst in tree.import_time_modules(path):
            graph.add(src, dst, src, dst)
    return graph


def cycles(graph: ImportGraph) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph.packages()):
        if node not in index:
            visit(node)
    return sorted(found)


def rank(package: str) -> tuple[int, int]:
    """(layer, order inside the layer) of a package: the runtime's subpackages by RUNTIME_ORDER
    above its top-level modules; a layer's shelf (graphs/common) below its other subpackages,
    which have no order among themselves (only cycles count there)."""
    top, *rest = package.split(".")
    if top == "mstar" and rest:
        if rest[0] not in RUNTIME_ORDER:
            raise ValueError(f"{package}: a new runtime subpackage; place it in RUNTIME_ORDER")
        return 0, RUNTIME_ORDER.index(rest[0]) + 1
    if top in SHELVES and rest and rest[0] != SHELVES[top]:
        return LAYERS[top], 1
    return LAYERS[top], 0


def upward(graph: ImportGraph) -> list[tuple[str, str]]:
    """Edges into a higher layer, into a later runtime subpackage, or from a shelf into its layer."""
    return sorted((src, dst) for src, dsts in graph.edges.items() for dst in dsts if rank(dst) > rank(src))


def report(graph: ImportGraph, modules: ImportGraph | None = None) -> dict:
    def witness(src: str, dst: str) -> list[str]:
        return sorted({f"{a} -> {b}" for a, b in graph.witnesses[(src, dst)]})

    found_cycles = cycles(graph)
    cycle_edges = {
        f"{src} -> {dst}": witness(src, dst)
        for component in found_cycles
        for src in component
        for dst in sorted(graph.edges.get(src, set()) & set(component))
    }
    return {
        "packages": len(graph.packages()),
        "edges": sum(len(dsts) for dsts in graph.edges.values()),
        "cycles": found_cycles,
        "cycle_edges": cycle_edges,
        "upward": {f"{src} -> {dst}": witness(src, dst) for src, dst in upward(graph)},
        "module_cycles": cycles(modules) if modules is not None else [],
    }


def format_report(result: dict) -> str:
    def why(modules: list[str]) -> str:
        return "; ".join(modules[:3]) + (" ..." if len(modules) > 3 else "")

    lines = [f"{result['packages']} packages, {result['edges']} package edges", f"{len(result['cycles'])} cycles"]
    lines += ["  cycle: " + " <-> ".join(component) for component in result["cycles"]]
    lines += [f"    {edge}: {why(modules)}" for edge, modules in result["cycle_edges"].items()]
    lines.append(f"{len(result['upward'])} upward imports")
    lines += [f"  {edge}: {why(modules)}" for edge, modules in result["upward"].items()]
    lines.append(f"{len(result['module_cycles'])} import-time module cycles")
    lines += ["  cycle: " + " <-> ".join(component) for component in result["module_cycles"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--root", type=Path, default=ROOT, help="the project's folder (default: this checkout)")
    args = parser.parse_args(argv)
    result = report(build(args.root), build_modules(args.root))
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    return 1 if result["cycles"] or result["upward"] or result["module_cycles"] else 0


if __name__ == "__main__":
    sys.exit(main())
