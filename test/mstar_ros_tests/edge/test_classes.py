"""mstar_ros.edge.classes: every node of a front-end's graph gets the front-end's class, where the runtime has classes."""

from __future__ import annotations

import types

from mstar_ros.edge.classes import DEFAULT_CLASS, class_overrides, classes_available


def test_every_node_of_the_graph_gets_the_class_where_the_runtime_has_classes():
    graph = types.SimpleNamespace(nodes=[types.SimpleNamespace(name="vit"), types.SimpleNamespace(name="llm")])
    got = class_overrides(graph, "batch")
    assert got == ({"priorities": {"vit": "batch", "llm": "batch"}} if classes_available() else {})
    assert DEFAULT_CLASS == {"pi05": "control", "voice": "interactive", "images": "batch"}


def test_a_front_ends_class_limits_reach_its_conductor():
    from mstar.priority import Priority
    from mstar_ros.edge.classes import classed_conductor
    from support.conductor_helpers import LM, config
    from support.toy_graphs import lm_graph

    conductor = classed_conductor(lm_graph(), {"llm": LM}, config(), "batch", {"batch": 1})
    assert conductor.class_limits.limits == {Priority.BATCH: 1}
