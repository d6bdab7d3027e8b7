"""Declaration-time checks of a ModelGraph: each mistake fails with a message that names the culprit."""

import re

import pytest

from mstar.graph import (
    Call,
    DynamicLoop,
    FixedChunkPolicy,
    GraphEdge,
    GraphError,
    GraphNode,
    Loop,
    ModelGraph,
    Parallel,
    PartitionConnection,
    PartitionTopology,
    Sequential,
    StopOnValues,
    StopWhen,
    StreamingGraphEdge,
)


def make(nodes, edges, walks, topology=None, name="g"):
    return ModelGraph(name=name, nodes=nodes, edges=edges, walks=walks, next_walk=lambda s: None, topology=topology)


def raises(fragment):
    return pytest.raises(GraphError, match=re.escape(fragment))


def node(name, inputs=("x",), outputs=("y",), **kw):
    return GraphNode(name, inputs=list(inputs), outputs=list(outputs), **kw)


def chain():
    """input.x -> a -> b -> output.y, a valid baseline every error test perturbs once."""
    nodes = [node("a"), node("b")]
    edges = [GraphEdge("input.x", "a.x"), GraphEdge("a.y", "b.x"), GraphEdge("b.y", "output.y")]
    return nodes, edges


def test_baseline_is_valid_and_queries_work():
    nodes, edges = chain()
    g = make(nodes, edges, {"main": Sequential("a", "b")})
    assert g.input_names == ["x"] and g.output_names == ["y"]
    assert [str(e) for e in g.edges_from("a", "y")] == ["a.y -> b.x"]
    assert g.modules() == {"a": ["a"], "b": ["b"]}
    assert g.walk("main").node_names() == ["a", "b"]
    with raises("has no walk 'nope'"):
        g.walk("nope")
    with raises("has no node 'nope'"):
        g.node("nope")


# -- edges ---------------------------------------------------------------------------------
def test_edge_to_unknown_node():
    nodes, edges = chain()
    with raises("ends at unknown node 'ghost'"):
        make(nodes, edges + [GraphEdge("a.y", "ghost.x")], {"main": Sequential("a", "b")})


def test_edge_from_unknown_node():
    nodes, edges = chain()
    with raises("starts at unknown node 'ghost'"):
        make(nodes, edges + [GraphEdge("ghost.y", "b.x")], {"main": Sequential("a", "b")})


def test_edge_to_unknown_input_port():
    nodes, edges = chain()
    with raises("node 'b' has no input 'z'"):
        make(nodes, edges + [GraphEdge("a.y", "b.z")], {"main": Sequential("a", "b")})


def test_edge_from_unknown_output_port():
    nodes, edges = chain()
    with raises("node 'a' has no output 'w'"):
        make(nodes, edges + [GraphEdge("a.w", "output.w")], {"main": Sequential("a", "b")})


def test_malformed_endpoint():
    nodes, edges = chain()
    with raises("'ay' is not of the form 'node.port'"):
        make(nodes, edges + [GraphEdge("ay", "output.z")], {"main": Sequential("a", "b")})


def test_edge_from_graph_output_and_into_graph_input():
    nodes, edges = chain()
    with raises("output.y -> b.x starts at the graph output"):
        make(nodes, edges + [GraphEdge("output.y", "b.x")], {"main": Sequential("a", "b")})
    with raises("a.y -> input.x ends at the graph input"):
        make(nodes, edges + [GraphEdge("a.y", "input.x")], {"main": Sequential("a", "b")})


def test_dangling_input():
    nodes = [node("a"), node("b", inputs=("x", "cond"))]
    _, edges = chain()
    with raises("input b.cond is dangling"):
        make(nodes, edges, {"main": Sequential("a", "b")})


def test_streaming_edge_feeds_its_input():
    """A port fed only by a streaming edge is not dangling."""
    nodes, _ = chain()
    edges = [
        GraphEdge("input.x", "a.x"),
        StreamingGraphEdge("a.y", "b.x", target_partition="q"),
        GraphEdge("b.y", "output.y"),
    ]
    topo = PartitionTopology({"p": ["a"], "q": ["b"]}, [PartitionConnection("p", "q", FixedChunkPolicy(2))])
    g = make(nodes, edges, {"main": Sequential("a", "b")}, topology=topo)
    assert [str(e) for e in g.streaming_edges()] == ["a.y ~> b.x [q]"]


# -- walks ---------------------------------------------------------------------------------
def test_walk_calls_unknown_node():
    nodes, edges = chain()
    with raises("walk 'main' calls unknown node 'ghost'"):
        make(nodes, edges, {"other": Call("a"), "main": Sequential("a", Parallel("b", "ghost"))})


def test_no_walks():
    nodes, edges = chain()
    with raises("declares no walks"):
        make(nodes, edges, {})


def test_walk_step_constructors_reject_bad_shapes():
    with pytest.raises(ValueError, match="at least one step"):
        Sequential()
    with pytest.raises(ValueError, match="at least two branches"):
        Parallel("a")
    with pytest.raises(TypeError, match="node name or a WalkStep"):
        Sequential("a", 3)


