"""Walks run end to end through the Conductor (real engines, in process): Sequential, Parallel,
conductor-driven Loops and their stops, DynamicLoop, next_walk, and AR views of one module."""

import asyncio

import pytest
import torch

from mstar.conductor import Conductor, Request, RequestError
from mstar.engine.config import EngineConfig
from mstar.graph import (
    Call,
    DynamicLoop,
    GraphEdge,
    GraphNode,
    Loop,
    ModelGraph,
    Parallel,
    Sequential,
    StopOnValues,
    StopWhen,
)
from mstar.sampling_params import SamplingParams
from support.toy_models import Add, AddOne, CountingScale, Scale, ToyLM

CONFIG = EngineConfig(num_kv_blocks=64, block_size=4)


def one_walk(name, nodes, edges, walk):
    """A graph that runs ``walk`` once per request."""
    return ModelGraph(
        name=name, nodes=nodes, edges=edges, walks={"main": walk}, next_walk=lambda s: None if s.last_walk else "main"
    )


def stateless(name, inputs=("x",), outputs=("y",)):
    return GraphNode(name, inputs=list(inputs), outputs=list(outputs))


async def run_requests(graph, modules, requests, config=CONFIG):
    async with Conductor(graph, modules, config=config) as c:
        streams = [c.submit(r) for r in requests]
        outs = await asyncio.gather(*(s.collect() for s in streams))
        await c.wait_idle()
        return outs


def run(graph, modules, *requests, config=CONFIG):
    return asyncio.run(run_requests(graph, modules, list(requests), config))


def req(**inputs):
    meta = inputs.pop("meta", {})
    sampling = inputs.pop("sampling", SamplingParams())
    return Request({k: torch.as_tensor(v) for k, v in inputs.items()}, sampling=sampling, meta=meta)


def values(tensors):
    return [t.tolist() for t in tensors]


# -- Sequential / Parallel -------------------------------------------------------------------
def test_sequential_scale_then_scale():
    g = one_walk(
        "seq",
        [stateless("s1"), stateless("s2")],
        [GraphEdge("input.x", "s1.x"), GraphEdge("s1.y", "s2.x"), GraphEdge("s2.y", "output.y")],
        Sequential("s1", "s2"),
    )
    xs = [[1.0, 2.0, 3.0], [-1.0, 0.5, 10.0], [7.0, 0.0, 1.0]]
    outs = run(g, {"s1": Scale(2.0), "s2": Scale(2.0)}, *(req(x=x) for x in xs))
    for x, out in zip(xs, outs):  # concurrent requests may be batched together; each gets its own rows
        assert list(out) == ["y"]
        assert values(out["y"]) == [[v * 4 for v in x]]


def test_sequential_order_matters():
    """s1 (x+1) then s2 (*3) differs from the reverse: the walk, not the edge list, orders the calls."""
    g = one_walk(
        "order",
        [stateless("inc"), stateless("tri")],
        [
            GraphEdge("input.x", "inc.x"),
            GraphEdge("inc.y", "tri.x"),
            GraphEdge("tri.y", "output.y"),
            GraphEdge("inc.y", "output.mid"),
        ],
        Sequential("inc", "tri"),
    )
    (out,) = run(g, {"inc": AddOne(), "tri": Scale(3.0)}, req(x=torch.tensor([2.0])))
    assert values(out["mid"]) == [[3.0]] and values(out["y"]) == [[9.0]]


def test_parallel_branches_both_reach_outputs_and_join():
    nodes = [stateless("a"), stateless("b"), stateless("join", inputs=("a", "b"))]
    edges = [
        GraphEdge("input.x", "a.x"),
        GraphEdge("input.x", "b.x"),
        GraphEdge("a.y", "output.a"),
        GraphEdge("b.y", "output.b"),
        GraphEdge("a.y", "join.a"),
        GraphEdge("b.y", "join.b"),
        GraphEdge("join.y", "output.sum"),
    ]
    g = one_walk("par", nodes, edges, Sequential(Parallel("a", "b"), "join"))
    (out,) = run(g, {"a": Scale(2.0), "b": Scale(3.0), "join": Add()}, req(x=[1.0, -2.0]))
    assert sorted(out) == ["a", "b", "sum"]
    assert values(out["a"]) == [[2.0, -4.0]]
    assert values(out["b"]) == [[3.0, -6.0]]
    assert values(out["sum"]) == [[5.0, -10.0]]


