"""An image's (or latent's) patch grid as BAGEL lays it out: patch rows and flattened position ids.

Rows (``data_utils.patchify``): ``[C, h*p, w*p]`` -> ``[h*w, p*p*C]``, row-major over the (h, w)
grid, each row's values ordered (py, px, c) - the order of the ViT's patch Linear (its conv weight
permuted to (out, py, px, c)) and of the VAE latent tokens.

Ids (``get_flattened_position_ids_extrapolate``): patch (i, j) -> ``i * grid + j`` where ``grid``
is the position table's side (70 for the ViT, 64 for latents), not the image's.
"""

from __future__ import annotations

import torch


def patch_rows(x: torch.Tensor, p: int) -> torch.Tensor:
    """[C, h*p, w*p] -> [h*w, p*p*C], rows (py, px, c)."""
    if x.dim() != 3 or x.shape[1] % p or x.shape[2] % p:
        raise ValueError(f"expected [C, H, W] with H and W multiples of {p}, got {tuple(x.shape)}")
    c, hh, ww = x.shape
    h, w = hh // p, ww // p
    return torch.einsum("chpwq->hwpqc", x.reshape(c, h, p, w, p)).reshape(h * w, p * p * c)


def rows_to_grid(rows: torch.Tensor, h: int, w: int, p: int, channels: int) -> torch.Tensor:
    """[h*w, p*p*C] -> [C, h*p, w*p] (the inverse of ``patch_rows``)."""
    if tuple(rows.shape) != (h * w, p * p * channels):
        raise ValueError(f"rows for an {h} x {w} grid must be [{h * w}, {p * p * channels}], got {tuple(rows.shape)}")
    return torch.einsum("hwpqc->chpwq", rows.reshape(h, w, p, p, channels)).reshape(channels, h * p, w * p)


def grid_position_ids(height: int, width: int, patch: int, grid: int, *, what: str = "image") -> torch.Tensor:
    """int64 [(height / patch) * (width / patch)] ids ``i * grid + j``; both sides must be multiples of
    ``patch`` and at most ``grid * patch`` (a wider image would reuse the next row's ids)."""
    if height <= 0 or width <= 0 or height % patch or width % patch:
        raise ValueError(f"{what} of {height} x {width} (H x W): both sides must be positive multiples of {patch}")
    rows, cols = height // patch, width // patch
    if rows > grid or cols > grid:
        raise ValueError(
            f"{what} of {height} x {width} (H x W) is {rows} x {cols} patches; "
            f"the position table allows at most {grid} per side ({grid * patch} pixels)"
        )
    return (torch.arange(rows)[:, None] * grid + torch.arange(cols)[None, :]).flatten()
