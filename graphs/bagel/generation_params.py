"""One image generation's settings as the tensor the graph carries (``input.gen_params``).

The flow node's module reads its schedule and guidance from it, the VAE decoder the latent grid.
``image_branch`` says where the image-guidance velocity comes from: ``none`` (not used), ``view`` (the
``llm_cfg_img`` view: an edit's context without the image), ``main`` (the full context itself: a
text-to-image request has no image, so its no-image context IS the full context and its velocity
is the conditional one - computed once, not twice).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from mstar_graphs.bagel.guidance import GuidanceParams

RENORMS = ("global", "channel", "text_channel")
IMAGE_BRANCHES = ("none", "view", "main")
_WIDTH = 11


@dataclass(frozen=True)
class GenerationParams:
    guidance: GuidanceParams
    grid_h: int  # latent token grid (image height / 16)
    grid_w: int
    image_branch: Literal["none", "view", "main"] = "none"

    @property
    def num_tokens(self) -> int:
        return self.grid_h * self.grid_w

    def pack(self) -> torch.Tensor:
        g = self.guidance
        return torch.tensor(
            [
                g.steps,
                g.timestep_shift,
                g.text_scale,
                g.image_scale,
                g.interval[0],
                g.interval[1],
                RENORMS.index(g.renorm),
                g.renorm_min,
                self.grid_h,
                self.grid_w,
                IMAGE_BRANCHES.index(self.image_branch),
            ],
            dtype=torch.float64,
        )

    @classmethod
    def unpack(cls, t: torch.Tensor) -> GenerationParams:
        v = t.reshape(-1).double().tolist()
        if len(v) != _WIDTH:
            raise ValueError(f"gen_params must have {_WIDTH} values, got {len(v)}")
        guidance = GuidanceParams(
            steps=int(v[0]),
            timestep_shift=v[1],
            text_scale=v[2],
            image_scale=v[3],
            interval=(v[4], v[5]),
            renorm=RENORMS[int(v[6])],
            renorm_min=v[7],
        )
        return cls(guidance, int(v[8]), int(v[9]), IMAGE_BRANCHES[int(v[10])])
