"""LatentEmbedder: vae2llm + timestep embedding (cos first, no x1000) + the latent sin-cos rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mstar_graphs.bagel.latent_embed import LatentEmbedder
from mstar_graphs.bagel.latent_tokens import latent_pos_ids
from mstar_graphs.bagel.sincos import sincos_2d_table
from support.bagel_vision import LATENT_CHANNELS, LATENT_GRID, LATENT_PATCH, LLM_HIDDEN, write_tiny_vision_dir


@pytest.fixture(scope="module")
def embedder(tmp_path_factory) -> LatentEmbedder:
    ckpt = write_tiny_vision_dir(tmp_path_factory.mktemp("bagel_latent"))
    return LatentEmbedder.from_pretrained_dir(ckpt, LLM_HIDDEN, LATENT_GRID, LATENT_PATCH, LATENT_CHANNELS)


@torch.no_grad()
def test_rows_are_the_sum_of_three_parts(embedder):
    tokens = torch.randn(6, 64, generator=torch.Generator().manual_seed(0))
    ids = latent_pos_ids(32, 48, 16, LATENT_GRID)
    t = 0.7
    half = torch.arange(128, dtype=torch.float32)
    freqs = torch.exp(-torch.log(torch.tensor(10000.0)) * half / 128)
    features = torch.cat([torch.cos(t * freqs), torch.sin(t * freqs)])  # cos first, t not scaled
    mlp = embedder.time_embedder.mlp
    time_row = F.linear(F.silu(F.linear(features, mlp[0].weight, mlp[0].bias)), mlp[2].weight, mlp[2].bias)
    table = sincos_2d_table(LLM_HIDDEN, LATENT_GRID)
    expected = F.linear(tokens, embedder.vae2llm.weight, embedder.vae2llm.bias) + time_row + table[ids]
    out = embedder(tokens, t, ids)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(embedder(tokens, torch.full((6,), t), ids), out)
    assert torch.equal(embedder.latent_pos_embed.pos_embed, table)  # the generated file holds the real table


@torch.no_grad()
def test_time_zero_features(embedder):
    seen = []
    hook = embedder.time_embedder.mlp[0].register_forward_hook(lambda m, args, out: seen.append(args[0]))
    try:
        embedder(torch.zeros(1, 64), 0.0, torch.tensor([0]))
    finally:
        hook.remove()
    assert seen[0].tolist() == [[1.0] * 128 + [0.0] * 128]


def test_bad_inputs(embedder):
    with pytest.raises(ValueError, match=r"\[N, 64\]"):
        embedder(torch.zeros(2, 63), 0.0, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="pos_ids"):
        embedder(torch.zeros(2, 64), 0.0, torch.tensor([0]))
    with pytest.raises(ValueError, match="1 or 2 times"):
        embedder(torch.zeros(2, 64), torch.zeros(3), torch.tensor([0, 1]))
