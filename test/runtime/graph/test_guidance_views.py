"""A flow node's guidance views: declared on the node, checked with the graph, carried to the engine."""

import re

import pytest

from mstar.graph import Call, GraphEdge, GraphError, GraphNode, Loop, LoopMode, ModelGraph, Sequential


def graph(guidance=("cfg",), cfg_module="lm"):
    nodes = [
        GraphNode("main", inputs=["input_ids"], outputs=[], engine="ar", module="lm"),
        GraphNode("cfg", inputs=["input_ids"], outputs=[], engine="ar", module=cfg_module),
        GraphNode(
            "image",
            inputs=["x"],
            outputs=["x"],
            engine="ar",
            module="lm",
            kv_from="main",
            loop_mode=LoopMode.FLOW,
            guidance=guidance,
        ),
    ]
    edges = [
        GraphEdge("input.ids", "main.input_ids"),
        GraphEdge("input.ids", "cfg.input_ids"),
        GraphEdge("input.noise", "image.x"),
        GraphEdge("image.x", "image.x"),
        GraphEdge("image.x", "output.image"),
    ]
    walks = {"prefill": Sequential(Call("main"), Call("cfg")), "gen": Loop(Call("image"), max_iters=3)}
    return ModelGraph("g", nodes, edges, walks, next_walk=lambda s: None)


def test_a_valid_guided_flow_node():
    node = graph().node("image")
    assert node.guidance == ("cfg",) and node.kv_sources == ("main", "cfg")


def test_guidance_from_an_unknown_view_or_another_module_is_refused():
    with pytest.raises(GraphError, match="node 'image' takes guidance from unknown node 'ghost'"):
        graph(guidance=("ghost",))
    with pytest.raises(GraphError, match="node 'image' can take guidance only from an AR view of the same module"):
        graph(cfg_module="other")


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"loop_mode": LoopMode.TOKEN, "kv_from": None}, "need a flow node"),
        ({"guidance": ("image",)}, "cannot name the node itself"),
        ({"guidance": ("cfg", "cfg")}, "repeat a view"),
    ],
)
def test_guidance_on_the_wrong_node_is_refused(kw, message):
    args = {"engine": "ar", "kv_from": "main", "loop_mode": LoopMode.FLOW, "guidance": ("cfg",), **kw}
    with pytest.raises(ValueError, match=re.escape(message)):
        GraphNode("image", inputs=["x"], outputs=["x"], **args)
