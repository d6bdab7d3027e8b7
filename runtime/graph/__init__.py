"""The Walk Graph API a model author writes against."""

from mstar.graph.chunk_policies import (
    Chunk,
    ChunkPolicy,
    FixedChunkPolicy,
    LeftContextChunkPolicy,
    SlidingWindowChunkPolicy,
    WholeStreamPolicy,
)
from mstar.graph.edges import GRAPH_INPUT, GRAPH_OUTPUT, GraphEdge, StreamingGraphEdge
from mstar.graph.loop_mode import LoopMode
from mstar.graph.model_graph import ModelGraph
from mstar.graph.node import GraphNode, NodeCall, NodeSubmodule
from mstar.graph.request_state import RequestState, StreamState
from mstar.graph.topology import PartitionConnection, PartitionTopology
from mstar.graph.validation import GraphError
from mstar.graph.walks import AwaitInput, Call, DynamicLoop, Loop, Parallel, Sequential, StopOnValues, StopWhen

__all__ = [
    "AwaitInput",
    "Call",
    "Chunk",
    "ChunkPolicy",
    "DynamicLoop",
    "FixedChunkPolicy",
    "GRAPH_INPUT",
    "GRAPH_OUTPUT",
    "GraphEdge",
    "GraphError",
    "GraphNode",
    "LeftContextChunkPolicy",
    "Loop",
    "LoopMode",
    "ModelGraph",
    "NodeCall",
    "NodeSubmodule",
    "Parallel",
    "PartitionConnection",
    "PartitionTopology",
    "RequestState",
    "Sequential",
    "SlidingWindowChunkPolicy",
    "StopOnValues",
    "StopWhen",
    "StreamState",
    "StreamingGraphEdge",
    "WholeStreamPolicy",
]
