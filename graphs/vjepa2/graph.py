"""The V-JEPA 2-AC Walk Graph: an encoder, a persistent frame context, rollouts over it, CEM.

    input.frames -> encoder --latents--> output.latents         (walk ``encode``)
                           \\-> context <- input.states, input.actions  (walk ``observe``: the
    input.latents -------------------^     session's frames, computed once, kept across messages;
                                 :         walk ``extend`` takes frames encoded already)
                                 :   KV forked copy-on-write, per sample
    input.actions -> rollout (frame Loop, H steps) -> output.frame / output.frames   (walk ``rollout``)

    plan: Loop(iterations) of  sample -> rollout (H steps, S samples) -> energy -> refit
          mean/std go round the Loop; refit.plan -> output.plan, energy.energies -> output.energies

Walks ``encode``, ``observe``, ``extend``, ``rollout``, ``plan``: a request names one in ``meta["walk"]``
(or it follows from its inputs). ``meta["iterations"]`` sets a plan's CEM iterations.
"""

from __future__ import annotations

from mstar.graph import Call, GraphEdge, GraphNode, LoopMode, ModelGraph, Sequential
from mstar.graph.walks import DynamicLoop

WALKS = ("encode", "observe", "extend", "rollout", "plan")


def choose_walk(inputs, meta) -> str:
    walk = meta.get("walk")
    if walk is not None:
        if walk not in WALKS:
            raise ValueError(f"V-JEPA 2-AC: unknown walk {walk!r} (walks: {', '.join(WALKS)})")
        return walk
    if "goal" in inputs:
        return "plan"
    if "frames" in inputs:
        return "observe" if "states" in inputs else "encode"
    if "latents" in inputs:
        return "extend"
    return "rollout"


def next_walk(state) -> str | None:
    if state.last_walk is not None:
        return None
    return choose_walk(state.request.inputs, state.request.meta)


def horizon(state) -> int:
    """Rollout steps: the actions' horizon (walk rollout) or the belief's (walk plan)."""
    inputs = state.request.inputs
    if "mean" in inputs:
        return int(inputs["mean"].shape[0])
    actions = inputs.get("actions")
    if actions is None or actions.dim() < 2:
        raise ValueError("a rollout needs 'actions' [horizon, 7] or [samples, horizon, 7]")
    return int(actions.shape[-2])


def iterations(state) -> int:
    return int(state.request.meta.get("iterations", 10))


def vjepa2_graph() -> ModelGraph:
    rollout_loop = DynamicLoop(Call("rollout"), trip_count=horizon)
    return ModelGraph(
        name="vjepa2_ac",
        nodes=[
            GraphNode("encoder", inputs=["frames"], outputs=["latents"]),
            GraphNode(
                "context",
                inputs=["latents", "states", "actions"],
                outputs=[],
                engine="ar",
                module="predictor",
                loop_mode=LoopMode.FRAMES,
            ),
            GraphNode(
                "rollout",
                inputs=["actions", "frame", "state"],
                outputs=["frame", "frames"],
                engine="ar",
                module="predictor",
                loop_mode=LoopMode.FRAMES,
                kv_from="context",
                optional_inputs=("frame", "state"),
            ),
            GraphNode("sample", inputs=["mean", "std", "params"], outputs=["actions"], module="cem_sample"),
            GraphNode("energy", inputs=["frame", "goal"], outputs=["energies"], module="cem_energy"),
            GraphNode(
                "refit",
                inputs=["actions", "energies", "mean", "std", "params"],
                outputs=["mean", "std", "plan"],
                module="cem_refit",
            ),
        ],
        edges=[
            GraphEdge("input.frames", "encoder.frames"),
            GraphEdge("encoder.latents", "output.latents"),
            GraphEdge("encoder.latents", "context.latents"),
            GraphEdge("input.latents", "context.latents"),
            GraphEdge("input.states", "context.states"),
            GraphEdge("input.actions", "context.actions"),
            GraphEdge("input.actions", "rollout.actions"),
            GraphEdge("input.frame", "rollout.frame"),
            GraphEdge("input.state", "rollout.state"),
            GraphEdge("rollout.frame", "output.frame"),
            GraphEdge("rollout.frames", "output.frames"),
            # CEM: the belief goes round the Loop
            GraphEdge("input.mean", "sample.mean"),
            GraphEdge("input.std", "sample.std"),
            GraphEdge("input.params", "sample.params"),
            GraphEdge("sample.actions", "rollout.actions"),
            GraphEdge("sample.actions", "refit.actions"),
            GraphEdge("rollout.frame", "energy.frame"),
            GraphEdge("input.goal", "energy.goal"),
            GraphEdge("energy.energies", "refit.energies"),
            GraphEdge("energy.energies", "output.energies"),
            GraphEdge("input.mean", "refit.mean"),
            GraphEdge("input.std", "refit.std"),
            GraphEdge("input.params", "refit.params"),
            GraphEdge("refit.mean", "sample.mean"),
            GraphEdge("refit.std", "sample.std"),
            GraphEdge("refit.mean", "refit.mean"),
            GraphEdge("refit.std", "refit.std"),
            GraphEdge("refit.plan", "output.plan"),
        ],
        walks={
            "encode": Call("encoder"),
            "observe": Sequential(Call("encoder"), Call("context")),
            "extend": Call("context"),  # frames encoded already (e.g. each at its arrival)
            "rollout": rollout_loop,
            "plan": DynamicLoop(
                Sequential(Call("sample"), rollout_loop, Call("energy"), Call("refit")), trip_count=iterations
            ),
        },
        next_walk=next_walk,
        required_inputs=(),  # each walk reads its own (see choose_walk)
    )