def test_loop_needs_max_iters_or_stop():
    with pytest.raises(ValueError, match="Loop needs max_iters, a stop condition, or both"):
        Loop("a")
    with pytest.raises(ValueError, match="max_iters must be >= 1, got 0"):
        Loop("a", max_iters=0)
    # either one alone is enough
    assert Loop("a", max_iters=3).max_iters == 3
    assert Loop("a", stop=StopWhen(lambda s: True)).max_iters is None


def test_loop_stop_edge_must_be_a_node_output():
    nodes = [node("a")]
    edges = [GraphEdge("input.x", "a.x"), GraphEdge("a.y", "a.x"), GraphEdge("a.y", "output.y")]
    ok = make(nodes, edges, {"main": Loop("a", max_iters=4, stop=StopOnValues("a.y", (0,)))})
    assert isinstance(ok.walk("main"), Loop)
    with raises("loop stops on 'a.nope', which is no node output"):
        make(nodes, edges, {"main": Loop("a", max_iters=4, stop=StopOnValues("a.nope", (0,)))})
    with raises("loop stops on 'ghost.y', which is no node output"):
        make(nodes, edges, {"main": Loop("a", max_iters=4, stop=StopOnValues("ghost.y", (0,)))})
    with raises("walk 'main': stop edge"):
        make(nodes, edges, {"main": Loop("a", max_iters=4, stop=StopOnValues("ay", (0,)))})


# -- cycles --------------------------------------------------------------------------------
def cyclic():
    nodes = [node("a"), node("b")]
    edges = [
        GraphEdge("input.x", "a.x"),
        GraphEdge("a.y", "b.x"),
        GraphEdge("b.y", "a.x"),
        GraphEdge("b.y", "output.y"),
    ]
    return nodes, edges


def test_cycle_outside_any_loop_is_rejected():
    nodes, edges = cyclic()
    with raises("cycle a -> b -> a is not inside any Loop"):
        make(nodes, edges, {"main": Sequential("a", "b")})


def test_same_cycle_inside_a_loop_is_accepted():
    nodes, edges = cyclic()
    g = make(nodes, edges, {"main": Loop(Sequential("a", "b"), max_iters=3)})
    assert g.walk("main").node_names() == ["a", "b"]
    g = make(nodes, edges, {"main": DynamicLoop(Sequential("a", "b"), trip_count=lambda s: 2)})
    assert isinstance(g.walk("main"), DynamicLoop)


def test_cycle_split_over_two_loops_is_rejected():
    nodes, edges = cyclic()
    with raises("cycle a -> b -> a is not inside any Loop"):
        make(nodes, edges, {"main": Sequential(Loop("a", max_iters=2), Loop("b", max_iters=2))})


def test_self_loop_needs_a_loop():
    nodes = [node("a")]
    edges = [GraphEdge("input.x", "a.x"), GraphEdge("a.y", "a.x"), GraphEdge("a.y", "output.y")]
    with raises("cycle a -> a is not inside any Loop"):
        make(nodes, edges, {"main": Call("a")})
    make(nodes, edges, {"main": Loop("a", max_iters=2)})


def test_streaming_edge_does_not_close_a_cycle():
    nodes, _ = cyclic()
    edges = [
        GraphEdge("input.x", "a.x"),
        StreamingGraphEdge("a.y", "b.x", target_partition="q"),
        GraphEdge("b.y", "a.x"),
        GraphEdge("b.y", "output.y"),
    ]
    topo = PartitionTopology({"p": ["a"], "q": ["b"]}, [PartitionConnection("p", "q", FixedChunkPolicy(2))])
    make(nodes, edges, {"main": Sequential("a", "b")}, topology=topo)


# -- partitions and streaming edges -----------------------------------------------------------
def streaming(target_partition="q"):
    nodes, _ = chain()
    edges = [
        GraphEdge("input.x", "a.x"),
        StreamingGraphEdge("a.y", "b.x", target_partition=target_partition),
        GraphEdge("b.y", "output.y"),
    ]
    return nodes, edges


def test_streaming_edge_to_missing_partition():
    nodes, edges = streaming(target_partition="nowhere")
    topo = PartitionTopology({"p": ["a"], "q": ["b"]}, [PartitionConnection("p", "q", FixedChunkPolicy(2))])
    with raises("targets missing partition 'nowhere'"):
        make(nodes, edges, {"main": Sequential("a", "b")}, topology=topo)


def test_streaming_edge_without_chunk_policy():
    nodes, edges = streaming()
    topo = PartitionTopology({"p": ["a"], "q": ["b"]}, [])
    with raises("a.y ~> b.x [q] has no chunk policy: add PartitionConnection('p', 'q', policy)"):
        make(nodes, edges, {"main": Sequential("a", "b")}, topology=topo)
    # a policy for the reverse direction does not count
    topo = PartitionTopology({"p": ["a"], "q": ["b"]}, [PartitionConnection("q", "p", FixedChunkPolicy(2))])
    with raises("has no chunk policy"):
        make(nodes, edges, {"main": Sequential("a", "b")}, topology=topo)


