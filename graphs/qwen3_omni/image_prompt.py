"""The weightless graph nodes of a prompt with images.

``image_positions``: inputs ``prompt_ids`` [P] and ``image_grid_thw`` [images, 3] -> ``rope_positions``
[3, P], the Thinker's M-RoPE positions (mstar_graphs.qwen3_omni.mrope_positions). It is a node, not a
request input, so the positions reach the Thinker's prefill call only: a request's own inputs are
handed to every call of a node (a Loop reads them each iteration), and the Thinker's decode Loop must
continue from the engine's kept positions instead.

``media_prompt``: a prompt with both audio and images. Inputs ``prompt_ids``, the audio encoder's
``audio_embeds`` [audio pads, H] and the vision encoder's ``image_embeds`` [image pads, H * (1 + D)]
-> ``embeds``: one row per pad in prompt order, the audio rows zero-padded to the image rows' width
(no deepstack feature: adding zero leaves an audio row as it is).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from mstar.graph.node import NodeCall, NodeSubmodule
from mstar_graphs.qwen3_omni.config import Qwen3OmniConfig
from mstar_graphs.qwen3_omni.mrope_positions import thinker_positions


class ImagePositionsNode(NodeSubmodule):
    def __init__(self, config: Qwen3OmniConfig) -> None:
        super().__init__()
        self.config = config

    def prepare_inputs(self, calls: Sequence[NodeCall]) -> dict:
        return {
            "each": [
                (c.inputs["prompt_ids"].reshape(-1), c.inputs["image_grid_thw"].reshape(-1, 3).tolist()) for c in calls
            ]
        }

    def batch_key(self, call: NodeCall):
        return "image_positions"

    def split_outputs(self, outputs, calls):
        return [{"rope_positions": p} for p in outputs["positions"]]

    def forward(self, each: list) -> dict:  # type: ignore[override]
        return {"positions": [thinker_positions(ids, self.config, grids)[0] for ids, grids in each]}


class MediaPromptNode(NodeSubmodule):
    def __init__(self, config: Qwen3OmniConfig) -> None:
        super().__init__()
        self.audio_id, self.image_id = config.thinker_config.audio_token_id, config.thinker_config.image_token_id

    def prepare_inputs(self, calls: Sequence[NodeCall]) -> dict:
        return {
            "each": [
                (c.inputs["prompt_ids"].reshape(-1), c.inputs["audio_embeds"], c.inputs["image_embeds"]) for c in calls
            ]
        }

    def batch_key(self, call: NodeCall):
        return "media_prompt"

    def split_outputs(self, outputs, calls):
        return [{"embeds": e} for e in outputs["embeds"]]

    def forward(self, each: list) -> dict:  # type: ignore[override]
        out = []
        for ids, audio, image in each:
            pads = ids[(ids == self.audio_id) | (ids == self.image_id)]
            if (
                int((pads == self.audio_id).sum()) != audio.shape[0]
                or int((pads == self.image_id).sum()) != image.shape[0]
            ):
                raise ValueError(
                    f"the prompt has {int((pads == self.audio_id).sum())} audio and "
                    f"{int((pads == self.image_id).sum())} image pads for {audio.shape[0]} audio and "
                    f"{image.shape[0]} image embeddings"
                )
            rows = torch.zeros(pads.numel(), image.shape[1], dtype=image.dtype)
            rows[pads == self.audio_id] = F.pad(audio.to(image.dtype), (0, image.shape[1] - audio.shape[1]))
            rows[pads == self.image_id] = image
            out.append(rows)
        return {"embeds": out}
