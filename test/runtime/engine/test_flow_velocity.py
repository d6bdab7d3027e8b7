"""Velocity calls (LoopMode.VELOCITY): one flow evaluation over one view's KV, and a Walk-driven guided flow
built from them that equals the engine-resident one."""

from __future__ import annotations

import pytest
import torch

from mstar.conductor import Conductor, Request
from mstar.graph import Call, GraphEdge, GraphNode, Loop, LoopMode, ModelGraph, Parallel, Sequential
from mstar.graph.node import NodeSubmodule
from mstar.sampling_params import SamplingParams
from support.conductor_helpers import config, run
from support.engine_stepper import EngineStepper
from support.toy_flow import ToyFlowLM
from support.toy_guided_flow import DEFAULT_TIMES, ToyGuidedFlow, combine

VIEWS = ["main", "cfg_a", "cfg_b", "image", "v_main", "v_a", "v_b"]
MAIN, CFG_A = [5, 17, 3, 44, 9, 61, 2], [5, 17, 3]
CONTEXTS = {"main": (MAIN, list(range(len(MAIN)))), "cfg_a": (CFG_A, [0, 1, 2]), "cfg_b": ([], [])}
N = 4


def noise(seed: int) -> torch.Tensor:
    return torch.randn(N, 3, generator=torch.Generator().manual_seed(seed))


def stepper(lm) -> EngineStepper:
    st = EngineStepper(lm, VIEWS)
    st.call("main", "r", {"input_ids": torch.tensor(MAIN)})
    st.call("cfg_a", "r", {"input_ids": torch.tensor(CFG_A)})  # cfg_b: never prefilled (an empty context)
    st.drain()
    return st


def velocity(st, node: str, view: str, x: torch.Tensor, step: int | None = None, **extra):
    inputs = {"x": x, "n": torch.tensor(N), "branches": torch.tensor(3), **extra}
    if step is not None:
        inputs["step"] = torch.as_tensor(step)
    return st.call(node, "r", inputs, kv_from=view, loop_mode=LoopMode.VELOCITY)


@pytest.mark.parametrize("view", ["main", "cfg_a", "cfg_b"])
def test_a_velocity_call_evaluates_its_view_at_the_plans_step_and_keeps_nothing(view):
    lm = ToyGuidedFlow()
    st = stepper(lm)
    x = noise(1)
    for step in (0, 2):
        got = st.output(_drained(st, velocity(st, "v_main", view, x, step)), "v")
        torch.testing.assert_close(got, lm.reference_velocity(*CONTEXTS[view], x, float(DEFAULT_TIMES[step])))
    assert [e for call in lm.calls for e in call] == [(0, 0), (0, 2)]  # branch 0, the step asked for
    assert st.engine.stats()["kv_blocks_used"] == 3 and st.engine.stats()["flow_velocity_calls"] == 2
    assert not any(s.flow for s in st.engine.scheduler.seqs.values())


def test_velocity_calls_of_several_views_share_one_module_call_and_drive_the_guided_flow():
    """Per step: the three views' velocities (one module call), the combine and the Euler step by hand;
    the result equals the engine-resident guided flow's."""
    lm = ToyGuidedFlow()
    st = stepper(lm)
    x = x0 = noise(2)
    for step in range(DEFAULT_TIMES.numel() - 1):
        replies = [
            velocity(st, f"v_{n}", view, x, step) for n, view in (("main", "main"), ("a", "cfg_a"), ("b", "cfg_b"))
        ]
        st.drain()
        vs = [st.output(r, "v") for r in replies]
        x = x + float(DEFAULT_TIMES[step + 1] - DEFAULT_TIMES[step]) * combine(vs, 1.5)
    assert len(lm.calls) == DEFAULT_TIMES.numel() - 1 and all(len(call) == 3 for call in lm.calls)
    flow = st.call(
        "image",
        "r",
        {"x": x0, "n": torch.tensor(N), "branches": torch.tensor(3)},
        kv_from="main",
        guidance=("cfg_a", "cfg_b"),
        loop_mode=LoopMode.FLOW,
    )
    st.drain()
    torch.testing.assert_close(x, st.output(flow, "x"), atol=1e-6, rtol=1e-6)


def _drained(st, replies):
    st.drain()
    return replies


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"step": torch.tensor(3)}, "velocity input 'step' is 3; the plan has steps 0..2"),
        ({"step": torch.tensor(0.5)}, "velocity input 'step' must be one integer"),
        ({"n": torch.tensor(0)}, "state_shape=(0, 3)"),
    ],
)
def test_bad_velocity_calls_fail_naming_the_input(extra, message):
    lm = ToyGuidedFlow()
    st = stepper(lm)
    replies = _drained(st, velocity(st, "v_main", "main", noise(1), **extra))
    assert replies[-1].final and replies[-1].error is not None and message in replies[-1].error, replies[-1].error
    assert not any(s.flow for s in st.engine.scheduler.seqs.values())