def test_parallel_of_sequences():
    nodes = [stateless(n) for n in ("a1", "a2", "b1", "b2")]
    edges = [
        GraphEdge("input.x", "a1.x"),
        GraphEdge("a1.y", "a2.x"),
        GraphEdge("a2.y", "output.a"),
        GraphEdge("input.x", "b1.x"),
        GraphEdge("b1.y", "b2.x"),
        GraphEdge("b2.y", "output.b"),
    ]
    g = one_walk("par2", nodes, edges, Parallel(Sequential("a1", "a2"), Sequential("b1", "b2")))
    mods = {"a1": Scale(2.0), "a2": Scale(5.0), "b1": Scale(3.0), "b2": AddOne()}
    (out,) = run(g, mods, req(x=[1.0]))
    assert values(out["a"]) == [[10.0]] and values(out["b"]) == [[4.0]]


# -- conductor-driven loops -------------------------------------------------------------------
def self_loop_graph(walk, name="loop"):
    """A stateless node fed by its own output: input.x -> s.x, s.y -> s.x, s.y -> output.y."""
    return one_walk(
        name,
        [stateless("s")],
        [GraphEdge("input.x", "s.x"), GraphEdge("s.y", "s.x"), GraphEdge("s.y", "output.y")],
        walk,
    )


def test_loop_max_iters():
    g = self_loop_graph(Loop("s", max_iters=5))
    (out,) = run(g, {"s": Scale(3.0)}, req(x=[1.0, 2.0]))
    assert values(out["y"]) == [[3.0**k, 2 * 3.0**k] for k in range(1, 6)]
    assert values(out["y"])[-1] == [3.0**5, 2 * 3.0**5]


def test_loop_stop_when():
    seen = []

    def big(state):
        seen.append(float(state.value("s.y")[0]))
        return seen[-1] > 50

    g = self_loop_graph(Loop("s", max_iters=100, stop=StopWhen(big, name="big")))
    (out,) = run(g, {"s": Scale(2.0)}, req(x=[1.0]))
    # checked after each iteration; the value that trips the predicate was produced and emitted
    assert values(out["y"]) == [[2.0], [4.0], [8.0], [16.0], [32.0], [64.0]]
    assert seen == [2.0, 4.0, 8.0, 16.0, 32.0, 64.0]


def test_loop_max_iters_caps_a_stop_that_never_fires():
    g = self_loop_graph(Loop("s", max_iters=4, stop=StopWhen(lambda s: False)))
    (out,) = run(g, {"s": Scale(2.0)}, req(x=[1.0]))
    assert values(out["y"]) == [[2.0], [4.0], [8.0], [16.0]]


def test_loop_stop_on_values_does_not_emit_the_stop_value():
    g = self_loop_graph(Loop("s", max_iters=10, stop=StopOnValues("s.y", (5, 9))))
    (out,) = run(g, {"s": AddOne()}, req(x=torch.tensor([1])))
    assert values(out["y"]) == [[2], [3], [4]]
    (out,) = run(g, {"s": AddOne()}, req(x=torch.tensor([5])))  # 6, 7, 8, then 9 stops
    assert values(out["y"]) == [[6], [7], [8]]
    (out,) = run(g, {"s": AddOne()}, req(x=torch.tensor([20])))  # never stops: max_iters
    assert values(out["y"]) == [[v] for v in range(21, 31)]


