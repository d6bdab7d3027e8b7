"""The Thinker's vision encoder: an image's patches -> one embedding per 2 x 2 patches, plus its deepstack rows.

As transformers' ``Qwen3OmniMoeVisionEncoder`` computes it, per image of ``grid_thw`` (t, h, w) patches:

1. each patch (C x temporal_patch x 16 x 16 values, as the image preprocessor lays them out, in 2 x 2
   merge-block order) is projected to ``hidden_size`` (the checkpoint's Conv3d, whose stride is its
   kernel: one matmul);
2. the learned square grid of position embeddings (48 x 48) is resampled bilinearly (corners aligned)
   to the image's h x w grid and added;
3. blocks of pre-norm attention + GELU(tanh) MLP, with 2-D RoPE (a patch's row angles on the first
   quarter-frequencies, its column angles on the next); attention is bidirectional within each frame,
   never across images;
4. after the blocks ``deepstack_visual_indexes`` name, a merger (LayerNorm over the 4 merged patches,
   MLP) makes that layer's deepstack rows; after the last block the final merger (LayerNorm per patch,
   then the MLP over the 4 merged) makes the image's embeddings.

The node's output ``embeds`` holds, per merged token, the embedding and then every deepstack row,
side by side: [tokens, out_hidden * (1 + deepstack)]. The Thinker puts the first part in at the
image's ``<|image_pad|>`` rows and adds the others to its hidden states after its first layers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mstar.graph.node import NodeCall, NodeSubmodule
from mstar_graphs.common.rope import apply_rope, rope_inv_freq
from mstar_graphs.qwen3_omni.config import VisionEncoderConfig

MAX_IMAGE_PATCHES = 12_845_056 // 256  # per image: the released preprocessor's max_pixels in 16 x 16 patches


class PatchMerger(nn.Module):
    """Four neighbouring patches -> one token of ``out_hidden``. ``before_merge``: LayerNorm per patch (the
    final merger); else over the four patches' features together (the deepstack mergers)."""

    def __init__(self, cfg: VisionEncoderConfig, before_merge: bool) -> None:
        super().__init__()
        merged = cfg.hidden_size * cfg.spatial_merge_size**2
        self.merged, self.before_merge = merged, before_merge
        self.ln_q = nn.LayerNorm(cfg.hidden_size if before_merge else merged, eps=1e-6)
        self.mlp = nn.ModuleList([nn.Linear(merged, merged), nn.GELU(), nn.Linear(merged, cfg.out_hidden_size)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln_q(x).reshape(-1, self.merged) if self.before_merge else self.ln_q(x.reshape(-1, self.merged))
        for layer in self.mlp:
            x = layer(x)
        return x


class VisionAttention(nn.Module):
    def __init__(self, cfg: VisionEncoderConfig) -> None:
        super().__init__()
        self.heads, self.head_dim = cfg.num_heads, cfg.hidden_size // cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, frames: list[int]) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).reshape(n, 3, self.heads, self.head_dim).unbind(1)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        outs, start = [], 0
        for length in frames:  # bidirectional within one frame of one image
            sl = slice(start, start + length)
            outs.append(
                F.scaled_dot_product_attention(
                    q[sl].transpose(0, 1), k[sl].transpose(0, 1), v[sl].transpose(0, 1)
                ).transpose(0, 1)
            )
            start += length
        return self.proj(torch.cat(outs).reshape(n, -1))


class VisionMLP(nn.Module):
    def __init__(self, cfg: VisionEncoderConfig) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.linear_fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate="tanh"))


class VisionBlock(nn.Module):
    def __init__(self, cfg: VisionEncoderConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.norm2 = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.attn = VisionAttention(cfg)
        self.mlp = VisionMLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, frames: list[int]) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, frames)
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    def __init__(self, cfg: VisionEncoderConfig) -> None:
        super().__init__()
        kernel = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.proj = nn.Conv3d(cfg.in_channels, cfg.hidden_size, kernel_size=kernel, stride=kernel)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """[N, C * T * P * P] -> [N, hidden]: the convolution's one output per patch, as a matmul."""
        w = self.proj.weight
        return F.linear(patches.to(w.dtype), w.reshape(w.shape[0], -1), self.proj.bias)


