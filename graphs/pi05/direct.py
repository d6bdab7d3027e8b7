"""pi0.5 called directly, the way today's policy servers run it: one observation per call, no runtime.

This is what openpi's ``PI0Pytorch.sample_actions`` does for one observation: SigLIP on
the cameras, the prefix (image rows + prompt + discretised state) through the Gemma LM
ONCE with plain dense attention, its per-layer K/V kept in ordinary tensors (openpi's
``past_key_values``), then ``steps`` Euler steps of the action expert whose H rows
attend densely to that prefix K/V and to each other (batch 1). No paged KV, no
scheduler, no batching: the benchmark's baseline (``mstar-ros bench pi05``).

It reuses the model's own layers (same weights, same numerics): they call the attention
they are given as ``attn(layer, q, k, v, scale)``, here :class:`DenseKV`. Attention on CPU
runs in the dtype our torch backend picks (``cpu_score_dtype``: bf16 with AMX, fp32 elsewhere),
so a bf16 baseline is not handicapped.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mstar.engine.attention.torch_backend import cpu_score_dtype
from mstar_graphs.pi05.pi05 import Pi05Model, euler_step, flow_times
from mstar_graphs.pi05.siglip import Pi05ImageEncoder, preprocess_images


class DenseKV:
    """Dense attention with a plain K/V store: the prefix pass records each layer's K/V;
    later (suffix) passes attend to that prefix plus their own rows, all bidirectional."""

    def __init__(self, compute_dtype: torch.dtype | None = torch.float32) -> None:
        self.compute_dtype = compute_dtype
        self.k: dict[int, torch.Tensor] = {}  # layer -> [Hkv, P, D]
        self.v: dict[int, torch.Tensor] = {}
        self.recording = True

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """q [T, Hq, D]; k, v [T, Hkv, D] -> [T, Hq, D]."""
        cdt = self.compute_dtype or q.dtype
        k, v = k.to(cdt).transpose(0, 1), v.to(cdt).transpose(0, 1)
        if self.recording:
            self.k[layer], self.v[layer] = k, v
        else:
            k, v = torch.cat([self.k[layer], k], dim=1), torch.cat([self.v[layer], v], dim=1)
        qs = q.to(cdt).transpose(0, 1)
        # 4-D (batch of one): 3-D inputs send CPU SDPA down its slower math path
        out = F.scaled_dot_product_attention(
            qs[None], k[None], v[None], scale=scale, enable_gqa=qs.shape[0] != k.shape[0]
        )[0]
        return out.transpose(0, 1).to(q.dtype)


@torch.inference_mode()
def encode_images(encoder: Pi05ImageEncoder, images: torch.Tensor) -> torch.Tensor:
    """uint8 [C, H, W, 3] -> image rows [C * patches, prefix_width] (SigLIP + projector)."""
    pixels = preprocess_images(images, encoder.config.vision.image_size)
    return encoder(pixel_values=pixels[None])["embeds"][0]


@torch.inference_mode()
def prefix_direct(model: Pi05Model, embeds: torch.Tensor, input_ids: torch.Tensor, embed_mask: torch.Tensor) -> DenseKV:
    """The prefix through the Gemma LM once (``embeds`` from :func:`encode_images`): its K/V."""
    device = input_ids.device
    # as our backend: on CUDA the model dtype; on a CPU what cpu_score_dtype picks for it
    kv = DenseKV(cpu_score_dtype(embeds.dtype) if device.type == "cpu" else None)
    model(
        input_ids,
        torch.arange(input_ids.shape[0], device=device),
        kv,
        embeds=embeds,
        embed_mask=embed_mask.to(torch.bool),
    )
    kv.recording = False  # the prefix ran once; the flow steps only read its K/V
    return kv


@torch.inference_mode()
def sample_actions_direct(
    model: Pi05Model,
    encoder: Pi05ImageEncoder,
    images: torch.Tensor,
    input_ids: torch.Tensor,
    embed_mask: torch.Tensor,
    noise: torch.Tensor,
    steps: int | None = None,
) -> torch.Tensor:
    """One observation -> its action chunk [H, A] (fp32).

    ``images`` uint8 [C, H, W, 3]; ``input_ids`` / ``embed_mask`` [P] the prefix (as
    ``Pi05Model.build_prefix`` makes it); ``noise`` [H, A], the flow's start at t = 1."""
    steps = steps or model.num_steps
    device = next(model.parameters()).device  # inputs come from the CPU; the model may be on a GPU
    images, input_ids, embed_mask, noise = (t.to(device) for t in (images, input_ids, embed_mask, noise))
    kv = prefix_direct(model, encode_images(encoder, images), input_ids, embed_mask)
    p, h = input_ids.shape[0], model.action_horizon
    positions = torch.arange(p, p + h, device=device)
    x = noise.float().reshape(1, h, model.action_dim)
    for t in flow_times(steps):
        v = model.flow_velocity(x, torch.tensor([t], dtype=torch.float32, device=device), positions, kv)
        x = euler_step(x, v, -1.0 / steps)
    return x[0]