def test_loop_stop_on_values_ends_a_multi_node_body():
    """Loop(Sequential(inc, dbl)) stopping on inc's output: the stop value is not passed on,
    and the rest of that iteration's body must not run on a missing (or stale) input."""
    nodes = [stateless("inc"), stateless("dbl")]
    edges = [
        GraphEdge("input.x", "inc.x"),
        GraphEdge("inc.y", "dbl.x"),
        GraphEdge("dbl.y", "inc.x"),
        GraphEdge("inc.y", "output.inc"),
        GraphEdge("dbl.y", "output.dbl"),
    ]
    g = one_walk(
        "stop_mid", nodes, edges, Loop(Sequential("inc", "dbl"), max_iters=10, stop=StopOnValues("inc.y", (7,)))
    )
    # x=0: inc 1, dbl 2, inc 3, dbl 6, inc 7 -> stop
    (out,) = run(g, {"inc": AddOne(), "dbl": Scale(2.0)}, req(x=torch.tensor([0])))
    assert values(out["inc"]) == [[1], [3]]
    assert values(out["dbl"]) == [[2.0], [6.0]]


def test_outer_stop_on_values_ends_an_inner_loop():
    """An outer Loop's StopOnValues firing inside an inner Loop ends both loops."""
    g = self_loop_graph(Loop(Loop("s", max_iters=3), max_iters=5, stop=StopOnValues("s.y", (5,))), name="nested")
    # x=0: inner 1, 2, 3; inner 4, then 5 stops (not emitted)
    (out,) = run(g, {"s": AddOne()}, req(x=torch.tensor([0])))
    assert values(out["y"]) == [[1], [2], [3], [4]]
    # without a stop hit the nest runs 5 x 3 times
    (out,) = run(g, {"s": AddOne()}, req(x=torch.tensor([10])))
    assert values(out["y"]) == [[v] for v in range(11, 26)]


@pytest.mark.parametrize("trips", [0, 1, 3])
def test_dynamic_loop_trip_count_from_meta(trips):
    nodes = [stateless("s"), stateless("tail")]
    edges = [
        GraphEdge("input.x", "s.x"),
        GraphEdge("s.y", "s.x"),
        GraphEdge("s.y", "output.y"),
        GraphEdge("input.x", "tail.x"),
        GraphEdge("tail.y", "output.tail"),
    ]
    walk = Sequential(DynamicLoop("s", trip_count=lambda st: st.request.meta["trips"]), "tail")
    g = one_walk("dyn", nodes, edges, walk)
    (out,) = run(g, {"s": Scale(2.0), "tail": Scale(10.0)}, req(x=[1.0], meta={"trips": trips}))
    assert values(out.get("y", [])) == [[2.0**k] for k in range(1, trips + 1)]
    assert values(out["tail"]) == [[10.0]]  # the walk goes on after the loop, even after zero trips


def test_dynamic_loop_negative_trip_count_fails_the_request():
    g = self_loop_graph(DynamicLoop("s", trip_count=lambda st: -1))

    async def go():
        async with Conductor(g, {"s": Scale(2.0)}, config=CONFIG) as c:
            stream = c.submit(req(x=[1.0]))
            with pytest.raises(RequestError, match="trip count must be >= 0, got -1"):
                await stream.collect()
            await c.wait_idle()

    asyncio.run(go())


# -- next_walk -----------------------------------------------------------------------------
def task_graph():
    """'understand': enc -> head; 'generate': gen; 'both': understand then generate."""
    nodes = [stateless("enc"), stateless("head"), stateless("gen")]
    edges = [
        GraphEdge("input.x", "enc.x"),
        GraphEdge("enc.y", "head.x"),
        GraphEdge("head.y", "output.label"),
        GraphEdge("input.x", "gen.x"),
        GraphEdge("gen.y", "output.audio"),
    ]
    plans = {
        "understand": ["understand"],
        "generate": ["generate"],
        "both": ["understand", "generate"],
        "bogus": ["nowhere"],
    }

    def next_walk(state):
        plan = plans[state.request.meta["task"]]
        done = len(state.walks_done)
        return plan[done] if done < len(plan) else None

    return ModelGraph(
        name="tasks",
        nodes=nodes,
        edges=edges,
        walks={"understand": Sequential("enc", "head"), "generate": Call("gen")},
        next_walk=next_walk,
    )


