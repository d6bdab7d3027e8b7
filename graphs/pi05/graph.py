"""The pi0.5 Walk Graph: SigLIP -> Gemma prefix (KV once per observation) -> flow Loop of the action expert.

    input.images -> vision --embeds--> prefix <- input.input_ids, input.embed_mask
                                         :  (prefix KV, persisted; the expert reads it)
    input.noise -> action.x ---x---> action.x (flow Loop: Euler steps) ---x---> output.actions
    input.guide, input.guide_weights -> action   (real-time chunking: inpaint executed actions)

Walks: ``prefill`` (vision, then the prefix with a bidirectional mask) then
``action_gen`` (``steps`` Euler steps, engine-resident, over the prefix KV).
"""

from __future__ import annotations

from mstar.graph import Call, GraphEdge, GraphNode, Loop, LoopMode, ModelGraph, Sequential


def next_walk(state) -> str | None:
    return {None: "prefill", "prefill": "action_gen"}.get(state.last_walk)


def pi05_graph(steps: int = 10) -> ModelGraph:
    return ModelGraph(
        name="pi05",
        nodes=[
            GraphNode("vision", inputs=["images"], outputs=["embeds"]),
            GraphNode("prefix", inputs=["input_ids", "embeds", "embed_mask"], outputs=[], engine="ar", module="pi05"),
            GraphNode(
                "action",
                inputs=["x", "guide", "guide_weights"],
                outputs=["x"],
                engine="ar",
                module="pi05",
                kv_from="prefix",
                loop_mode=LoopMode.FLOW,
            ),
        ],
        edges=[
            GraphEdge("input.images", "vision.images"),
            GraphEdge("vision.embeds", "prefix.embeds"),
            GraphEdge("input.input_ids", "prefix.input_ids"),
            GraphEdge("input.embed_mask", "prefix.embed_mask"),
            GraphEdge("input.noise", "action.x"),
            GraphEdge("input.guide", "action.guide"),
            GraphEdge("input.guide_weights", "action.guide_weights"),
            GraphEdge("action.x", "action.x"),
            GraphEdge("action.x", "output.actions"),
        ],
        walks={
            "prefill": Sequential(Call("vision"), Call("prefix")),
            "action_gen": Loop(Call("action"), max_iters=steps),
        },
        next_walk=next_walk,
    )
