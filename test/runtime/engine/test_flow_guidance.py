"""Planned flow Loops with guidance views: branches over their own KV, batched in one module call per step."""

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

VIEWS = ["main", "cfg_a", "cfg_b", "image"]
MAIN, CFG_A = [5, 17, 3, 44, 9, 61, 2], [5, 17, 3]
N = 4
SHIFTED = torch.tensor([1.0, 0.9, 0.75, 0.5, 0.2, 0.0])  # non-uniform, 5 evaluations


def close(got, ref):
    """Paged and batched vs dense: float rounding only (guidance and wrong KV move values by > 1e-2)."""
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def noise(seed: int) -> torch.Tensor:
    return torch.randn(N, 3, generator=torch.Generator().manual_seed(seed))


def stepper(lm, owners=("r",), rope=None, **cfg) -> EngineStepper:
    st = EngineStepper(lm, VIEWS, **cfg)
    for owner in owners:
        main = {"input_ids": torch.tensor(MAIN)}
        if rope is not None:
            main["rope_positions"] = torch.tensor([rope])
        st.call("main", owner, main)
        st.call("cfg_a", owner, {"input_ids": torch.tensor(CFG_A)})  # cfg_b: never prefilled (empty context)
    st.drain()
    return st


def start_flow(st, rid, x, branches=3, **inputs):
    flow_inputs = {"x": x, "n": torch.tensor(N), "branches": torch.as_tensor(branches), **inputs}
    return st.call(
        "image",
        rid,
        flow_inputs,
        kv_from="main",
        guidance=("cfg_a", "cfg_b"),
        loop_mode=LoopMode.FLOW,
        loop=LoopSpec(max_iters=99),  # ignored: the plan's timesteps decide
    )


def by_hand(lm, contexts, x, times, scale=1.5, gate=None):
    """The same flow with each branch evaluated separately (dense), then combined, step by step."""
    for i in range(times.numel() - 1):
        t = float(times[i])
        vs = [
            lm.reference_velocity(ids, pos, x, t) if gate is None or gate[i][b] else None
            for b, (ids, pos) in enumerate(contexts)
        ]
        x = x + float(times[i + 1] - times[i]) * combine(vs, scale)
    return x


CONTEXTS = [(MAIN, list(range(len(MAIN)))), (CFG_A, [0, 1, 2]), ([], [])]


@pytest.mark.parametrize("times", [DEFAULT_TIMES, SHIFTED])
def test_guided_flow_equals_evaluating_each_branch_by_hand(times):
    lm = ToyGuidedFlow()
    st = stepper(lm)
    x0 = noise(1)
    replies = start_flow(st, "r", x0, timesteps=times)
    st.drain()
    got = st.output(replies, "x")
    close(got, by_hand(lm, CONTEXTS, x0, times))
    unguided = by_hand(lm, CONTEXTS[:1], x0, times)
    assert not torch.allclose(got, unguided, atol=1e-3)  # the guidance branches did something
    assert len(lm.calls) == times.numel() - 1  # one module call per Euler step
    assert st.engine.stats()["kv_blocks_used"] == 3  # the views' own KV: every branch fork is gone


def test_two_requests_flows_and_branches_share_one_module_call_per_step():
    lm = ToyGuidedFlow()
    st = stepper(lm, owners=("r1", "r2"))
    a = start_flow(st, "r1", noise(1))
    b = start_flow(st, "r2", noise(2), scale=torch.tensor(3.0))
    st.drain()
    steps = DEFAULT_TIMES.numel() - 1
    assert len(lm.calls) == steps and all(len(call) == 6 for call in lm.calls)
    stats = st.engine.stats()
    assert (stats["flow_calls"], stats["flow_evaluations"], stats["flow_steps"]) == (steps, 6 * steps, 2 * steps)
    close(st.output(a, "x"), by_hand(lm, CONTEXTS, noise(1), DEFAULT_TIMES))
    close(st.output(b, "x"), by_hand(lm, CONTEXTS, noise(2), DEFAULT_TIMES, scale=3.0))


def test_a_tight_kv_pool_makes_flows_wait_and_gives_the_same_result():
    lm = ToyGuidedFlow()
    st = stepper(lm, owners=("r1", "r2", "r3"), num_kv_blocks=16)
    replies = [start_flow(st, f"r{i}", noise(i)) for i in (1, 2, 3)]
    st.drain()
    for i, r in zip((1, 2, 3), replies):
        close(st.output(r, "x"), by_hand(lm, CONTEXTS, noise(i), DEFAULT_TIMES))
    assert max(len(call) for call in lm.calls) < 9  # not all three flows' branches fitted at once
    assert st.engine.stats()["preemptions"] > 0


def test_gated_branches_are_skipped():
    lm = ToyGuidedFlow()
    st = stepper(lm)
    gate = torch.tensor([[1, 1, 1], [1, 0, 1], [1, 0, 0]], dtype=torch.bool)
    replies = start_flow(st, "r", noise(3), gate=gate)
    st.drain()
    assert [sorted(b for b, _ in call) for call in lm.calls] == [[0, 1, 2], [0, 2], [0]]
    close(st.output(replies, "x"), by_hand(lm, CONTEXTS, noise(3), DEFAULT_TIMES, gate=gate.tolist()))


