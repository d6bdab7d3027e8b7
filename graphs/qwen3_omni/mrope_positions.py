"""The Thinker's M-RoPE position ids: [3, T] (time, height, width) for a prompt, and the decode offset.

The Thinker rotates queries and keys by three position streams (see ``decoder.mrope_cos_sin``).
Text and audio tokens use the same value on all three axes, counting up one per token. An image's
pad tokens use a grid: they all start at the image's first position, and then add the merged patch's
row (height) and column (width). The time axis adds ``frame * position_id_per_seconds``, where
``frame`` is the image's temporal grid index (one frame for still images). The token after an image
comes one past the largest value the image used, so a prompt with images ends at a position below
its length, and decoding goes on from there: token ``i >= T`` sits at ``i + delta`` on all three axes.

This module does the same sums as transformers' ``get_rope_index`` (Qwen3-Omni-MoE) for one
unpadded sequence with no video and ``use_audio_in_video=False``. The tests check it against that
function.

Audio needs no lengths here. The reference works out each clip's span from its mel feature length
(``feature_attention_mask.sum(-1)``, put through the encoder's output-length formula), and then
numbers that span one per token, the same as text. A valid prompt has exactly that many audio pads,
so audio positions depend only on where the pads are, and those are already in ``input_ids``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

Grid = tuple[int, int, int]


def thinker_positions(
    input_ids: Sequence[int] | torch.Tensor, config: Any, image_grid_thw: Sequence[Sequence[int]] = ()
) -> tuple[torch.Tensor, int]:
    """Positions long [3, T] for a 1-D prompt, and ``delta`` (decode token ``i`` sits at ``i + delta``).

    ``config`` is a ``Qwen3OmniConfig`` or its ``thinker_config``. ``image_grid_thw`` has one
    ``(t, h, w)`` patch grid per image, in prompt order. It is the vision encoder's grid before the
    merge, so an image has ``t*h*w / spatial_merge_size**2`` pad tokens, and those pads follow a
    ``<|vision_start|>``. Raises ValueError when the pads and the grids do not match.
    """
    thinker = getattr(config, "thinker_config", config)
    device = input_ids.device if isinstance(input_ids, torch.Tensor) else torch.device("cpu")
    ids = _as_list(input_ids)
    grids = [_as_grid(g, i) for i, g in enumerate(image_grid_thw)]
    merge = int(thinker.vision_config.spatial_merge_size)
    per_second = int(thinker.position_id_per_seconds)
    runs = _image_runs(ids, thinker, grids, merge)

    pieces: list[torch.Tensor] = []
    next_pos, cursor = 0, 0  # next free position; first token not yet placed
    for (run_start, run_len), (t, h, w) in zip(runs, grids):
        pieces.append(_line(next_pos, run_start - cursor))  # text/audio before the image, vision_start included
        next_pos += run_start - cursor
        grid = torch.stack(
            torch.meshgrid(
                torch.arange(t) * per_second, torch.arange(h // merge), torch.arange(w // merge), indexing="ij"
            )
        ).reshape(3, -1)
        pieces.append(grid + next_pos)
        # The next token goes one past the image's largest value on any axis, not one past its last pad.
        next_pos += max((t - 1) * per_second, h // merge - 1, w // merge - 1) + 1
        cursor = run_start + run_len
    pieces.append(_line(next_pos, len(ids) - cursor))
    next_pos += len(ids) - cursor
    return torch.cat(pieces, dim=1).to(device), next_pos - len(ids)


def decode_positions(start: int, count: int, delta: int) -> torch.Tensor:
    """Positions long [3, count] for tokens ``start .. start+count-1`` after the prompt: index + delta."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    return _line(start + delta, count)


def _line(first: int, count: int) -> torch.Tensor:
    # Text, audio and the vision/audio markers: one step per token, the same on all three axes.
    return torch.arange(first, first + count, dtype=torch.long).expand(3, -1).clone()


def _as_list(input_ids: Sequence[int] | torch.Tensor) -> list[int]:
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() != 1:
            raise ValueError(f"input_ids must be 1-D (one unpadded sequence), got shape {tuple(input_ids.shape)}")
        return [int(x) for x in input_ids.tolist()]
    return [int(x) for x in input_ids]


def _as_grid(grid: Sequence[int], index: int) -> Grid:
    values = [int(x) for x in (grid.tolist() if isinstance(grid, torch.Tensor) else grid)]
    if len(values) != 3 or min(values) < 1:
        raise ValueError(f"image_grid_thw[{index}] = {values}: must be three positive ints (t, h, w)")
    return values[0], values[1], values[2]


def _image_runs(ids: list[int], thinker: Any, grids: list[Grid], merge: int) -> list[tuple[int, int]]:
    """(start, length) of each run of image pads. Checks that each run has a grid and the right length."""
    image_id, start_id = int(thinker.image_token_id), int(thinker.vision_start_token_id)
    if int(thinker.video_token_id) in ids:
        raise ValueError(
            f"the prompt has video pad tokens (id {thinker.video_token_id}); video positions are not implemented"
        )
    runs: list[tuple[int, int]] = []
    for i, tok in enumerate(ids):
        if tok != image_id:
            continue
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    if grids and not runs:
        raise ValueError(
            f"image_grid_thw has {len(grids)} grid(s) but the prompt has no image pad token (id {image_id})"
        )
    if len(runs) != len(grids):
        raise ValueError(
            f"the prompt has {len(runs)} image(s) (runs of image pad id {image_id}) but "
            f"image_grid_thw has {len(grids)} grid(s)"
        )
    for n, ((start, length), (t, h, w)) in enumerate(zip(runs, grids)):
        if h % merge or w % merge:
            raise ValueError(
                f"image {n}: grid (t={t}, h={h}, w={w}): h and w must be multiples of spatial_merge_size {merge}"
            )
        want = t * h * w // (merge * merge)
        if length != want:
            raise ValueError(
                f"image {n}: {length} image pad token(s) but grid (t={t}, h={h}, w={w}) needs t*h*w/{merge}^2 = {want}"
            )
        # The reference finds each image from its <|vision_start|>; pads without one would be misplaced there.
        if start == 0 or ids[start - 1] != start_id:
            raise ValueError(
                f"image {n}: its pad tokens at index {start} do not follow <|vision_start|> (id {start_id})"
            )
    return runs