def test_streaming_edge_without_topology():
    nodes, edges = streaming()
    with raises("streaming edge a.y ~> b.x [q] needs a PartitionTopology"):
        make(nodes, edges, {"main": Sequential("a", "b")})


def test_streaming_edge_to_node_outside_its_target_partition():
    nodes, edges = streaming(target_partition="p")
    topo = PartitionTopology({"p": ["a"], "q": ["b"]}, [PartitionConnection("p", "p", FixedChunkPolicy(2))])
    with raises("ends at 'b', which is not in partition 'p'"):
        make(nodes, edges, {"main": Sequential("a", "b")}, topology=topo)


def test_streaming_edge_from_node_in_no_partition():
    nodes, edges = streaming()
    topo = PartitionTopology({"q": ["b"]}, [PartitionConnection("q", "q", FixedChunkPolicy(2))])
    with raises("starts at 'a', which is in no partition"):
        make(nodes, edges, {"main": Sequential("a", "b")}, topology=topo)


def test_node_in_two_partitions():
    nodes, edges = streaming()
    topo = PartitionTopology({"p": ["a"], "q": ["b", "a"]}, [PartitionConnection("p", "q", FixedChunkPolicy(2))])
    with raises("node 'a' is in partitions 'p' and 'q'"):
        make(nodes, edges, {"main": Sequential("a", "b")}, topology=topo)


def test_partition_lists_unknown_node():
    nodes, edges = streaming()
    topo = PartitionTopology({"p": ["a"], "q": ["b", "ghost"]}, [PartitionConnection("p", "q", FixedChunkPolicy(2))])
    with raises("partition 'q' lists unknown node 'ghost'"):
        make(nodes, edges, {"main": Sequential("a", "b")}, topology=topo)


def test_connection_to_missing_partition():
    nodes, edges = streaming()
    topo = PartitionTopology(
        {"p": ["a"], "q": ["b"]},
        [PartitionConnection("p", "q", FixedChunkPolicy(2)), PartitionConnection("p", "r", FixedChunkPolicy(2))],
    )
    with raises("connection 'p' -> 'r' names missing partition 'r'"):
        make(nodes, edges, {"main": Sequential("a", "b")}, topology=topo)


# -- node names and views ---------------------------------------------------------------------
@pytest.mark.parametrize("reserved", ["input", "output"])
def test_reserved_node_names(reserved):
    with raises(f"node name {reserved!r} is reserved"):
        make([node(reserved)], [GraphEdge("input.x", f"{reserved}.x")], {"main": Call(reserved)})


def test_duplicate_node_names():
    with raises("two nodes are named 'a'"):
        make([node("a"), node("a")], [GraphEdge("input.x", "a.x")], {"main": Call("a")})


def test_invalid_engine_kind():
    with pytest.raises(ValueError, match="node 'a': engine must be 'ar' or 'stateless', got 'gpu'"):
        GraphNode("a", inputs=["x"], outputs=["y"], engine="gpu")


def ar(name, module="lm", **kw):
    return GraphNode(name, inputs=["input_ids"], outputs=["token"], engine="ar", module=module, **kw)


def ar_edges(*names):
    return [
        e for n in names for e in (GraphEdge("input.prompt", f"{n}.input_ids"), GraphEdge(f"{n}.token", f"output.{n}"))
    ]


def test_views_share_a_module():
    g = make([ar("a"), ar("b"), ar("c", kv_from="a")], ar_edges("a", "b", "c"), {"main": Sequential("a", "b", "c")})
    assert g.modules() == {"lm": ["a", "b", "c"]}
    assert g.node("c").module_name == "lm" and g.node("c").kv_from == "a"


def test_views_with_different_engine_kinds():
    nodes = [ar("a", module="m"), GraphNode("b", inputs=["input_ids"], outputs=["token"], module="m")]
    with raises("module 'm' is viewed by nodes ['a', 'b'] with different engine kinds ['ar', 'stateless']"):
        make(nodes, ar_edges("a", "b"), {"main": Sequential("a", "b")})


def test_kv_from_unknown_node():
    with raises("node 'b' forks KV from unknown node 'ghost'"):
        make([ar("a"), ar("b", kv_from="ghost")], ar_edges("a", "b"), {"main": Sequential("a", "b")})


def test_kv_from_other_module_or_stateless():
    with raises("node 'b' can fork KV only from an AR view of the same module, not 'a'"):
        make(
            [ar("a", module="m1"), ar("b", module="m2", kv_from="a")],
            ar_edges("a", "b"),
            {"main": Sequential("a", "b")},
        )
    nodes = [GraphNode("a", inputs=["input_ids"], outputs=["token"]), ar("b", kv_from="a")]
    with raises("node 'b' can fork KV only from an AR view of the same module, not 'a'"):
        make(nodes, ar_edges("a", "b"), {"main": Sequential("a", "b")})