class VisionEncoder(NodeSubmodule):
    """A stateless node: per call ``pixel_values`` [patches, C * T * P * P] and ``image_grid_thw`` [images, 3]
    -> ``embeds`` [tokens, out_hidden * (1 + deepstack)], every image's back to back."""

    def __init__(self, cfg: VisionEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.merge = cfg.spatial_merge_size
        self.side = int(cfg.num_position_embeddings**0.5)
        self.patch_embed = PatchEmbed(cfg)
        self.pos_embed = nn.Embedding(cfg.num_position_embeddings, cfg.hidden_size)
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg, before_merge=True)
        self.merger_list = nn.ModuleList(PatchMerger(cfg, before_merge=False) for _ in cfg.deepstack_visual_indexes)
        head_dim = cfg.hidden_size // cfg.num_heads
        self.register_buffer("inv_freq", self._inv_freq(head_dim), persistent=False)

    def _inv_freq(self, head_dim: int) -> torch.Tensor:
        quarter = head_dim // 2  # row and column angles share the frequencies of half the rotary pairs
        # On the CPU even inside a meta-device build (a meta division imports torch._dynamo, 2 s).
        return rope_inv_freq(quarter, self.cfg.rope_parameters.rope_theta, device="cpu")

    def reset_buffers(self) -> None:
        self.inv_freq = self._inv_freq(self.cfg.hidden_size // self.cfg.num_heads)

    @property
    def width(self) -> int:
        return self.cfg.out_hidden_size * (1 + len(self.cfg.deepstack_visual_indexes))

    # -- the node's batch: images of any sizes -----------------------------------------------------
    def prepare_inputs(self, calls: Sequence[NodeCall]) -> dict:
        pixels, grids, counts = [], [], []
        per_patch = self.cfg.in_channels * self.cfg.temporal_patch_size * self.cfg.patch_size**2
        for c in calls:
            values, grid = c.inputs["pixel_values"], c.inputs["image_grid_thw"]
            grid = torch.as_tensor(grid).reshape(-1, 3).long()
            if values.dim() != 2 or values.shape[1] != per_patch:
                raise ValueError(f"pixel_values must be [patches, {per_patch}], got {tuple(values.shape)}")
            if bool((grid <= 0).any()) or bool((grid[:, 1:] % self.merge).any()):
                raise ValueError(f"image_grid_thw {grid.tolist()}: sides must be positive multiples of {self.merge}")
            if int(grid.prod(-1).sum()) != values.shape[0]:
                raise ValueError(
                    f"image_grid_thw {grid.tolist()} makes {int(grid.prod(-1).sum())} patches, "
                    f"pixel_values has {values.shape[0]}"
                )
            if int(grid.prod(-1).max()) > MAX_IMAGE_PATCHES:
                raise ValueError(
                    f"an image of {int(grid.prod(-1).max())} patches is over the {MAX_IMAGE_PATCHES} "
                    "patch limit (the released preprocessor's largest image)"
                )
            if not torch.isfinite(values).all():
                raise ValueError("pixel_values contain NaN or infinite values")
            pixels.append(values)
            grids += [tuple(g) for g in grid.tolist()]
            counts.append(grid.shape[0])
        return {"pixel_values": torch.cat(pixels), "grids": grids, "counts": counts}

    def split_outputs(self, outputs, calls):
        return [{"embeds": e} for e in outputs["embeds"]]

    def batch_key(self, call: NodeCall):
        return "image"

    def forward(
        self,
        pixel_values: torch.Tensor,
        grids: list[tuple[int, int, int]],  # type: ignore[override]
        counts: list[int],
    ) -> dict[str, list[torch.Tensor]]:
        rows = self.encode(pixel_values, grids)
        tokens = [t * h * w // self.merge**2 for t, h, w in grids]
        per_image = list(rows.split(tokens))
        out, at = [], 0
        for n in counts:
            out.append(torch.cat(per_image[at : at + n]))
            at += n
        return {"embeds": out}

    # -- the computation -----------------------------------------------------------------------------
    def _grid_positions(self, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, column) of each patch of an h x w grid, in merge-block order."""
        m = self.merge
        rows = torch.arange(h)[:, None].expand(h, w)
        cols = torch.arange(w)[None, :].expand(h, w)
        order = lambda a: a.reshape(h // m, m, w // m, m).transpose(1, 2).reshape(-1)  # noqa: E731
        return order(rows), order(cols)

    def _position_embeddings(self, h: int, w: int) -> torch.Tensor:
        """The learned grid resampled to h x w (bilinear, corners aligned), in merge-block order: [h*w, hidden]."""
        table = self.pos_embed.weight.reshape(self.side, self.side, -1).permute(2, 0, 1)[None]
        grid = F.interpolate(table.float(), size=(h, w), mode="bilinear", align_corners=True)[0]
        m = self.merge
        return grid.permute(1, 2, 0).reshape(h // m, m, w // m, m, -1).transpose(1, 2).reshape(h * w, -1)

    def encode(self, pixel_values: torch.Tensor, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        """All images' patches -> [tokens, out_hidden * (1 + deepstack)]."""
        x = self.patch_embed(pixel_values)
        pos, rows, cols, frames = [], [], [], []
        for t, h, w in grids:
            pos.append(self._position_embeddings(h, w).repeat(t, 1))
            r, c = self._grid_positions(h, w)
            rows.append(r.repeat(t))
            cols.append(c.repeat(t))
            frames += [h * w] * t
        x = x + torch.cat(pos).to(x.dtype)
        angles = torch.cat(
            [torch.cat(rows).float()[:, None] * self.inv_freq, torch.cat(cols).float()[:, None] * self.inv_freq], dim=-1
        )
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        deepstack = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, frames)
            if i in self.cfg.deepstack_visual_indexes:
                deepstack.append(self.merger_list[self.cfg.deepstack_visual_indexes.index(i)](x))
        return torch.cat([self.merger(x), *deepstack], dim=-1)
