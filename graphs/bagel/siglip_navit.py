"""BAGEL's SigLIP ViT in NaViT form: images of any size, packed into one row sequence.

As ``modeling/bagel/siglip_navit.py`` is configured by BAGEL (``rope=False``, the patch
convolution turned into a Linear):

- input: the images' patches as rows ``[N, C * p * p]``, each row ordered (py, px, c), and each
  patch's position id ``i * grid + j``;
- embeddings: ``patch_embedding`` (Linear) + ``position_embedding[id]`` (learned table, grid**2 rows);
- encoder layers: pre-LayerNorm, multi-head attention (q/k/v/out with bias, scale head_dim**-0.5)
  that is bidirectional within one image and never across images (the reference's
  ``flash_attn_varlen_func`` over ``cu_seqlens``), then a GELU(tanh) MLP; both residual;
- ``post_layernorm``; no pooling head.

Module names follow the checkpoint, under ``vit_model.``: ``vision_model.embeddings.patch_embedding``,
``vision_model.encoder.layers.{i}.self_attn.q_proj`` ... ``vision_model.post_layernorm``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mstar_graphs.bagel.vit_config import VitConfig


class NavitAttention(nn.Module):
    def __init__(self, cfg: VitConfig, **factory: object) -> None:
        super().__init__()
        self.heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        width = cfg.hidden_size
        self.q_proj = nn.Linear(width, width, **factory)
        self.k_proj = nn.Linear(width, width, **factory)
        self.v_proj = nn.Linear(width, width, **factory)
        self.out_proj = nn.Linear(width, width, **factory)

    def forward(self, x: torch.Tensor, seq_lens: Sequence[int]) -> torch.Tensor:
        """x [N, width], the images' rows back to back (``seq_lens`` rows each) -> [N, width]."""
        n = x.shape[0]
        q, k, v = (
            p(x).view(n, self.heads, self.head_dim).transpose(0, 1) for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        if len(seq_lens) == 1:
            out = F.scaled_dot_product_attention(q, k, v, scale=self.head_dim**-0.5)
        else:  # block diagonal: each image attends to itself only
            parts = [
                F.scaled_dot_product_attention(qi, ki, vi, scale=self.head_dim**-0.5)
                for qi, ki, vi in zip(q.split(seq_lens, 1), k.split(seq_lens, 1), v.split(seq_lens, 1))
            ]
            out = torch.cat(parts, dim=1)
        return self.out_proj(out.transpose(0, 1).reshape(n, -1))


class NavitMLP(nn.Module):
    def __init__(self, cfg: VitConfig, **factory: object) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, **factory)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))  # gelu_pytorch_tanh


class NavitEncoderLayer(nn.Module):
    def __init__(self, cfg: VitConfig, **factory: object) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, **factory)
        self.self_attn = NavitAttention(cfg, **factory)
        self.layer_norm2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, **factory)
        self.mlp = NavitMLP(cfg, **factory)

    def forward(self, x: torch.Tensor, seq_lens: Sequence[int]) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x), seq_lens)
        return x + self.mlp(self.layer_norm2(x))


class NavitEmbeddings(nn.Module):
    def __init__(self, cfg: VitConfig, **factory: object) -> None:
        super().__init__()
        self.patch_embedding = nn.Linear(cfg.patch_dim, cfg.hidden_size, **factory)
        self.position_embedding = nn.Embedding(cfg.grid**2, cfg.hidden_size, **factory)

    def forward(self, rows: torch.Tensor, pos_ids: torch.Tensor) -> torch.Tensor:
        return self.patch_embedding(rows) + self.position_embedding(pos_ids)


class NavitEncoder(nn.Module):
    def __init__(self, cfg: VitConfig, **factory: object) -> None:
        super().__init__()
        self.layers = nn.ModuleList(NavitEncoderLayer(cfg, **factory) for _ in range(cfg.num_hidden_layers))


class NavitTransformer(nn.Module):
    """rows [N, C*p*p] + pos_ids [N] + per-image row counts -> post-layernormed features [N, hidden]."""

    def __init__(self, cfg: VitConfig, **factory: object) -> None:
        super().__init__()
        self.config = cfg
        self.embeddings = NavitEmbeddings(cfg, **factory)
        self.encoder = NavitEncoder(cfg, **factory)
        self.post_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, **factory)

    def forward(self, rows: torch.Tensor, pos_ids: torch.Tensor, seq_lens: Sequence[int]) -> torch.Tensor:
        cfg = self.config
        if rows.dim() != 2 or rows.shape[1] != cfg.patch_dim:
            raise ValueError(f"patch rows must be [N, {cfg.patch_dim}], got {tuple(rows.shape)}")
        if pos_ids.shape != rows.shape[:1]:
            raise ValueError(f"pos_ids must be [{rows.shape[0]}] (one per row), got {tuple(pos_ids.shape)}")
        seq_lens = [int(s) for s in seq_lens]
        if any(s <= 0 for s in seq_lens) or sum(seq_lens) != rows.shape[0]:
            raise ValueError(f"seq_lens {seq_lens} must be positive and sum to the {rows.shape[0]} rows")
        x = self.embeddings(rows.to(self.embeddings.patch_embedding.weight.dtype), pos_ids)
        for layer in self.encoder.layers:
            x = layer(x, seq_lens)
        return self.post_layernorm(x)


class SiglipNavitModel(nn.Module):
    """The ``vit_model`` of BAGEL: one level, ``vision_model``, as the checkpoint's names have it."""

    def __init__(self, cfg: VitConfig, **factory: object) -> None:
        super().__init__()
        self.vision_model = NavitTransformer(cfg, **factory)

    def forward(self, rows: torch.Tensor, pos_ids: torch.Tensor, seq_lens: Sequence[int]) -> torch.Tensor:
        return self.vision_model(rows, pos_ids, seq_lens)
