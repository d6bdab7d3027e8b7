"""Latent <-> token layout (rows (py, px, c)), latent position ids, and the truncating uint8 output."""

from __future__ import annotations

import pytest
import torch

from mstar_graphs.bagel.latent_tokens import latent_pos_ids, patchify_latent, to_uint8_image, unpatchify_latent


def test_patchify_row_order_and_round_trip():
    c, h, w, p = 3, 2, 3, 2
    z = torch.randn(c, h * p, w * p, generator=torch.Generator().manual_seed(0))
    tokens = patchify_latent(z, p)
    assert tokens.shape == (h * w, p * p * c)
    for i in range(h):
        for j in range(w):
            for py in range(p):
                for px in range(p):
                    for ch in range(c):
                        assert tokens[i * w + j, (py * p + px) * c + ch] == z[ch, i * p + py, j * p + px]
    assert torch.equal(unpatchify_latent(tokens, h, w, p, c), z)
    with pytest.raises(ValueError, match="multiples of 2"):
        patchify_latent(torch.zeros(3, 3, 4), 2)
    with pytest.raises(ValueError, match=r"\[6, 12\]"):
        unpatchify_latent(tokens[:5], h, w, p, c)


def test_latent_pos_ids():
    assert latent_pos_ids(32, 48, 16, 64).tolist() == [0, 1, 2, 64, 65, 66]
    with pytest.raises(ValueError, match="multiples of 16"):
        latent_pos_ids(40, 48)
    with pytest.raises(ValueError, match="at most 4 per side"):
        latent_pos_ids(80, 16, 16, 4)


def test_uint8_truncates():
    x = torch.tensor([2 * (254.9 / 255) - 1, -3.0, 3.0, 0.0]).reshape(1, 2, 2).expand(3, 2, 2)
    out = to_uint8_image(x)
    assert out.shape == (2, 2, 3) and out.dtype == torch.uint8
    assert out[..., 0].flatten().tolist() == [254, 0, 255, 127]  # 127.5 -> 127: truncation, not rounding