def test_branch_rows_start_at_each_views_next_rope_position():
    rope = [0, 1, 2, 2, 2, 3, 4]  # three rows sharing one position (an image span), then on from max + 1
    lm = ToyGuidedFlow()
    st = stepper(lm, rope=rope)
    replies = start_flow(st, "r", noise(4))
    st.drain()
    assert lm.first_positions[0] == [5, 3, 0]  # main: max + 1; cfg_a: its next KV position; cfg_b: empty
    contexts = [(MAIN, rope)] + CONTEXTS[1:]
    close(st.output(replies, "x"), by_hand(lm, contexts, noise(4), DEFAULT_TIMES))


def test_a_plan_may_use_fewer_branches_than_guidance_views():
    lm = ToyGuidedFlow()
    st = stepper(lm)
    replies = start_flow(st, "r", noise(5), branches=2)
    assert ("r", "image<guidance:cfg_b>") not in st.engine.scheduler.seqs
    st.drain()
    assert all(sorted(b for b, _ in call) == [0, 1] for call in lm.calls)
    close(st.output(replies, "x"), by_hand(lm, CONTEXTS[:2], noise(5), DEFAULT_TIMES))


def test_noise_is_drawn_from_the_seeded_generator_when_x_is_not_given():
    lm = ToyGuidedFlow()
    outs = []
    for _ in range(2):
        st = stepper(lm)
        replies = st.call(
            "image",
            "r",
            {"n": torch.tensor(N), "branches": torch.tensor(1)},
            kv_from="main",
            loop_mode=LoopMode.FLOW,
            seed=7,
        )
        st.drain()
        outs.append(st.output(replies, "x"))
    assert outs[0].shape == (N, 3) and torch.equal(outs[0], outs[1])


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({"x": torch.zeros(N + 1, 3)}, "flow input 'x' (noise) has shape (5, 3), the model needs (4, 3)"),
        ({"n": torch.tensor(0)}, "state_shape=(0, 3)"),
        ({"branches": 4}, "asks for 4 branches"),
        ({"timesteps": torch.tensor([1.0])}, "timesteps (1,)"),
        ({"timesteps": torch.tensor([1.0, float("nan")])}, "NaN"),
        ({"gate": torch.tensor([[0, 1, 1]] * 3, dtype=torch.bool)}, "flow_branches failed"),
    ],
)
def test_bad_flow_calls_fail_naming_the_input_and_others_are_served(inputs, message):
    lm = ToyGuidedFlow()
    st = stepper(lm, owners=("bad", "good"))
    bad = start_flow(st, "bad", **{"x": noise(1), **inputs})
    good = start_flow(st, "good", noise(1))
    st.drain()
    assert bad[-1].final and bad[-1].error is not None and message in bad[-1].error, bad[-1].error
    close(st.output(good, "x"), by_hand(lm, CONTEXTS, noise(1), DEFAULT_TIMES))
    assert not any(s.flow for s in st.engine.scheduler.seqs.values())  # no branch left behind


def test_a_guidance_view_still_running_fails_the_flow():
    lm = ToyGuidedFlow()
    st = stepper(lm)
    st.call("cfg_a", "r", {"input_ids": torch.tensor([3, 4])})  # queued, not computed yet
    replies = start_flow(st, "r", noise(1))
    assert replies[-1].error is not None and "forks its KV from 'cfg_a', which is still running" in replies[-1].error
    assert [k for k in st.engine.scheduler.seqs if k[1].startswith("image")] == []


def test_guidance_views_through_the_conductor():
    """The graph's guidance views reach the engine with each call (the walk executor carries them)."""

    def view(name):
        return GraphNode(name, inputs=["input_ids"], outputs=[], engine="ar", module="lm")

    flow = GraphNode(
        "image",
        inputs=["x", "n", "branches"],
        outputs=["x"],
        engine="ar",
        module="lm",
        kv_from="main",
        loop_mode=LoopMode.FLOW,
        guidance=("cfg_a", "cfg_b"),
    )
    edges = [GraphEdge(f"input.{v}", f"{v}.input_ids") for v in ("main", "cfg_a", "cfg_b")] + [
        GraphEdge("input.noise", "image.x"),
        GraphEdge("input.n", "image.n"),
        GraphEdge("input.branches", "image.branches"),
        GraphEdge("image.x", "image.x"),
        GraphEdge("image.x", "output.image"),
    ]
    graph = ModelGraph(
        "guided",
        [view("main"), view("cfg_a"), view("cfg_b"), flow],
        edges,
        {"prefill": Sequential(Call("main"), Call("cfg_a")), "gen": Loop(Call("image"), max_iters=3)},
        next_walk=lambda s: {None: "prefill", "prefill": "gen"}.get(s.last_walk),
    )
    lm = ToyGuidedFlow()
    inputs = {
        "main": torch.tensor(MAIN),
        "cfg_a": torch.tensor(CFG_A),
        "cfg_b": torch.tensor([1]),  # cfg_b: never called
        "noise": noise(6),
        "n": torch.tensor(N),
        "branches": torch.tensor(3),
    }

    async def go():
        async with Conductor(graph, {"lm": lm}, config=config(dtype="float32")) as c:
            return await c.submit(Request(inputs, SamplingParams(max_tokens=1))).collect()

    out = run(go())
    close(out["image"][0], by_hand(lm, CONTEXTS, noise(6), DEFAULT_TIMES))
