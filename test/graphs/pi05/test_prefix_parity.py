"""The pi0.5 prefix (SigLIP rows + prompt with state, bidirectional) vs transformers' PaliGemmaModel.

Both run on the same tiny checkpoint: transformers gets PaliGemma's names (the tied
embedding from openpi's ``lm_head.weight``), ours loads through ``mstar.weights`` and runs
over the paged KV with the prefix-bidirectional mask, as the AR engine drives it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from mstar.graph.node import NodeCall
from mstar_graphs.pi05 import reference
from mstar_graphs.pi05.prompt import build_prefix

transformers = pytest.importorskip("transformers")

PG = "paligemma_with_expert.paligemma."


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.fixture(scope="module")
def paligemma(ckpt, model):
    c = model.config
    v, p = c.vision, c.prefix
    cfg = transformers.PaliGemmaConfig(
        vision_config=dict(
            model_type="siglip_vision_model",
            hidden_size=v.width,
            intermediate_size=v.mlp_dim,
            num_hidden_layers=v.depth,
            num_attention_heads=v.heads,
            image_size=v.image_size,
            patch_size=v.patch_size,
            layer_norm_eps=v.layer_norm_eps,
            vision_use_head=False,
        ),
        text_config=dict(
            model_type="gemma",
            hidden_size=p.width,
            intermediate_size=p.mlp_dim,
            num_hidden_layers=p.depth,
            num_attention_heads=p.num_heads,
            num_key_value_heads=p.num_kv_heads,
            head_dim=p.head_dim,
            vocab_size=c.vocab_size,
            hidden_activation="gelu_pytorch_tanh",
            rms_norm_eps=c.rms_norm_eps,
            rope_theta=c.rope_theta,
            max_position_embeddings=c.max_positions,
        ),
        projection_dim=p.width,
        image_token_index=c.vocab_size,
        vocab_size=c.vocab_size,
    )
    hf = transformers.PaliGemmaModel(cfg).eval()
    state = {
        k.removeprefix("model."): t for k, t in load_file(str(ckpt / "model.safetensors")).items()
    }  # LeRobot names
    src = {k[len(PG + "model.") :]: t for k, t in state.items() if k.startswith(PG + "model.")}
    src["language_model.embed_tokens.weight"] = state[PG + "lm_head.weight"]  # tied; openpi stores this name
    mapped = {}
    for key in hf.state_dict():
        for cand in (key, key.replace("vision_tower.", "vision_tower.vision_model.", 1)):
            if cand in src:
                mapped[key] = src[cand]
    missing, unexpected = hf.load_state_dict(mapped, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return hf


def _observation(encoder, tokenizer, cameras: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (cameras, 224, 224, 3), generator=g, dtype=torch.uint8)
    state = torch.rand(6, generator=g) * 2 - 1
    ids, mask = build_prefix(tokenizer, cameras, "put the spoon next to the plate", state)
    return images, ids, mask


@torch.no_grad()
@pytest.mark.parametrize("cameras", [1, 2])
def test_prefix_hidden_matches_paligemma(model, encoder, tokenizer, paligemma, harness, cameras):
    images, ids, mask = _observation(encoder, tokenizer, cameras, seed=cameras)
    rows = encoder(**encoder.prepare_inputs([NodeCall("r", {"images": images})]))["embeds"][0]
    dense = torch.zeros(ids.shape[0], rows.shape[1])
    dense[mask] = rows

    ours = harness.prefill([SimpleNamespace(ids=ids, embeds=dense, mask=mask)])[0]

    hf_ids = ids.masked_fill(mask, model.config.vocab_size)  # PaliGemma's image token
    pixels = images.permute(0, 3, 1, 2).float() / 255.0 * 2.0 - 1.0
    ref = paligemma(
        input_ids=hf_ids[None],
        pixel_values=pixels,
        token_type_ids=torch.zeros_like(hf_ids)[None],
        position_ids=torch.arange(ids.shape[0])[None],
    ).last_hidden_state[0]  # openpi: 0-based
    assert ours.shape == ref.shape == (ids.shape[0], model.config.prefix.width)
    err = _rel_err(ours, ref)
    assert err < 1e-4, err

    # The dense reference agrees too, and a causal prefix would not: the mask matters here.
    dense_ref = reference.prefix_hidden(model, ids, embeds=rows, embed_mask=mask)
    assert _rel_err(dense_ref, ref) < 1e-4
    causal = paligemma(
        input_ids=hf_ids[None],
        pixel_values=pixels,
        token_type_ids=torch.ones_like(hf_ids)[None],
        position_ids=torch.arange(ids.shape[0])[None],
    ).last_hidden_state[0]
    assert _rel_err(causal, ref) > 1e-2


@torch.no_grad()
def test_packed_embeds_equal_row_aligned(model, encoder, tokenizer, harness):
    images, ids, mask = _observation(encoder, tokenizer, 1, seed=5)
    rows = encoder(**encoder.prepare_inputs([NodeCall("r", {"images": images})]))["embeds"][0]
    dense = torch.zeros(ids.shape[0], rows.shape[1])
    dense[mask] = rows
    a = model.llm.embed(ids, dense, mask)
    b = model.llm.embed(ids, rows, mask)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(ValueError, match="embeds must be"):
        model.llm.embed(ids, rows[:-1], mask)
    with pytest.raises(ValueError, match="embed_mask"):
        model.llm.embed(ids, dense, None)
