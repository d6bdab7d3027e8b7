"""pi0.5 as a servable policy: its graph, its two submodules, its tokenizer and observation -> Request."""
from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mstar.conductor import Request
from mstar.engine.attention.metadata import MaskKind
from mstar.engine.device_loop import run_on_device
from mstar.engine.sampling_params import SamplingParams
from mstar_graphs.pi05.checkpoints import resolve_path
from mstar_graphs.pi05.graph import pi05_graph
from mstar_graphs.pi05.pi05 import Pi05Model
from mstar_graphs.pi05.prompt import load_tokenizer
from mstar_graphs.pi05.siglip import Pi05ImageEncoder

log = logging.getLogger("mstar_graphs.pi05")


@dataclass
class Pi05Policy:
    path: Path
    model: Pi05Model
    encoder: Pi05ImageEncoder
    tokenizer: Any
    _ids: Any = field(default_factory=itertools.count)

    @classmethod
    def load(cls, weights: str | Path | None = None, *, preset: str = "tiny", progress: bool = True,
             load_weights: bool = True) -> "Pi05Policy":
        """Real weights from ``weights`` (a pi0.5 PyTorch checkpoint dir), else the generated tiny one.
        ``load_weights=False``: config and tokenizer only (the modules stay on the meta device), for a
        process that builds requests while Worker processes hold the model."""
        path = resolve_path(weights, preset)
        if not load_weights:
            from mstar_graphs.pi05.config import Pi05Config

            config = Pi05Config.from_dir(path)
            model = Pi05Model(config, device="meta")
            return cls(path, model, Pi05ImageEncoder(config, device="meta"), load_tokenizer(path))
        # on the engines' thread: one thread runs parallel torch work (see mstar.engine.device_loop)
        model = run_on_device(Pi05Model.from_pretrained_dir, path, progress=progress)
        encoder = run_on_device(Pi05ImageEncoder.from_pretrained_dir, path, progress=progress)
        return cls(path, model, encoder, load_tokenizer(path))

    @property
    def random_weights(self) -> bool:
        return self.model.config.random_weights

    @property
    def action_horizon(self) -> int:
        return self.model.action_horizon

    @property
    def action_dim(self) -> int:
        return self.model.action_dim

    def graph(self):
        return pi05_graph(self.model.num_steps)

    def modules(self) -> dict[str, torch.nn.Module]:
        return {"pi05": self.model, "vision": self.encoder}

    def request(self, images: torch.Tensor, state: torch.Tensor, prompt: str, *, seed: int | None = None,
                noise: torch.Tensor | None = None, guide: torch.Tensor | None = None,
                guide_weights: torch.Tensor | None = None, request_id: str | None = None,
                session_id: str | None = None) -> Request:
        """One observation -> a Request whose output ``actions`` is an [H, A] chunk.

        ``images`` [C, H, W, 3] uint8 (one per camera); ``state`` the robot state (normalised to
        [-1, 1], discretised into the prompt); ``guide`` + ``guide_weights``: the actions that will
        already have run while this chunk is computed, and how firmly to keep them. Bad
        observations (empty prompt, NaN state, wrong image shape) raise ValueError here."""
        if images.dim() == 3:
            images = images[None]
        if images.dim() != 4 or images.shape[-1] != 3:
            raise ValueError(f"images must be [cameras, height, width, 3], got {tuple(images.shape)}")
        ids, mask = self.model.build_prefix(self.tokenizer, images.shape[0], prompt, state)
        h, a = self.action_horizon, self.action_dim
        if noise is None:
            gen = torch.Generator().manual_seed(seed) if seed is not None else None
            noise = torch.randn((h, a), generator=gen)
        if guide is None:
            guide, guide_weights = torch.zeros(h, a), torch.zeros(h)
        elif guide_weights is None:
            raise ValueError("guide needs guide_weights")
        inputs = {"images": images, "input_ids": ids, "embed_mask": mask, "noise": noise.float(),
                  "guide": guide.float(), "guide_weights": guide_weights.float()}
        meta = {"prefix.mask": int(MaskKind.PREFIX_BIDIRECTIONAL), "prefix.mask_arg": int(ids.numel())}
        rid = request_id if request_id is not None else f"pi05-{next(self._ids)}"
        return Request(inputs, SamplingParams(max_tokens=1, seed=seed), request_id=rid, session_id=session_id,
                       meta=meta)
