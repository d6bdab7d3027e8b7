"""One image generation's settings as the tensor the graph carries (``input.gen_params``).

The flow node's module reads its schedule and guidance from it, the VAE decoder the latent grid.
``image_branch`` says where the image-guidance velocity comes from: ``none`` (not used), ``view`` (the
``llm_cfg_img`` view: an edit's context without the image), ``main`` (the full context itself: a
text-to-image request has no image, so its no-image context IS the full context and its velocity
is the conditional one - computed once, not twice).

``report_every`` / ``previews`` ask the flow for progress: its latent after every ``report_every``-th
step (and the last), and ``previews`` predictions of the clean latent spread over the flow (never at
its last step), which the graph decodes into preview images.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from mstar_graphs.bagel.guidance import GuidanceParams

RENORMS = ("global", "channel", "text_channel")
IMAGE_BRANCHES = ("none", "view", "main")
_WIDTH = 13
MAX_PREVIEWS = 8  # more previews than this cost decodes and show little new


@dataclass(frozen=True)
class GenerationParams:
    guidance: GuidanceParams
    grid_h: int  # latent token grid (image height / 16)
    grid_w: int
    image_branch: Literal["none", "view", "main"] = "none"
    report_every: int = 0  # > 0: the latent after every k-th flow step (and the last); 0: none
    previews: int = 0  # predicted clean latents to report, spread over the flow

    def __post_init__(self) -> None:
        for field, value, most in (
            ("report_every", self.report_every, None),
            ("previews", self.previews, MAX_PREVIEWS),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (most and value > most):
                bound = f"0..{most}" if most else ">= 0"
                raise ValueError(f"gen_params: {field} must be an integer {bound}, got {value!r}")

    @property
    def num_tokens(self) -> int:
        return self.grid_h * self.grid_w

    @property
    def evaluations(self) -> int:
        """Flow steps (velocity evaluations): one fewer than the schedule's points."""
        return self.guidance.steps - 1

    def preview_steps(self) -> tuple[int, ...]:
        """The steps (1-based) after which a preview is made: ``previews`` of them, evenly spread, before
        the last step (a flow of S steps has at most S - 1)."""
        last = self.evaluations
        picked = {round((i + 1) * last / (self.previews + 1)) for i in range(self.previews)}
        return tuple(sorted(k for k in picked if 1 <= k < last))

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
                self.report_every,
                self.previews,
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
        return cls(guidance, int(v[8]), int(v[9]), IMAGE_BRANCHES[int(v[10])], int(v[11]), int(v[12]))
