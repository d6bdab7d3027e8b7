"""One LLM context of BAGEL as the engine takes it: token ids, rope positions, spans and row kinds.

A context is a list of parts in order: text turns and image spans. BAGEL's positions are a
per-context counter, not the KV index: a text token takes the next position; a whole image span
(``<|vision_start|>``, its N rows, ``<|vision_end|>``) shares ONE position and then the counter moves
by one. Image spans are attended bidirectionally (``spans``); VAE latent rows are generation rows
(``row_kinds`` 1: the ``*_moe_gen`` weights), everything else understanding rows (0). Image rows enter
as embeddings (``embed_mask``), in part order, so the view's ``embeds`` are its image rows concatenated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

PLACEHOLDER_ID = 0  # the id under an embedding row (never embedded: the row takes its embedding)
UND, GEN = 0, 1  # row kinds: understanding weights, generation (MoT ``*_moe_gen``) weights


@dataclass(frozen=True)
class TextPart:
    ids: tuple[int, ...]  # a whole turn: <|im_start|> text <|im_end|> (or any ids to append as they are)


@dataclass(frozen=True)
class ImagePart:
    kind: Literal["vit", "vae"]  # ViT rows (understanding) or clean VAE latent rows (generation weights)
    rows: int  # N: the image's tokens, without the two markers


Part = TextPart | ImagePart


@dataclass(frozen=True)
class Markers:
    vision_start: int
    vision_end: int


@dataclass
class ViewInputs:
    """The call inputs of one view's prefill (every field [T] over the call's rows unless said)."""

    input_ids: torch.Tensor
    embed_mask: torch.Tensor  # bool
    rope_positions: torch.Tensor  # [1, T]
    spans: torch.Tensor  # [k, 2] call-local [start, end) of each image span
    row_kinds: torch.Tensor
    next_position: int  # the counter after the context: the next text token's (or image span's) position
    images: list[ImagePart] = field(default_factory=list)  # in embedding order

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.numel())

    def tensors(self) -> dict[str, torch.Tensor]:
        """The inputs the engine reads (``spans``/``row_kinds`` only where there is an image)."""
        out = {"input_ids": self.input_ids, "rope_positions": self.rope_positions}
        if self.images:
            out |= {"embed_mask": self.embed_mask, "spans": self.spans, "row_kinds": self.row_kinds}
        return out


def view_inputs(parts: list[Part], markers: Markers, start_position: int = 0) -> ViewInputs:
    """Lays out ``parts`` after a context whose counter is at ``start_position``."""
    ids: list[int] = []
    rope: list[int] = []
    kinds: list[int] = []
    embed: list[bool] = []
    spans: list[tuple[int, int]] = []
    images: list[ImagePart] = []
    pos = start_position
    for part in parts:
        if isinstance(part, TextPart):
            if not part.ids:
                raise ValueError("a text part has no tokens")
            ids.extend(part.ids)
            rope.extend(range(pos, pos + len(part.ids)))
            kinds.extend([UND] * len(part.ids))
            embed.extend([False] * len(part.ids))
            pos += len(part.ids)
            continue
        if part.rows < 1:
            raise ValueError(f"an image part has {part.rows} rows")
        start = len(ids)
        ids.extend([markers.vision_start, *([PLACEHOLDER_ID] * part.rows), markers.vision_end])
        rope.extend([pos] * (part.rows + 2))
        row_kind = GEN if part.kind == "vae" else UND
        kinds.extend([UND, *([row_kind] * part.rows), UND])
        embed.extend([False, *([True] * part.rows), False])
        spans.append((start, len(ids)))
        images.append(part)
        pos += 1
    return ViewInputs(
        input_ids=torch.tensor(ids, dtype=torch.long),
        embed_mask=torch.tensor(embed, dtype=torch.bool),
        rope_positions=torch.tensor([rope], dtype=torch.long),
        spans=torch.tensor(spans, dtype=torch.long).reshape(-1, 2),
        row_kinds=torch.tensor(kinds, dtype=torch.long),
        next_position=pos,
        images=images,
    )


def span_rows(spans: torch.Tensor, row_kinds: torch.Tensor, sources: dict[int, torch.Tensor]) -> torch.Tensor:
    """A view's image rows in the order its spans come: each span takes the next rows of its kind's source
    (``sources[GEN]``: the VAE rows of the request's images in order, ``sources[UND]``: their ViT rows), so
    a context interleaving several images (VAE 1, ViT 1, VAE 2, ViT 2 ...) gets each image's rows where
    its spans are. A view holding a prefix of the images takes the first ones."""
    taken = {UND: 0, GEN: 0}
    pieces = []
    for start, end in spans.reshape(-1, 2).tolist():
        n = end - start - 2
        kind = int(row_kinds[start + 1])
        source = sources.get(kind)
        at = taken.get(kind, 0)
        if source is None or at + n > source.shape[0]:
            have = 0 if source is None else source.shape[0]
            name = "VAE" if kind == GEN else "ViT"
            raise ValueError(f"a {name} span of {n} rows after {at}: the request's {name} rows are {have}")
        pieces.append(source[at : at + n])
        taken[kind] = at + n
    if not pieces:
        raise ValueError("a view with image rows has no span")
    return torch.cat(pieces)
