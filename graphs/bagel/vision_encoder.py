"""BAGEL's understanding-side image encoder: image -> the rows it puts in the LLM's sequence.

Per image ``[3, H, W]`` (already resized and in [-1, 1]; H, W multiples of the patch size), as
``Bagel.prepare_vit_images`` + ``forward_cache_update_vit`` compute it:

    rows, ids = patchify(image)                       # [N, 3*p*p] (py, px, c), ids i*grid + j
    x = vit_model(rows, ids)                          # SigLIP NaViT, per-image attention, post-LN
    out = connector(x) + vit_pos_embed[ids]           # fc2(gelu_tanh(fc1 x)), then the sin-cos table

Several images go through one call as one packed sequence (attention stays within each image).
Parameter names are the release's: ``vit_model.vision_model.*``, ``connector.fc{1,2}.*``,
``vit_pos_embed.pos_embed``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from mstar_graphs.bagel.ema_parts import build_empty, load_ema_part
from mstar_graphs.bagel.patch_grid import grid_position_ids, patch_rows
from mstar_graphs.bagel.siglip_navit import SiglipNavitModel
from mstar_graphs.bagel.sincos import SinCosPositionTable
from mstar_graphs.bagel.vit_config import VitConfig

VISION_PREFIXES = ("vit_model.vision_model.", "connector.", "vit_pos_embed.")
CONNECTOR_ACTIVATIONS = {
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
}


class MLPConnector(nn.Module):
    """ViT width -> LLM width: ``fc2(act(fc1(x)))`` (``modeling_utils.MLPconnector``)."""

    def __init__(self, in_dim: int, out_dim: int, act: str, **factory: object) -> None:
        super().__init__()
        if act not in CONNECTOR_ACTIVATIONS:
            raise ValueError(f"connector activation must be one of {sorted(CONNECTOR_ACTIVATIONS)}, got {act!r}")
        self.act = CONNECTOR_ACTIVATIONS[act]
        self.fc1 = nn.Linear(in_dim, out_dim, **factory)
        self.fc2 = nn.Linear(out_dim, out_dim, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class BagelVisionEncoder(nn.Module):
    """SigLIP NaViT + connector + ViT sin-cos positions. ``grid`` is the position-id stride
    (``vit_max_num_patch_per_side``, 70); it must equal the ViT table's side, image_size / patch_size."""

    def __init__(
        self,
        vit_cfg: VitConfig,
        llm_hidden: int,
        grid: int,
        *,
        connector_act: str = "gelu_pytorch_tanh",
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if vit_cfg.grid != grid:
            raise ValueError(
                f"ViT position grid {grid} (vit_max_num_patch_per_side) must equal image_size / patch_size = "
                f"{vit_cfg.image_size} / {vit_cfg.patch_size} = {vit_cfg.grid} of vit_config.json"
            )
        if llm_hidden <= 0 or llm_hidden % 4:
            raise ValueError(f"llm_hidden must be a positive multiple of 4 (2-D sin-cos table), got {llm_hidden}")
        factory = {"dtype": dtype, "device": device}
        self.vit_cfg, self.grid, self.llm_hidden = vit_cfg, grid, llm_hidden
        self.vit_model = SiglipNavitModel(vit_cfg, **factory)
        self.connector = MLPConnector(vit_cfg.hidden_size, llm_hidden, connector_act, **factory)
        self.vit_pos_embed = SinCosPositionTable(grid, llm_hidden, **factory)

    @classmethod
    def from_pretrained_dir(
        cls,
        path: str | Path,
        vit_cfg: VitConfig | None,
        llm_hidden: int,
        grid: int,
        *,
        connector_act: str = "gelu_pytorch_tanh",
        dtype: torch.dtype = torch.float32,
        progress: bool = False,
    ) -> BagelVisionEncoder:
        """Build from ``<path>/vit_config.json`` (unless ``vit_cfg`` is given) and load
        ``vit_model.vision_model.*``, ``connector.*``, ``vit_pos_embed.*`` from ``<path>/ema.safetensors``."""
        cfg = vit_cfg if vit_cfg is not None else VitConfig.from_dir(path)
        module = build_empty(lambda device: cls(cfg, llm_hidden, grid, connector_act=connector_act, device=device))
        load_ema_part(module, path, VISION_PREFIXES, dtype=dtype, progress=progress)
        return module.eval()

    @property
    def patch_size(self) -> int:
        return self.vit_cfg.patch_size

    def patchify(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """image [3, H, W] -> (rows [N, 3*p*p] ordered (py, px, c), pos_ids [N] = i*grid + j)."""
        if image.dim() != 3 or image.shape[0] != self.vit_cfg.num_channels:
            raise ValueError(f"ViT image must be [3, H, W], got {tuple(image.shape)}")
        h, w = image.shape[1:]
        ids = grid_position_ids(h, w, self.patch_size, self.grid, what="ViT image")
        return patch_rows(image, self.patch_size), ids.to(image.device)

    def encode_packed(self, rows: torch.Tensor, pos_ids: torch.Tensor, seq_lens: Sequence[int]) -> torch.Tensor:
        """Packed patch rows of several images (``seq_lens`` rows each) -> LLM rows [N, llm_hidden]."""
        features = self.vit_model(rows, pos_ids, seq_lens)
        return self.connector(features) + self.vit_pos_embed(pos_ids)

    def forward(self, images: Sequence[torch.Tensor]) -> list[torch.Tensor]:  # type: ignore[override]
        """images: [3, H_i, W_i] in [-1, 1] -> per image [N_i, llm_hidden], N_i = (H_i / p) * (W_i / p)."""
        if not images:
            return []
        device = self.connector.fc1.weight.device
        pieces = [self.patchify(image.to(device)) for image in images]
        seq_lens = [rows.shape[0] for rows, _ in pieces]
        rows = torch.cat([r for r, _ in pieces])
        ids = torch.cat([i for _, i in pieces])
        return list(self.encode_packed(rows, ids, seq_lens).split(seq_lens))
