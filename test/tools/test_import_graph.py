"""tools/import_graph.py: the project's package imports form a DAG, and the checker sees a break."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import import_graph  # noqa: E402


def test_the_project_has_no_import_cycle_and_no_upward_import():
    result = import_graph.report(import_graph.build(ROOT), import_graph.build_modules(ROOT))
    assert not result["cycles"] and not result["upward"], import_graph.format_report(result)
    assert not result["module_cycles"], import_graph.format_report(result)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


# A tiny project in the three folders: a DAG as it stands.
CLEAN = {
    "runtime/__init__.py": "",
    "runtime/progress.py": "",
    "runtime/graph/__init__.py": "from mstar.progress import *\n",
    "runtime/engine/__init__.py": "",
    "runtime/engine/loop.py": "from mstar.graph import node\n",
    "runtime/graph/node.py": "",
    "graphs/__init__.py": "",
    "graphs/tts/__init__.py": "from mstar.engine.loop import *\n",
    "mstar_ros/__init__.py": "",
    "mstar_ros/cli/__init__.py": "from mstar_ros.bench import run\n",
    "mstar_ros/bench/__init__.py": "",
    "mstar_ros/bench/run.py": "import mstar_graphs.tts\n",
}


def test_a_clean_tree_passes(tmp_path):
    _write(tmp_path, CLEAN)
    result = import_graph.report(import_graph.build(tmp_path))
    assert result["cycles"] == [] and result["upward"] == {}
    assert result["packages"] == 6 and result["edges"] == 5, import_graph.format_report(result)


def test_a_lazy_import_back_makes_a_cycle(tmp_path):
    _write(tmp_path, {**CLEAN, "mstar_ros/bench/run.py": "def go():\n    from mstar_ros.cli import main\n"})
    _write(tmp_path, {"mstar_ros/cli/main.py": ""})
    result = import_graph.report(import_graph.build(tmp_path))
    assert result["cycles"] == [["mstar_ros.bench", "mstar_ros.cli"]]
    # `from package import module` imports both: the package's __init__ runs first
    assert result["cycle_edges"]["mstar_ros.bench -> mstar_ros.cli"] == [
        "mstar_ros.bench.run -> mstar_ros.cli",
        "mstar_ros.bench.run -> mstar_ros.cli.main",
    ]


def test_importing_a_later_runtime_subpackage_is_upward(tmp_path):
    # graph sits below engine in RUNTIME_ORDER; a relative import counts as well
    _write(tmp_path, {**CLEAN, "runtime/graph/node.py": "from ..engine import loop\n"})
    result = import_graph.report(import_graph.build(tmp_path))
    assert result["upward"] == {
        "mstar.graph -> mstar.engine": ["mstar.graph.node -> mstar.engine", "mstar.graph.node -> mstar.engine.loop"]
    }
    assert result["cycles"] == [["mstar.engine", "mstar.graph"]]


def test_importing_a_higher_layer_is_upward(tmp_path):
    _write(tmp_path, {**CLEAN, "runtime/progress.py": "if False:\n    import mstar_ros.cli\n"})
    result = import_graph.report(import_graph.build(tmp_path))
    assert list(result["upward"]) == ["mstar -> mstar_ros.cli"]
    assert import_graph.main(["--root", str(tmp_path)]) == 1


def test_a_runtime_subpackage_outside_the_order_is_named(tmp_path):
    _write(tmp_path, {**CLEAN, "runtime/newpkg/__init__.py": "from mstar.graph import node\n"})
    with pytest.raises(ValueError, match="mstar.newpkg"):
        import_graph.report(import_graph.build(tmp_path))


def test_modules_importing_each_other_at_import_time_are_a_cycle_but_lazily_not(tmp_path):
    _write(
        tmp_path,
        {
            **CLEAN,
            "runtime/graph/edges.py": "from mstar.graph.node import *\n",
            "runtime/graph/node.py": "class Node:\n    from mstar.graph import edges\n",
        },
    )
    modules = import_graph.build_modules(tmp_path)
    assert import_graph.cycles(modules) == [["mstar.graph.edges", "mstar.graph.node"]]
    assert import_graph.main(["--root", str(tmp_path)]) == 1
    # the same reference back, made when called or only for type checkers, is no import-time cycle
    for back in (
        "def edges():\n    from mstar.graph import edges\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mstar.graph import edges\n",
    ):
        _write(tmp_path, {"runtime/graph/node.py": back})
        assert import_graph.cycles(import_graph.build_modules(tmp_path)) == []


def test_a_module_importing_its_own_package_is_no_cycle(tmp_path):
    # Python initialises the package before its module: `from mstar.graph import node` in the package is fine
    _write(
        tmp_path,
        {
            **CLEAN,
            "runtime/graph/__init__.py": "from mstar.graph import node\n",
            "runtime/graph/node.py": "import mstar.graph\n",
        },
    )
    assert import_graph.cycles(import_graph.build_modules(tmp_path)) == []


def test_the_models_shelf_importing_a_model_is_upward(tmp_path):
    _write(
        tmp_path,
        {
            **CLEAN,
            "graphs/common/__init__.py": "",
            "graphs/common/layers.py": "from mstar_graphs.tts import x\n",
            "graphs/tts/x.py": "from mstar_graphs.common import layers\n",
        },
    )
    result = import_graph.report(import_graph.build(tmp_path))
    assert list(result["upward"]) == ["mstar_graphs.common -> mstar_graphs.tts"]
    # a model using the shelf, or another model folder, is not upward
    _write(tmp_path, {"graphs/common/layers.py": "", "graphs/asr/__init__.py": "from mstar_graphs.tts import x\n"})
    assert import_graph.report(import_graph.build(tmp_path))["upward"] == {}
