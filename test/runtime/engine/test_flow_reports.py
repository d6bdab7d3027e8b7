"""A planned flow call's progress reports: the state after chosen steps as non-final outputs (x_step, step,
x_pred), the final x unchanged, and the reports streamed to the caller along a graph edge."""

from __future__ import annotations

import pytest
import torch

from mstar.conductor import Conductor, Request
from mstar.engine.messages import LoopSpec
from mstar.graph import Call, GraphEdge, GraphNode, Loop, LoopMode, ModelGraph, Sequential
from mstar.sampling_params import SamplingParams
from support.conductor_helpers import config, run
from support.engine_stepper import EngineStepper
from support.toy_guided_flow import DEFAULT_TIMES, ToyGuidedFlow, combine

MAIN, CFG_A = [5, 17, 3, 44, 9, 61, 2], [5, 17, 3]
CONTEXTS = [(MAIN, list(range(len(MAIN)))), (CFG_A, [0, 1, 2]), ([], [])]  # main, cfg_a, cfg_b (empty)
N = 4
SHIFTED = torch.tensor([1.0, 0.9, 0.75, 0.5, 0.2, 0.0])  # 5 steps


def close(got, ref):
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def noise(seed: int) -> torch.Tensor:
    return torch.randn(N, 3, generator=torch.Generator().manual_seed(seed))


def stepper(lm) -> EngineStepper:
    st = EngineStepper(lm, ["main", "cfg_a", "cfg_b", "image"])
    st.call("main", "r", {"input_ids": torch.tensor(MAIN)})
    st.call("cfg_a", "r", {"input_ids": torch.tensor(CFG_A)})
    st.drain()
    return st


def start_flow(st, rid, x, **inputs):
    flow_inputs = {"x": x, "n": torch.tensor(N), "branches": torch.tensor(3), **inputs}
    return st.call(
        "image",
        rid,
        flow_inputs,
        kv_from="main",
        guidance=("cfg_a", "cfg_b"),
        loop_mode=LoopMode.FLOW,
        loop=LoopSpec(max_iters=1),
    )


def states_by_hand(lm, x, times, scale=1.5):
    """The state after every step (S tensors), each branch evaluated densely."""
    out = []
    for i in range(times.numel() - 1):
        vs = [lm.reference_velocity(ids, pos, x, float(times[i])) for ids, pos in CONTEXTS]
        x = x + float(times[i + 1] - times[i]) * combine(vs, scale)
        out.append(x)
    return out


def reports(st, replies, port):
    return [st.store.get(r.outputs[port]) for r in replies if port in r.outputs]


def test_every_step_reports_its_state_and_the_final_x_is_unchanged():
    lm = ToyGuidedFlow()
    st = stepper(lm)
    replies = start_flow(st, "r", noise(1), timesteps=SHIFTED)
    st.drain()
    plain = st.output(replies, "x")
    assert len(replies) == 1  # no reports unless the plan asks
    st = stepper(lm)
    replies = start_flow(st, "r", noise(1), timesteps=SHIFTED, report_every=torch.tensor(1))
    st.drain()
    steps = SHIFTED.numel() - 1
    assert [r.final for r in replies] == [False] * (steps - 1) + [True]
    assert [int(st.store.get(r.outputs["step"])) for r in replies] == list(range(1, steps + 1))
    assert [r.iteration for r in replies[:-1]] == list(range(steps - 1))
    got = reports(st, replies, "x_step")
    for a, b in zip(got, states_by_hand(lm, noise(1), SHIFTED), strict=True):
        close(a, b)
    assert torch.equal(st.output(replies, "x"), plain)  # reporting changes nothing
    assert torch.equal(got[-1], st.output(replies, "x"))
    assert not reports(st, replies, "x_pred")  # no prediction asked for


