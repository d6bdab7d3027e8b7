"""A generation's three contexts from interleaved texts and images: the module's parts vs the reference's
own builder (reference.ref_interleave_contexts), and the context node's rows in each view's span order."""

from __future__ import annotations

import pytest
import torch

from mstar_graphs.bagel import reference
from mstar_graphs.bagel.context_layout import GEN, UND, ImagePart, Markers, TextPart, span_rows, view_inputs
from mstar_graphs.bagel.interleaved_contexts import generation_contexts

ORDERS = [
    ["img", "img", "put the first in the second"],
    ["img", "the scene", "img", "swap their colours"],
    ["a prompt first", "img", "then the edit"],
]


def _ours(tok, order):
    items, n = [], 0
    for item in order:
        if item == "img":
            n += 1
            items.append((ImagePart("vae", 10 * n), ImagePart("vit", 10 * n + 1)))
        else:
            items.append(TextPart(tuple(tok.text_turn(item))))
    return generation_contexts(items)


def _theirs(tok, order):
    inputs, n = [], 0
    for item in order:
        if item == "img":
            n += 1
            inputs.append(("image", (torch.zeros(10 * n, 1), torch.zeros(10 * n + 1, 1))))
        else:
            inputs.append(("text", item))
    return reference.ref_interleave_contexts(tok, inputs)


def _shape(parts):
    """Parts as comparable tuples: text ids, or (kind, rows)."""
    out = []
    for p in parts:
        if isinstance(p, TextPart):
            out.append(("text", list(p.ids)))
        elif isinstance(p, ImagePart):
            out.append(("gen_rows" if p.kind == "vae" else "und_rows", p.rows))
        else:
            kind, value = p
            out.append((kind, list(value) if kind == "text" else value.shape[0]))
    return out


@pytest.mark.parametrize("order", ORDERS)
def test_contexts_equal_the_references(tok, order):
    ours, theirs = _ours(tok, order), _theirs(tok, order)
    assert _shape(ours.full) == _shape(theirs["gen"])
    assert _shape(ours.no_text) == _shape(theirs["cfg_text"])
    assert _shape(ours.no_image) == _shape(theirs["cfg_img"])
    assert ours.after_no_text() == [ours.full[-1]]  # what the full view adds to the no-text view's fork


def test_a_view_takes_each_images_rows_where_its_spans_are(tok, markers):
    ours = _ours(tok, ORDERS[1])
    laid = view_inputs(ours.full, Markers(*markers))
    vae = torch.arange(10 + 20, dtype=torch.float32)[:, None]  # image 1: 10 VAE rows, image 2: 20
    vit = 100 + torch.arange(11 + 21, dtype=torch.float32)[:, None]
    rows = span_rows(laid.spans, laid.row_kinds, {GEN: vae, UND: vit})
    want = torch.cat([vae[:10], vit[:11], vae[10:], vit[11:]])
    assert torch.equal(rows, want) and rows.shape[0] == int(laid.embed_mask.sum())
    prefix = view_inputs(ours.no_text, Markers(*markers))  # the no-text view: both images too, same order
    assert torch.equal(span_rows(prefix.spans, prefix.row_kinds, {GEN: vae, UND: vit}), want)
    with pytest.raises(ValueError, match="ViT rows are 31"):
        span_rows(laid.spans, laid.row_kinds, {GEN: vae, UND: vit[:-1]})
