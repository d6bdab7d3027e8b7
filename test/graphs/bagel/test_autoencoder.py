"""FLUX VAE: shape inferred from ae.safetensors, encode/decode, Downsample and AttnBlock vs direct sums."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from mstar.weights import WeightsError
from mstar_graphs.bagel.autoencoder import AttnBlock, Downsample, FluxAutoencoder, VaeShape, infer_vae_shape
from mstar_graphs.bagel.tiny_vision import randomise
from support.bagel_vision import write_tiny_vision_dir


@pytest.fixture(scope="module")
def ae_file(tmp_path_factory):
    return write_tiny_vision_dir(tmp_path_factory.mktemp("bagel_vae")) / "ae.safetensors"


@pytest.fixture(scope="module")
def vae(ae_file) -> FluxAutoencoder:
    return FluxAutoencoder.from_file(ae_file)


def test_shape_inferred_from_tensors(vae):
    assert vae.shape == VaeShape(ch=32, ch_mult=(1, 1, 1, 1), num_res_blocks=1, z_channels=16)
    assert vae.downsample == 8
    # the release's shape, from names and shapes alone
    real = {n: tuple(t.shape) for n, t in FluxAutoencoder(VaeShape(), device="meta").state_dict().items()}
    assert real["encoder.down.1.block.0.nin_shortcut.weight"] == (256, 128, 1, 1)
    assert real["decoder.up.0.block.2.conv2.weight"] == (128, 128, 3, 3)
    assert "decoder.up.0.upsample.conv.weight" not in real and "encoder.down.3.downsample.conv.weight" not in real
    assert infer_vae_shape(real) == VaeShape()


@torch.no_grad()
def test_encode_decode(vae):
    x = torch.rand(2, 3, 16, 24, generator=torch.Generator().manual_seed(0)) * 2 - 1
    moments = vae.encoder(x)
    mean, logvar = moments.chunk(2, dim=1)
    z = vae.encode(x)
    assert z.shape == (2, 16, 2, 3)
    torch.testing.assert_close(z, 0.3611 * (mean - 0.1159))
    sampled = vae.encode(x, generator=torch.Generator().manual_seed(5))
    noise = torch.randn(mean.shape, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(sampled, 0.3611 * (mean + torch.exp(0.5 * logvar) * noise - 0.1159))
    out = vae.decode(z)
    assert out.shape == (2, 3, 16, 24)
    torch.testing.assert_close(out, vae.decoder(z / 0.3611 + 0.1159))
    with pytest.raises(ValueError, match="multiples of 8"):
        vae.encode(torch.zeros(1, 3, 12, 16))
    with pytest.raises(ValueError, match=r"\[B, 16, h, w\]"):
        vae.decode(torch.zeros(1, 4, 2, 2))


@torch.no_grad()
def test_downsample_pads_right_and_bottom():
    down = Downsample(2)
    randomise(down, torch.Generator().manual_seed(1))
    x = torch.randn(1, 2, 5, 4, generator=torch.Generator().manual_seed(2))
    out = down(x)
    assert out.shape == (1, 2, 2, 2)
    w, b = down.conv.weight, down.conv.bias
    for o in range(2):
        for y in range(2):
            for xx in range(2):
                total = b[o].item()
                for c in range(2):
                    for ky in range(3):
                        for kx in range(3):
                            r, col = 2 * y + ky, 2 * xx + kx  # rows/cols past the edge are the zero padding
                            if r < 5 and col < 4:
                                total += w[o, c, ky, kx].item() * x[0, c, r, col].item()
                assert out[0, o, y, xx].item() == pytest.approx(total, abs=1e-5)


@torch.no_grad()
def test_attention_block_direct():
    block = AttnBlock(32)
    randomise(block, torch.Generator().manual_seed(3))
    x = torch.randn(1, 32, 2, 3, generator=torch.Generator().manual_seed(4))
    flat = x[0].reshape(32, 6)  # [c, positions]
    groups = flat.reshape(32, 1, 6)  # 32 groups of one channel each
    normed = (groups - groups.mean((1, 2), keepdim=True)) / torch.sqrt(
        groups.var((1, 2), unbiased=False, keepdim=True) + 1e-6
    )
    normed = normed.reshape(32, 6) * block.norm.weight[:, None] + block.norm.bias[:, None]

    def conv1x1(conv, v):
        return conv.weight[:, :, 0, 0] @ v + conv.bias[:, None]

    q, k, v = conv1x1(block.q, normed), conv1x1(block.k, normed), conv1x1(block.v, normed)
    weights = torch.softmax(q.T @ k / math.sqrt(32), dim=-1)  # [positions, positions], one head of width c
    expected = flat + conv1x1(block.proj_out, (weights @ v.T).T)
    torch.testing.assert_close(block(x)[0].reshape(32, 6), expected, rtol=1e-5, atol=1e-5)


def test_bad_files(ae_file, tmp_path):
    tensors = load_file(str(ae_file))
    del tensors["decoder.conv_in.weight"]
    save_file(tensors, str(tmp_path / "ae.safetensors"))
    with pytest.raises(WeightsError, match="decoder.conv_in.weight"):
        FluxAutoencoder.from_file(tmp_path)
    tensors = load_file(str(ae_file))
    del tensors["decoder.mid.attn_1.q.bias"]
    save_file(tensors, str(tmp_path / "ae.safetensors"))
    with pytest.raises(WeightsError, match=r"decoder\.mid\.attn_1\.q\.bias"):
        FluxAutoencoder.from_file(tmp_path / "ae.safetensors")
    with pytest.raises(ValueError, match="multiples of 32"):
        FluxAutoencoder(VaeShape(ch=48))
