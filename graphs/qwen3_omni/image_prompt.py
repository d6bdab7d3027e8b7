"""The graph node that numbers a prompt with images for the Thinker's M-RoPE (mstar_graphs.qwen3_omni.mrope_positions).

Stateless and weightless: inputs ``prompt_ids`` [P] and ``image_grid_thw`` [images, 3] -> ``rope_positions``
[3, P]. It is a node, not a request input, so the positions reach the Thinker's prefill call only: a
request's own inputs are handed to every call of a node (a Loop reads them each iteration), and the
Thinker's decode Loop must continue from the engine's kept positions instead.
"""
from __future__ import annotations

from typing import Sequence

from mstar.graph.node import NodeCall, NodeSubmodule
from mstar_graphs.qwen3_omni.config import Qwen3OmniConfig
from mstar_graphs.qwen3_omni.mrope_positions import thinker_positions


class ImagePositionsNode(NodeSubmodule):
    def __init__(self, config: Qwen3OmniConfig) -> None:
        super().__init__()
        self.config = config

    def prepare_inputs(self, calls: Sequence[NodeCall]) -> dict:
        return {"each": [(c.inputs["prompt_ids"].reshape(-1), c.inputs["image_grid_thw"].reshape(-1, 3).tolist())
                         for c in calls]}

    def batch_key(self, call: NodeCall):
        return "image_positions"

    def split_outputs(self, outputs, calls):
        return [{"rope_positions": p} for p in outputs["positions"]]

    def forward(self, each: list) -> dict:  # type: ignore[override]
        return {"positions": [thinker_positions(ids, self.config, grids)[0] for ids, grids in each]}
