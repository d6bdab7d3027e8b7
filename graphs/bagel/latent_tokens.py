"""VAE latents <-> BAGEL's latent tokens, their position ids, and the decoded image as uint8.

A latent ``[C, p*h, p*w]`` becomes ``h*w`` tokens of ``p*p*C`` values: row-major over the (h, w)
grid, each token's values ordered (py, px, c) (``Bagel.forward_cache_update_vae``); unpatchify is
the inverse (``inferencer.decode_image``). Token (i, j) has position id ``i * grid + j``.
"""

from __future__ import annotations

import torch

from mstar_graphs.bagel.patch_grid import grid_position_ids, patch_rows, rows_to_grid


def patchify_latent(z: torch.Tensor, p: int) -> torch.Tensor:
    """[C, p*h, p*w] -> [h*w, p*p*C], rows (py, px, c)."""
    return patch_rows(z, p)


def unpatchify_latent(tokens: torch.Tensor, h: int, w: int, p: int, channels: int) -> torch.Tensor:
    """[h*w, p*p*C] -> [C, p*h, p*w] (inverse of ``patchify_latent``)."""
    return rows_to_grid(tokens, h, w, p, channels)


def latent_pos_ids(height: int, width: int, stride: int = 16, grid: int = 64) -> torch.Tensor:
    """Position ids of the tokens of an image of ``height`` x ``width`` pixels; ``stride`` = VAE
    downsampling x latent patch (16), ``grid`` = the latent table's side (64)."""
    return grid_position_ids(height, width, stride, grid, what="generated image")


def to_uint8_image(x: torch.Tensor) -> torch.Tensor:
    """Decoded image [3, H, W] in [-1, 1] -> uint8 [H, W, 3], TRUNCATING ``(x/2 + 1/2).clamp(0, 1) * 255``
    (the reference's ``decode_image``; computed in ``x``'s dtype, as it does)."""
    if x.dim() != 3 or x.shape[0] != 3:
        raise ValueError(f"image must be [3, H, W], got {tuple(x.shape)}")
    return ((x * 0.5 + 0.5).clamp(0, 1).permute(1, 2, 0) * 255).to(torch.uint8)
