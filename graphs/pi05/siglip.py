"""pi0.5's image encoder: the SigLIP vision tower + PaliGemma's multi-modal projector, as a stateless node.

Input edge ``images``: one request's cameras, uint8 ``[H, W, 3]`` / ``[C, H, W, 3]``
(0..255) or float in [0, 1]. Each image not 224 x 224 is resized as openpi's training
pipeline does (``image_resize``: PIL bilinear on uint8, aspect kept, centred, black
padding) and normalised to [-1, 1] (``x / 255 * 2 - 1``, as openpi's
``Observation.from_dict``). Output edge
``embeds``: ``[C * 256, prefix_width]``, camera-major, exactly the rows PaliGemma
feeds its LM for image tokens: the projector output, NOT divided by sqrt(width) -
the LM multiplies only text-token embeddings by sqrt(width) (openpi, and
transformers 5's ``GemmaTextScaledWordEmbedding``), image rows enter as they are.

Submodule names follow transformers' ``SiglipVisionTransformer`` so the checkpoint
maps by prefix alone (see ``checkpoints.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from mstar.graph.node import NodeCall, NodeSubmodule
from mstar.weights import no_random_init
from mstar_graphs.pi05.config import Pi05Config, VisionDims
from mstar_graphs.pi05.image_resize import to_model_size


class SiglipAttention(nn.Module):
    def __init__(self, v: VisionDims, **factory: object) -> None:
        super().__init__()
        self.heads, self.head_dim = v.heads, v.width // v.heads
        self.q_proj = nn.Linear(v.width, v.width, **factory)
        self.k_proj = nn.Linear(v.width, v.width, **factory)
        self.v_proj = nn.Linear(v.width, v.width, **factory)
        self.out_proj = nn.Linear(v.width, v.width, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, w = x.shape
        q, k, v = (
            p(x).view(b, n, self.heads, self.head_dim).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        out = F.scaled_dot_product_attention(q, k, v, scale=self.head_dim**-0.5)  # no mask: full attention
        return self.out_proj(out.transpose(1, 2).reshape(b, n, w))


class SiglipMLP(nn.Module):
    def __init__(self, v: VisionDims, **factory: object) -> None:
        super().__init__()
        self.fc1 = nn.Linear(v.width, v.mlp_dim, **factory)
        self.fc2 = nn.Linear(v.mlp_dim, v.width, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))  # SigLIP's gelu_pytorch_tanh


class SiglipEncoderLayer(nn.Module):
    def __init__(self, v: VisionDims, **factory: object) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(v.width, eps=v.layer_norm_eps, **factory)
        self.self_attn = SiglipAttention(v, **factory)
        self.layer_norm2 = nn.LayerNorm(v.width, eps=v.layer_norm_eps, **factory)
        self.mlp = SiglipMLP(v, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class SiglipEmbeddings(nn.Module):
    def __init__(self, v: VisionDims, **factory: object) -> None:
        super().__init__()
        self.patch_embedding = nn.Conv2d(3, v.width, kernel_size=v.patch_size, stride=v.patch_size, **factory)
        self.position_embedding = nn.Embedding(v.num_patches, v.width, **factory)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype))  # [N, W, g, g]
        return patches.flatten(2).transpose(1, 2) + self.position_embedding.weight


class SiglipEncoder(nn.Module):
    def __init__(self, v: VisionDims, **factory: object) -> None:
        super().__init__()
        self.layers = nn.ModuleList(SiglipEncoderLayer(v, **factory) for _ in range(v.depth))


class SiglipVisionTower(nn.Module):
    """pixels [N, 3, S, S] in [-1, 1] -> last hidden state [N, patches, width] (post-layernormed)."""

    def __init__(self, v: VisionDims, **factory: object) -> None:
        super().__init__()
        self.embeddings = SiglipEmbeddings(v, **factory)
        self.encoder = SiglipEncoder(v, **factory)
        self.post_layernorm = nn.LayerNorm(v.width, eps=v.layer_norm_eps, **factory)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(pixels)
        for layer in self.encoder.layers:
            x = layer(x)
        return self.post_layernorm(x)


def preprocess_images(images: torch.Tensor, size: int, *, who: str = "images") -> torch.Tensor:
    """uint8 (0..255) or float ([0, 1]) [H, W, 3] / [C, H, W, 3] -> float32 [C, 3, size, size] in [-1, 1]."""
    if images.dim() == 3:
        images = images[None]
    if images.dim() != 4 or images.shape[-1] != 3 or images.shape[0] == 0:
        raise ValueError(
            f"{who}: expected [H, W, 3] or [cameras, H, W, 3] (RGB, channels last), got shape {tuple(images.shape)}"
        )
    if images.dtype.is_floating_point:
        if not torch.isfinite(images).all():
            raise ValueError(f"{who}: float images contain NaN or infinite values")
        lo, hi = float(images.min()), float(images.max())
        if lo < -1e-3 or hi > 1 + 1e-3:
            raise ValueError(f"{who}: float images must be in [0, 1], got values in [{lo:.3g}, {hi:.3g}]")
        images = images.clamp(0.0, 1.0)
    elif images.dtype != torch.uint8:
        raise ValueError(f"{who}: images must be uint8 or floating point, got {images.dtype}")
    images = to_model_size(images.cpu(), size)
    unit = images.float() / 255.0 if images.dtype == torch.uint8 else images.float()
    return unit.permute(0, 3, 1, 2) * 2.0 - 1.0


class Pi05ImageEncoder(NodeSubmodule):
    """Stateless node: ``images`` -> ``embeds`` [cameras * patches, prefix_width]. Calls with the
    same number of cameras share a batch (one tower pass over all their images)."""

    def __init__(
        self, config: Pi05Config, *, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
    ) -> None:
        super().__init__()
        self.config = config
        factory = {"dtype": dtype, "device": device}
        self.tower = SiglipVisionTower(config.vision, **factory)
        self.projector = nn.Linear(config.vision.width, config.prefix.width, **factory)

    @classmethod
    def from_pretrained_dir(
        cls, path: str | Path, dtype: torch.dtype = torch.float32, progress: bool = True
    ) -> Pi05ImageEncoder:
        from mstar_graphs.pi05.checkpoints import load_part  # checkpoints imports this module

        with no_random_init():
            module = cls(Pi05Config.from_dir(path), dtype=dtype, device="meta")
        module.to_empty(device="cpu")
        load_part(module, path, "vision", dtype=dtype, progress=progress)
        return module.eval()

    @property
    def tokens_per_image(self) -> int:
        return self.config.vision.num_patches

    def batch_key(self, call: NodeCall) -> object:
        images = call.inputs.get("images")
        return None if images is None else (images.shape[0] if images.dim() == 4 else 1)

    def prepare_inputs(self, calls: Sequence[NodeCall]) -> dict[str, torch.Tensor]:
        size = self.config.vision.image_size
        batch = []
        for call in calls:
            if "images" not in call.inputs:
                raise ValueError(f"request {call.request_id}: missing input 'images' (got {sorted(call.inputs)})")
            batch.append(preprocess_images(call.inputs["images"], size, who=f"request {call.request_id}: images"))
        cameras = {b.shape[0] for b in batch}
        if len(cameras) != 1:
            raise ValueError(f"Pi05ImageEncoder: calls with different camera counts in one batch: {sorted(cameras)}")
        return {"pixel_values": torch.stack(batch)}  # [B, C, 3, S, S]

    def forward(self, pixel_values: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
        """pixel_values [B, C, 3, S, S] in [-1, 1] -> ``embeds`` [B, C * patches, prefix_width]."""
        b, c = pixel_values.shape[:2]
        feats = self.projector(self.tower(pixel_values.flatten(0, 1)))  # [B*C, patches, width]
        return {"embeds": feats.reshape(b, c * feats.shape[1], feats.shape[2])}