def test_next_walk_chooses_walks_per_request():
    mods = {"enc": CountingScale(3.0), "head": CountingScale(5.0), "gen": CountingScale(7.0)}
    g = task_graph()

    async def go():
        async with Conductor(g, mods, config=CONFIG) as c:
            out = await c.submit(req(x=[1.0], meta={"task": "understand"})).collect()
            assert sorted(out) == ["label"] and values(out["label"]) == [[15.0]]
            assert (mods["enc"].calls, mods["head"].calls, mods["gen"].calls) == (1, 1, 0)

            out = await c.submit(req(x=[2.0], meta={"task": "generate"})).collect()
            assert sorted(out) == ["audio"] and values(out["audio"]) == [[14.0]]
            assert (mods["enc"].calls, mods["head"].calls, mods["gen"].calls) == (1, 1, 1)

            out = await c.submit(req(x=[1.0], meta={"task": "both"})).collect()
            assert values(out["label"]) == [[15.0]] and values(out["audio"]) == [[7.0]]
            assert (mods["enc"].calls, mods["head"].calls, mods["gen"].calls) == (2, 2, 2)

            # concurrent requests with different plans
            outs = await asyncio.gather(
                *(
                    c.submit(req(x=[float(i)], meta={"task": t})).collect()
                    for i, t in enumerate(["generate", "understand", "generate"])
                )
            )
            assert [sorted(o) for o in outs] == [["audio"], ["label"], ["audio"]]
            assert [values(next(iter(o.values()))) for o in outs] == [[[0.0]], [[15.0]], [[14.0]]]
            assert (mods["enc"].calls, mods["head"].calls, mods["gen"].calls) == (3, 3, 4)
            await c.wait_idle()

    asyncio.run(go())


def test_next_walk_naming_unknown_walk_fails_the_request():
    g = task_graph()

    async def go():
        async with Conductor(g, {"enc": Scale(), "head": Scale(), "gen": Scale()}, config=CONFIG) as c:
            with pytest.raises(RequestError, match="has no walk 'nowhere'"):
                await c.submit(req(x=[1.0], meta={"task": "bogus"})).collect()
            await c.wait_idle()

    asyncio.run(go())


def test_walks_done_is_visible_to_next_walk():
    seen = []
    nodes = [stateless("s")]
    edges = [GraphEdge("input.x", "s.x"), GraphEdge("s.y", "s.x"), GraphEdge("s.y", "output.y")]

    def next_walk(state):
        seen.append(list(state.walks_done))
        return "step" if len(state.walks_done) < 3 else None

    g = ModelGraph(name="multi", nodes=nodes, edges=edges, walks={"step": Loop("s", max_iters=1)}, next_walk=next_walk)
    (out,) = run(g, {"s": Scale(2.0)}, req(x=[1.0]))
    assert seen == [[], ["step"], ["step", "step"], ["step", "step", "step"]]
    assert values(out["y"]) == [[2.0], [4.0], [8.0]]  # edge values carry over between walks


# -- AR views of one module -------------------------------------------------------------------
def ar_view(name, **kw):
    return GraphNode(name, inputs=["input_ids"], outputs=["token"], engine="ar", module="lm", **kw)


def view_edges(name, prompt):
    return [
        GraphEdge(f"input.{prompt}", f"{name}.input_ids"),
        GraphEdge(f"{name}.token", f"{name}.input_ids"),
        GraphEdge(f"{name}.token", f"output.{name}"),
    ]


def tokens(ts):
    return [int(t) for t in ts]


PA, PB = [1, 2, 3, 4, 5, 6], [40, 41, 42]


def test_views_interleaved_conductor_loop_keep_separate_kv():
    """One request decodes two prompts on two views of one ToyLM, alternating a, b, a, b, ..."""
    lm, n = ToyLM(), 8
    g = one_walk(
        "views",
        [ar_view("a"), ar_view("b")],
        view_edges("a", "pa") + view_edges("b", "pb"),
        Loop(Sequential("a", "b"), max_iters=n),
    )
    (out,) = run(g, {"lm": lm}, req(pa=PA, pb=PB))
    ref_a, ref_b = lm.reference_greedy(PA, n), lm.reference_greedy(PB, n)
    assert ref_a != ref_b
    assert tokens(out["a"]) == ref_a
    assert tokens(out["b"]) == ref_b


