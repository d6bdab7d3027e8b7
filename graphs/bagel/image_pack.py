"""Several input images of one request as the tensors the graph carries (one image stays as it is).

A request input is one tensor, but images of a conversation or an edit have sizes of their own. One
image travels as ``[3, H, W]``; several travel as their values flattened and concatenated,
``[sum 3*H_i*W_i]``, with a ``sizes`` input ``[k, 2]`` of their (H_i, W_i), in the order they come.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pack_images(images: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[3, H_i, W_i]`` images -> (the image tensor, its sizes or None for a single image)."""
    if not images:
        raise ValueError("no image to pack")
    for image in images:
        if image.dim() != 3 or image.shape[0] != 3:
            raise ValueError(f"an image must be [3, H, W], got {tuple(image.shape)}")
    if len(images) == 1:
        return images[0], None
    flat = torch.cat([image.reshape(-1) for image in images])
    sizes = torch.tensor([[int(image.shape[1]), int(image.shape[2])] for image in images], dtype=torch.long)
    return flat, sizes


def unpack_images(image: torch.Tensor, sizes: torch.Tensor | None = None) -> list[torch.Tensor]:
    """The inverse of ``pack_images``: the ``[3, H_i, W_i]`` images in order."""
    if sizes is None:
        if image.dim() != 3 or image.shape[0] != 3:
            raise ValueError(f"image must be [3, H, W] (or flat with sizes), got {tuple(image.shape)}")
        return [image]
    hw = sizes.reshape(-1, 2).tolist()
    counts = [3 * int(h) * int(w) for h, w in hw]
    if image.dim() != 1 or image.numel() != sum(counts) or any(c <= 0 for c in counts):
        raise ValueError(f"image holds {image.numel()} values; sizes {hw} need {sum(counts)} in a flat tensor")
    return [piece.reshape(3, int(h), int(w)) for piece, (h, w) in zip(image.split(counts), hw)]
