"""Drive BagelLLM over a dense KV the way the engine will: one forward per context part.

Parts are the reference's (``mstar_graphs.bagel.reference``): text causally, an image span (markers +
rows) with full attention inside its call; rope positions and row kinds from the reference's layout.
"""

from __future__ import annotations

import torch

from mstar_graphs.bagel import reference
from mstar_graphs.bagel.llm import BagelLLM
from support.dense_kv_attention import DenseKVAttention


@torch.no_grad()
def run_parts(
    model: BagelLLM,
    cache: DenseKVAttention,
    parts,
    markers: tuple[int, int],
    *,
    use_rope: bool = True,
    use_kinds: bool = True,
    need_hidden: bool = True,
) -> torch.Tensor:
    """One forward per part, appended to ``cache``; hidden [T, Hd] of every row, in order."""
    layout = reference.ref_layout(parts, markers, model.hidden_size)
    out, at = [], 0
    for kind, value in parts:
        n = len(value) if kind == "text" else value.shape[0] + 2
        sl = slice(at, at + n)
        cache.causal = kind == "text"
        start = len(cache)
        hidden = model(
            layout.ids[sl],
            torch.arange(start, start + n),
            cache,
            embeds=layout.embeds[sl],
            embed_mask=layout.embed_mask[sl],
            rope_positions=layout.rope[None, sl] if use_rope else None,
            row_kinds=layout.gen[sl].long() if use_kinds else None,
            need_hidden=need_hidden,
        )
        out.append(hidden)
        at += n
    return torch.cat(out) if out else torch.zeros(0, model.hidden_size)


def next_rope(parts) -> int:
    """The rope counter after ``parts``: +1 per text token, +1 per image span (0 for an empty context)."""
    return sum(len(value) if kind == "text" else 1 for kind, value in parts)