def test_views_parallel_engine_resident_loops():
    lm, n = ToyLM(), 10
    walk = Parallel(Sequential("a", Loop("a", max_iters=n - 1)), Sequential("b", Loop("b", max_iters=n - 1)))
    g = one_walk("views_par", [ar_view("a"), ar_view("b")], view_edges("a", "pa") + view_edges("b", "pb"), walk)
    (out,) = run(g, {"lm": lm}, req(pa=PA, pb=PB))
    assert tokens(out["a"]) == lm.reference_greedy(PA, n)
    assert tokens(out["b"]) == lm.reference_greedy(PB, n)


def test_ar_conductor_loop_with_stop_when_matches_reference():
    """StopWhen keeps an AR self-loop on the conductor (one call per token); tokens stay exact."""
    lm = ToyLM()
    nodes = [GraphNode("llm", inputs=["input_ids"], outputs=["token"], engine="ar")]
    edges = [
        GraphEdge("input.prompt", "llm.input_ids"),
        GraphEdge("llm.token", "llm.input_ids"),
        GraphEdge("llm.token", "output.token"),
    ]
    walk = Sequential("llm", Loop("llm", max_iters=50, stop=StopWhen(lambda s: s.output_counts["token"] >= 7)))
    g = one_walk("ar_stop_when", nodes, edges, walk)
    (out,) = run(g, {"llm": lm}, req(prompt=PA))
    assert tokens(out["token"]) == lm.reference_greedy(PA, 7)


def test_kv_from_view_continues_another_views_prompt():
    """c forks a's KV after a's prompt, then reads a continuation: its decode equals the reference
    for prompt + continuation. a goes on decoding afterwards: c's writes (into the shared, partly
    filled last block) must not leak into a. Every KV block is free after the request."""
    lm, n_c, n_a = ToyLM(), 6, 5
    cont = [70, 71, 72]
    nodes = [ar_view("a"), ar_view("c", kv_from="a")]
    edges = view_edges("a", "prompt") + view_edges("c", "cont")
    walk = Sequential("a", "c", Loop("c", max_iters=n_c - 1), Loop("a", max_iters=n_a))
    g = one_walk("kv_from", nodes, edges, walk)

    async def go():
        async with Conductor(g, {"lm": lm}, config=EngineConfig(num_kv_blocks=16, block_size=4)) as c:
            out = await c.submit(req(prompt=PA, cont=cont)).collect()
            await c.wait_idle()
            assert c.kv_blocks_used() == 0
            return out

    out = asyncio.run(go())
    assert len(PA) % 4 != 0  # the fork shares a partly filled block
    assert tokens(out["c"]) == lm.reference_greedy(PA + cont, n_c)
    assert tokens(out["a"]) == lm.reference_greedy(PA, 1 + n_a)
    assert lm.reference_greedy(PA + cont, n_c) != lm.reference_greedy(cont, n_c)  # the fork mattered


def test_request_meta_kv_from_forks_a_view_per_request():
    """Meta ``"c.kv_from": "a"`` makes c (no kv_from in the graph) continue a's prompt for that request
    only; a request without it starts c from its own prompt; a bad view name fails the request."""
    lm, n = ToyLM(), 4
    cont = [70, 71, 72]
    nodes = [ar_view("a"), ar_view("c")]
    edges = view_edges("a", "prompt") + view_edges("c", "cont")
    walk = Sequential("a", "c", Loop("c", max_iters=n - 1), Loop("a", max_iters=1))
    g = one_walk("meta_kv_from", nodes, edges, walk)
    forked, alone = run(g, {"lm": lm}, req(prompt=PA, cont=cont, meta={"c.kv_from": "a"}), req(prompt=PA, cont=cont))
    assert tokens(forked["c"]) == lm.reference_greedy(PA + cont, n)
    assert tokens(alone["c"]) == lm.reference_greedy(cont, n)
    with pytest.raises(RequestError, match="'c.kv_from' = 'nope' must name another AR view"):
        run(g, {"lm": lm}, req(prompt=PA, cont=cont, meta={"c.kv_from": "nope"}))