def test_a_velocity_call_needs_x_and_a_planned_module():
    st = stepper(ToyGuidedFlow())
    replies = st.call(
        "v_main", "r", {"n": torch.tensor(N), "branches": torch.tensor(1)}, kv_from="main", loop_mode="velocity"
    )
    assert "input 'x' (the state to evaluate at) is missing" in replies[-1].error
    plain = EngineStepper(ToyFlowLM(), ["p", "v"])  # the fixed contract: no flow_plan
    replies = plain.call("v", "r", {"x": noise(1)}, kv_from="p", loop_mode=LoopMode.VELOCITY)
    assert "has no flow_plan" in replies[-1].error


def test_a_velocity_node_declares_x_in_and_v_out():
    with pytest.raises(
        ValueError, match="a velocity node is an AR view with kv_from set, an input 'x' and an output 'v'"
    ):
        GraphNode("v", inputs=["x"], outputs=["x"], engine="ar", module="lm", kv_from="p", loop_mode="velocity")


class ToyStep(NodeSubmodule):
    """The toy guided flow's combine + Euler step as a stateless node: x, step, v_* -> x, step."""

    def forward(self, x, step, v_main, v_a, v_b):  # type: ignore[override]
        out_x, out_step = [], []
        for i in range(x.shape[0]):
            s = int(step[i])
            v = combine([v_main[i], v_a[i], v_b[i]], 1.5)
            out_x.append(x[i] + float(DEFAULT_TIMES[s + 1] - DEFAULT_TIMES[s]) * v)
            out_step.append(torch.tensor(s + 1))
        return {"x": torch.stack(out_x), "step": torch.stack(out_step)}


def test_a_walk_of_velocity_calls_and_a_step_node_equals_the_engine_resident_guided_flow():
    def view(name):
        return GraphNode(name, inputs=["input_ids"], outputs=[], engine="ar", module="lm")

    def vnode(name, source):
        return GraphNode(
            name, ["x", "step", "n", "branches"], ["v"], engine="ar", module="lm", kv_from=source, loop_mode="velocity"
        )

    flow = GraphNode(
        "image", ["x", "n", "branches"], ["x"], engine="ar", module="lm", kv_from="main", loop_mode=LoopMode.FLOW,
        guidance=("cfg_a", "cfg_b"),
    )  # fmt: skip
    stepped = ["v_main", "v_a", "v_b", "step"]
    edges = [GraphEdge(f"input.{v}", f"{v}.input_ids") for v in ("main", "cfg_a", "cfg_b")] + [
        *(GraphEdge(f"input.{p}", f"{n}.{p}") for n in stepped[:3] + ["image"] for p in ("n", "branches")),
        *(GraphEdge(f"input.{p}", f"{n}.{p}") for n in stepped for p in ("x", "step")),
        *(GraphEdge(f"step.{p}", f"{n}.{p}") for n in stepped for p in ("x", "step")),
        *(GraphEdge(f"{n}.v", f"step.{n}") for n in stepped[:3]),
        GraphEdge("input.x", "image.x"),
        GraphEdge("image.x", "image.x"),
        GraphEdge("image.x", "output.resident"),
        GraphEdge("step.x", "output.walked"),
    ]
    steps = DEFAULT_TIMES.numel() - 1
    graph = ModelGraph(
        "walked",
        [view("main"), view("cfg_a"), view("cfg_b"), flow, *(vnode(f"v_{n}", s) for n, s in
         (("main", "main"), ("a", "cfg_a"), ("b", "cfg_b"))),
         GraphNode("step", ["x", "step", "v_main", "v_a", "v_b"], ["x", "step"])],
        edges,
        {
            "prefill": Sequential(Call("main"), Call("cfg_a")),
            "walked": Loop(Sequential(Parallel(Call("v_main"), Call("v_a"), Call("v_b")), Call("step")), steps),
            "resident": Loop(Call("image"), max_iters=1),
        },
        next_walk=lambda s: {None: "prefill", "prefill": "walked", "walked": "resident"}.get(s.last_walk),
    )  # fmt: skip
    lm = ToyGuidedFlow()
    inputs = {"main": torch.tensor(MAIN), "cfg_a": torch.tensor(CFG_A), "cfg_b": torch.tensor([1]),  # cfg_b: never called
              "x": noise(6), "step": torch.tensor(0),
              "n": torch.tensor(N), "branches": torch.tensor(3)}  # fmt: skip

    async def go():
        async with Conductor(graph, {"lm": lm, "step": ToyStep()}, config=config(dtype="float32")) as c:
            return await c.submit(Request(inputs, SamplingParams(max_tokens=1))).collect()

    out = run(go())
    assert len(out["walked"]) == steps
    torch.testing.assert_close(out["walked"][-1], out["resident"][0], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(out["walked"][-1], noise(6), atol=1e-2)
