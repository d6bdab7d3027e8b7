"""The Orpheus TTS Walk Graph: a Llama LLM streaming SNAC codes into the SNAC 24 kHz decoder.

    input.prompt_ids -> llm ---token---> llm (decode Loop feedback)
                         \\--token--~> snac [vocoder, SlidingWindow(28, 7, edges)] --audio--> output.audio
                          \\--token--> output.tokens

Walks: ``prefill`` (the prompt, first token) then ``decode`` (an engine-resident
Loop until end-of-speech or max_tokens). The KV from prefill persists into decode.
"""

from __future__ import annotations

from mstar.graph import (
    Call,
    DynamicLoop,
    GraphEdge,
    GraphNode,
    ModelGraph,
    PartitionConnection,
    PartitionTopology,
    SlidingWindowChunkPolicy,
    StopOnValues,
    StreamingGraphEdge,
)
from mstar_graphs.orpheus.tokens import END_OF_SPEECH, FRAME_TOKENS

WINDOW_TOKENS = 4 * FRAME_TOKENS  # 28: the reference decodes 4 frames and keeps the 2nd
# (edges=True: we also keep the first frame of the first window and the last two of the last)
STRIDE_TOKENS = FRAME_TOKENS  # a new window every frame


def next_walk(state) -> str | None:
    return {None: "prefill", "prefill": "decode"}.get(state.last_walk)


def orpheus_graph() -> ModelGraph:
    return ModelGraph(
        name="orpheus",
        nodes=[
            GraphNode("llm", inputs=["input_ids"], outputs=["token"], engine="ar"),
            GraphNode("snac", inputs=["codes"], outputs=["audio"], engine="stateless"),
        ],
        edges=[
            GraphEdge("input.prompt_ids", "llm.input_ids"),
            GraphEdge("llm.token", "llm.input_ids"),
            GraphEdge("llm.token", "output.tokens"),
            StreamingGraphEdge("llm.token", "snac.codes", target_partition="vocoder"),
            GraphEdge("snac.audio", "output.audio"),
        ],
        walks={
            "prefill": Call("llm"),
            "decode": DynamicLoop(
                "llm",
                trip_count=lambda s: s.request.sampling.max_tokens - 1,
                stop=StopOnValues("llm.token", (END_OF_SPEECH,)),
            ),
        },
        topology=PartitionTopology(
            partitions={"talker": ["llm"], "vocoder": ["snac"]},
            connections=[
                PartitionConnection(
                    "talker", "vocoder", SlidingWindowChunkPolicy(WINDOW_TOKENS, STRIDE_TOKENS, edges=True)
                )
            ],
        ),
        next_walk=next_walk,
    )