def test_report_every_k_steps_and_predictions_on_chosen_steps():
    lm = ToyGuidedFlow()
    st = stepper(lm)
    replies = start_flow(
        st, "r", noise(2), timesteps=SHIFTED, report_every=torch.tensor(2), predict_steps=torch.tensor([1, 3])
    )
    st.drain()
    assert [int(st.store.get(r.outputs["step"])) for r in replies] == [1, 2, 3, 4, 5]  # 2, 4, the last; 1, 3
    assert [("x_pred" in r.outputs) for r in replies] == [True, False, True, False, False]
    by_hand = states_by_hand(lm, noise(2), SHIFTED)
    for r in replies:
        close(st.store.get(r.outputs["x_step"]), by_hand[int(st.store.get(r.outputs["step"])) - 1])
    # the prediction: one Euler step from the state after step k to t_S with that step's velocity
    x = [noise(2), *by_hand]
    t = SHIFTED.tolist()
    for k, r in ((1, replies[0]), (3, replies[2])):
        v = (x[k] - x[k - 1]) / (t[k] - t[k - 1])
        close(st.store.get(r.outputs["x_pred"]), x[k] + (t[-1] - t[k]) * v)


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({"report_every": torch.tensor(-1)}, "report_every=-1"),
        ({"predict_steps": torch.tensor([0])}, "predict_steps=(0,)"),
        ({"predict_steps": torch.tensor([4])}, "each must be a step in 1..3"),
    ],
)
def test_bad_report_plans_fail_naming_the_field(inputs, message):
    lm = ToyGuidedFlow()
    st = stepper(lm)
    replies = start_flow(st, "r", noise(1), **inputs)
    st.drain()
    assert replies[-1].final and replies[-1].error is not None and message in replies[-1].error, replies[-1].error


def test_reports_stream_to_the_caller_along_a_graph_edge_while_the_flow_runs():
    def view(name):
        return GraphNode(name, inputs=["input_ids"], outputs=[], engine="ar", module="lm")

    flow = GraphNode(
        "image",
        inputs=["x", "n", "branches", "report_every"],
        outputs=["x", "x_step", "step"],
        engine="ar",
        module="lm",
        kv_from="main",
        loop_mode=LoopMode.FLOW,
        guidance=("cfg_a", "cfg_b"),
    )
    edges = [GraphEdge(f"input.{v}", f"{v}.input_ids") for v in ("main", "cfg_a", "cfg_b")] + [
        *(GraphEdge(f"input.{p}", f"image.{p}") for p in ("n", "branches", "report_every")),
        GraphEdge("input.noise", "image.x"),
        GraphEdge("image.x", "image.x"),
        GraphEdge("image.x", "output.image"),
        GraphEdge("image.x_step", "output.x_step"),
        GraphEdge("image.step", "output.step"),
    ]
    graph = ModelGraph(
        "reporting",
        [view("main"), view("cfg_a"), view("cfg_b"), flow],
        edges,
        {"prefill": Sequential(Call("main"), Call("cfg_a")), "gen": Loop(Call("image"), max_iters=1)},
        next_walk=lambda s: {None: "prefill", "prefill": "gen"}.get(s.last_walk),
    )
    lm = ToyGuidedFlow()
    inputs = {
        "main": torch.tensor(MAIN),
        "cfg_a": torch.tensor(CFG_A),
        "cfg_b": torch.tensor([1]),
        "noise": noise(6),
        "n": torch.tensor(N),
        "branches": torch.tensor(3),
        "report_every": torch.tensor(1),
    }

    async def go():
        seen = []
        async with Conductor(graph, {"lm": lm}, config=config(dtype="float32")) as c:
            async for item in c.submit(Request(inputs, SamplingParams(max_tokens=1))):
                seen.append((item.name, item.data))
        return seen

    seen = run(go())
    steps = DEFAULT_TIMES.numel() - 1
    assert [name for name, _ in seen if name != "step"] == ["x_step"] * steps + ["image"]
    assert [int(v) for name, v in seen if name == "step"] == list(range(1, steps + 1))
    states = [v for name, v in seen if name == "x_step"]
    for a, b in zip(states, states_by_hand(lm, noise(6), DEFAULT_TIMES), strict=True):
        close(a, b)
    assert torch.equal(states[-1], seen[-1][1])
