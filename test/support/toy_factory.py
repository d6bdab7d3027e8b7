"""Model factories for Worker-process tests: a toy LM streaming its tokens into a stateless node.

Not an installed package: it is registered in the environment (``REGISTRATION`` in
``MSTAR_MODELS``, see mstar.worker.registry), which the tests' Conductors and the Worker
processes they launch inherit -- as a user developing a graph locally would do.
"""

from __future__ import annotations

import time

from mstar.graph import SlidingWindowChunkPolicy
from mstar.worker.protocol import ModelSpec
from support.toy_graphs import streaming_lm_graph
from support.toy_models import SumChunk, ToyLM


class SlowSum(SumChunk):
    """SumChunk that takes ``delay`` seconds per batch: keeps a request in flight long enough to kill a Worker."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def forward(self, x, n):
        time.sleep(self.delay)
        return super().forward(x, n)


def toy_streaming(nodes: set[str], stop_token: int | None = None, delay: float = 0.0):
    graph = streaming_lm_graph(SlidingWindowChunkPolicy(4, 2), stop_token=stop_token)
    modules = {}
    if "llm" in nodes:
        modules["llm"] = ToyLM()
    if "sum" in nodes:
        modules["sum"] = SlowSum(delay) if delay else SumChunk()
    return graph, modules


MODEL = "toy_streaming"
REGISTRATION = f"{MODEL}=support.toy_factory:toy_streaming"


def toy_spec(**kwargs) -> ModelSpec:
    return ModelSpec(MODEL, kwargs)
