"""tools/bagel_reference_run.py and its stubs (bagel_reference_stubs.py): the pure helpers (the exact varlen
attention stub, sizes, AE params, cases).

What needs the BAGEL reference source (building and running it) is exercised by hand; nothing here
imports it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[2] / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tool = _load("bagel_reference_run")
stubs = _load("bagel_reference_stubs")


def sdpa_one(q, k, v, causal_offset=None):
    """One sequence through torch's SDPA with kv heads expanded and an explicit mask."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    mask = None
    if causal_offset is not None:
        mask = torch.arange(k.shape[0])[None, :] <= torch.arange(q.shape[0])[:, None] + causal_offset
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask
    )
    return out.transpose(0, 1)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_attention_matches_sdpa_per_sequence_with_gqa(causal):
    gen = torch.Generator().manual_seed(0)
    lq, lk = [3, 1, 5], [7, 4, 5]  # prefill after a cache, one decode row, a fresh prefill
    q = torch.randn(sum(lq), 4, 8, generator=gen)
    k = torch.randn(sum(lk), 2, 8, generator=gen)
    v = torch.randn(sum(lk), 2, 8, generator=gen)
    cu_q, cu_k = torch.tensor([0, 3, 4, 9]), torch.tensor([0, 7, 11, 16])
    out = stubs.varlen_attention(q, k, v, cu_q, cu_k, causal=causal)
    for i in range(3):
        qs, ks, vs = q[cu_q[i] : cu_q[i + 1]], k[cu_k[i] : cu_k[i + 1]], v[cu_k[i] : cu_k[i + 1]]
        # bottom-right alignment: the last query sees every key
        want = sdpa_one(qs, ks, vs, causal_offset=lk[i] - lq[i] if causal else None)
        torch.testing.assert_close(out[cu_q[i] : cu_q[i + 1]], want, atol=1e-5, rtol=1e-5)


def test_varlen_attention_causal_masks_future_keys_and_honours_scale():
    q, k, v = torch.randn(2, 1, 4), torch.randn(2, 1, 4), torch.tensor([[[1.0] * 4], [[5.0] * 4]])
    out = stubs.varlen_attention(q, k, v, torch.tensor([0, 2]), torch.tensor([0, 2]), causal=True)
    assert torch.equal(out[0], v[0])  # the first row sees only the first key
    flat = stubs.varlen_attention(q, k, v, torch.tensor([0, 2]), torch.tensor([0, 2]), softmax_scale=0.0)
    torch.testing.assert_close(flat, torch.full((2, 1, 4), 3.0))  # scale 0 -> uniform weights


def test_varlen_attention_rejects_heads_not_divisible():
    with pytest.raises(ValueError, match="multiple"):
        stubs.varlen_attention(
            torch.zeros(2, 3, 4), torch.zeros(2, 2, 4), torch.zeros(2, 2, 4), torch.tensor([0, 2]), torch.tensor([0, 2])
        )


def test_flash_stub_refuses_features_it_does_not_model():
    q = torch.zeros(2, 1, 4)
    with pytest.raises(NotImplementedError):
        stubs._flash_attn_varlen_func(q, q, q, torch.tensor([0, 2]), torch.tensor([0, 2]), 2, 2, window_size=(1, 1))


def test_bagel_sizes_defaults_and_overrides():
    assert tool.bagel_sizes({}) == tool.APP_SIZES
    tiny = tool.bagel_sizes({"mstar_bagel": {"max_latent_size": 8, "vit_transform": [56, 28, 14]}})
    assert tiny["max_latent_size"] == 8 and tiny["vit_transform"] == [56, 28, 14]
    assert tiny["vit_max_num_patch_per_side"] == 70
    assert tool.bagel_sizes({"mstar_bagel": {"latent_channels": 16}})["latent_channels"] == 16
    with pytest.raises(ValueError, match="unknown keys"):
        tool.bagel_sizes({"mstar_bagel": {"latent_grid": 8}})
    with pytest.raises(ValueError, match="vae_transform"):
        tool.bagel_sizes({"mstar_bagel": {"vae_transform": [64, 32]}})


