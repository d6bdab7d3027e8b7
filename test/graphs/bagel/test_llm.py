"""BagelLLM driven call by call over a dense KV (as the engine drives it) vs the naive reference.

Each context part is one forward: text causally, an image span (markers + rows) with full attention
inside the call; rope positions and row kinds from the reference's layout. The reference recomputes
everything at once with its static [T, T] mask, from the raw ema.safetensors tensors.
"""

from __future__ import annotations

import pytest
import torch

from mstar_graphs.bagel import reference
from support.bagel_contexts import next_rope, run_parts
from support.dense_kv_attention import DenseKVAttention

TOL = 1e-5


def _rows(seed: int, n: int, hidden: int = 64) -> torch.Tensor:
    return torch.randn(n, hidden, generator=torch.Generator().manual_seed(seed))


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def test_text_only_is_causal_parity(model, state, config, tok, markers):
    parts = [("text", tok.text_turn("Describe this image in detail."))]
    ours = run_parts(model, DenseKVAttention(2), parts, markers)
    ref = reference.ref_hidden(state, config.llm, parts, markers)
    assert ours.shape == ref.shape == (len(parts[0][1]), 64)
    assert _max_err(ours, ref) < TOL


def test_text_understanding_span_text(model, state, config, tok, markers):
    parts = [
        ("text", tok.text_turn("A photo of a cat.")),
        ("und_rows", _rows(1, 5)),
        ("text", tok.text_turn("What is in the picture?")),
    ]
    ours = run_parts(model, DenseKVAttention(2), parts, markers)
    ref = reference.ref_hidden(state, config.llm, parts, markers)
    assert _max_err(ours, ref) < TOL
    # the shared span position matters: KV-index positions give other hidden states after the image
    plain = run_parts(model, DenseKVAttention(2), parts, markers, use_rope=False)
    assert _max_err(plain, ref) > 1e-3


def test_generation_rows_use_the_gen_weights(model, state, config, tok, markers):
    parts = [
        ("text", tok.text_turn("Change the color of the car to blue.")),
        ("gen_rows", _rows(2, 4)),  # a clean VAE context image
        ("und_rows", _rows(3, 3)),  # its ViT rows
        ("text", tok.text_turn("add snow")),
        ("gen_rows", _rows(4, 4)),  # the rows being generated
    ]
    ours = run_parts(model, DenseKVAttention(2), parts, markers)
    ref = reference.ref_hidden(state, config.llm, parts, markers)
    assert _max_err(ours, ref) < TOL
    und_only = run_parts(model, DenseKVAttention(2), parts, markers, use_kinds=False)
    assert _max_err(und_only, ref) > 1e-3
    # understanding rows before the first latent span do not see it: identical either way
    first_text = len(parts[0][1])
    assert _max_err(und_only[:first_text], ref[:first_text]) < TOL


def test_prefill_without_hidden_leaves_the_same_kv(model, tok, markers):
    parts = [("text", tok.text_turn("hello")), ("gen_rows", _rows(5, 3))]
    full, kv_only = DenseKVAttention(2), DenseKVAttention(2)
    run_parts(model, full, parts, markers)
    run_parts(model, kv_only, parts, markers, need_hidden=False)
    for a, b in zip(full.k + full.v, kv_only.k + kv_only.v):
        assert torch.equal(a, b)


@pytest.mark.parametrize("kinds", [False, True])
def test_hidden_rows_return_just_those_rows(model, tok, markers, kinds):
    # one span call of understanding rows then latent rows (with kinds: both weight sets in the last layer)
    parts = [("und_rows", _rows(7, 3)), ("gen_rows", _rows(8, 4))]
    layout = reference.ref_layout(parts, markers, model.hidden_size)
    n = layout.ids.shape[0]
    full, narrow = DenseKVAttention(2), DenseKVAttention(2)
    full.causal = narrow.causal = False
    args = dict(
        embeds=layout.embeds,
        embed_mask=layout.embed_mask,
        rope_positions=layout.rope[None],
        row_kinds=layout.gen.long() if kinds else None,
    )
    with torch.no_grad():
        every = model(layout.ids, torch.arange(n), full, **args)
        picked = torch.tensor([n - 1, 1, n - 3])
        some = model(layout.ids, torch.arange(n), narrow, hidden_rows=picked, **args)
    assert some.shape == (3, model.hidden_size)
    assert _max_err(some, every[picked]) < TOL
    for a, b in zip(full.k + full.v, narrow.k + narrow.v):  # every row's KV is still written
        assert torch.equal(a, b)


@torch.no_grad()
def test_greedy_understanding_matches_reference(model, state, config, tok, markers):
    parts = [("text", tok.text_turn("Describe")), ("und_rows", _rows(6, 4)), ("text", tok.text_turn("What is it?"))]
    steps = 6
    ref = reference.ref_understand(state, config.llm, tok, parts, max_new_tokens=steps)

    cache = DenseKVAttention(2)
    run_parts(model, cache, parts, markers)
    rope = next_rope(parts)
    tokens, current = [], tok.special.im_start
    for _ in range(steps):
        tokens.append(current)
        cache.causal = True
        hidden = model(
            torch.tensor([current]), torch.tensor([len(cache)]), cache, rope_positions=torch.tensor([[rope]])
        )
        rope += 1
        logits = model.compute_logits(hidden)
        assert torch.allclose(logits, reference.ref_logits(state, hidden), atol=1e-5)
        some = torch.tensor([3, 7, tok.special.im_end])
        assert torch.allclose(model.compute_logits(hidden, some), logits[:, some], atol=1e-6)
        current = int(logits.argmax(-1))
        if current == tok.special.im_end:
            break
    assert tokens == ref.tokens and tokens[0] == tok.special.im_start
    assert tok.decode(tokens).split("<|im_start|>")[1] == ref.text


def test_velocity_head_is_llm2vae(model, state):
    hidden = _rows(7, 3)
    assert torch.allclose(model.velocity_head(hidden), reference.ref_velocity(state, hidden), atol=1e-6)


def test_bad_inputs_are_named(model):
    cache = DenseKVAttention(2)
    ids = torch.tensor([1, 2, 3])
    with pytest.raises(ValueError, match="rope_positions must be"):
        model(ids, torch.arange(3), cache, rope_positions=torch.zeros(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="row_kinds must be"):
        model(ids, torch.arange(3), cache, row_kinds=torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="embeds must be"):
        model(ids, torch.arange(3), cache, embeds=torch.zeros(3, 32), embed_mask=torch.ones(3, dtype=torch.bool))


@torch.no_grad()
def test_bfloat16_load_runs_close_to_fp32(ckpt, model, tok, markers):
    from mstar_graphs.bagel.llm import BagelLLM

    half = BagelLLM.from_pretrained_dir(ckpt, dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16 and half.rope_cos.dtype == torch.bfloat16
    parts = [("text", tok.text_turn("hello")), ("gen_rows", _rows(8, 3))]
    fp32 = run_parts(model, DenseKVAttention(2), parts, markers)
    bf16 = run_parts(half, DenseKVAttention(2), parts, markers)
    assert bf16.dtype == torch.bfloat16
    assert float((bf16.float() - fp32).abs().max()) < 0.05 * float(fp32.abs().max())  # bf16 rounding: ~1.5% seen