def ae_shapes(ch, mults, blocks, z):
    shapes = {"encoder.conv_in.weight": (ch, 3, 3, 3), "decoder.conv_in.weight": (ch * mults[-1], z, 3, 3)}
    for level, mult in enumerate(mults):
        for block in range(blocks):
            shapes[f"encoder.down.{level}.block.{block}.conv1.weight"] = (ch * mult, ch, 3, 3)
    return shapes


def test_ae_params_from_shapes_reads_flux_and_tiny_sizes():
    flux = tool.ae_params_from_shapes(ae_shapes(128, [1, 2, 4, 4], 2, 16))
    assert {k: flux[k] for k in tool.LOAD_AE_PARAMS} == tool.LOAD_AE_PARAMS
    assert flux["downsample"] == 8
    tiny = tool.ae_params_from_shapes(ae_shapes(32, [1, 1, 1], 1, 4))
    assert tiny == {"ch": 32, "ch_mult": [1, 1, 1], "num_res_blocks": 1, "z_channels": 4, "downsample": 4}
    with pytest.raises(ValueError, match="decoder.conv_in.weight"):
        tool.ae_params_from_shapes({"encoder.conv_in.weight": (32, 3, 3, 3)})


def test_load_cases_validates_and_resolves(tmp_path):
    cases = tool.load_cases(
        {
            "cases": [
                {"kind": "t2i", "prompt": "a cube", "noise": "n.npy"},
                {"kind": "t2i", "prompt": "again"},
                {"kind": "probe", "text": "hi"},
            ]
        },
        tmp_path,
    )
    assert [c["name"] for c in cases] == ["t2i", "t2i1", "probe"]
    assert cases[0]["noise"] == str(tmp_path / "n.npy")
    with pytest.raises(ValueError, match="unknown fields"):
        tool.load_cases({"cases": [{"kind": "t2i", "prompt": "x", "steps": 4}]}, tmp_path)
    with pytest.raises(ValueError, match="missing field 'image'"):
        tool.load_cases({"cases": [{"kind": "edit", "prompt": "x"}]}, tmp_path)
    with pytest.raises(ValueError, match="kind"):
        tool.load_cases({"cases": [{"kind": "video"}]}, tmp_path)


def test_flow_params_case_over_defaults():
    defaults = {**tool.FLOW_DEFAULTS}
    params = tool.flow_params({"name": "c", "num_timesteps": 4, "cfg_interval": [0, 1]}, defaults)
    assert params["num_timesteps"] == 4 and params["cfg_interval"] == [0.0, 1.0] and params["cfg_text_scale"] == 4.0
    with pytest.raises(ValueError, match="cfg_renorm_type"):
        tool.flow_params({"name": "c", "cfg_renorm_type": "local"}, defaults)
    with pytest.raises(ValueError, match="num_timesteps"):
        tool.flow_params({"name": "c", "num_timesteps": 1}, defaults)


def test_torchvision_stub_resizes_and_normalises_like_image_transform():
    from PIL import Image

    stub = stubs._torchvision_stub()
    functional, transforms = stub["torchvision.transforms.functional"], stub["torchvision.transforms"]
    img = Image.new("RGB", (6, 4), (255, 0, 51))
    resized = functional.resize(img, (2, 3), transforms.InterpolationMode.BICUBIC)
    assert resized.size == (3, 2)
    assert functional.resize(img, (4, 6), transforms.InterpolationMode.BICUBIC) is img
    tensor = transforms.Normalize([0.5] * 3, [0.5] * 3)(transforms.ToTensor()(img))
    assert tensor.shape == (3, 4, 6)
    torch.testing.assert_close(tensor[:, 0, 0], torch.tensor([1.0, -1.0, -0.6]))


def test_float32_torch_proxy_turns_bf16_casts_into_fp32():
    proxy = stubs._Float32Torch("torch")
    assert proxy.bfloat16 is torch.float32 and proxy.zeros is torch.zeros
    assert torch.ones(2).to(proxy.bfloat16).dtype == torch.float32
