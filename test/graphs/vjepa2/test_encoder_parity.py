"""Our V-JEPA 2 encoder vs transformers' VJEPA2Model, through our loader, in both layouts."""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
import transformers

from mstar.graph.node import NodeCall
from mstar_graphs.vjepa2.checkpoints import load_encoder, resolve_source
from mstar_graphs.vjepa2.encoder import IMAGENET_MEAN, IMAGENET_STD, prepare_frames


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _hf_model(tmp_path):
    cfg = transformers.VJEPA2Config(
        hidden_size=64,
        num_attention_heads=4,
        num_hidden_layers=2,
        mlp_ratio=2.0,
        crop_size=32,
        patch_size=8,
        frames_per_clip=8,
        tubelet_size=2,
        pred_hidden_size=32,
        pred_num_attention_heads=4,
        pred_num_hidden_layers=1,
    )
    torch.manual_seed(3)
    model = transformers.VJEPA2Model(cfg).eval()
    with torch.no_grad():  # non-trivial norms and biases, so a swapped name cannot pass
        for _name, p in model.named_parameters():
            if p.dim() == 1:
                p.normal_(0.0, 0.3)
    model.save_pretrained(tmp_path / "hf")
    return model


def test_encoder_matches_transformers_in_its_layout(tmp_path):
    hf = _hf_model(tmp_path)
    source = resolve_source(tmp_path / "hf")
    assert source.hf_encoder is not None and source.config.encoder.heads == 4
    ours = load_encoder(source)
    torch.manual_seed(0)
    pixels = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        want = hf(pixel_values_videos=pixels[:, None], skip_predictor=True).last_hidden_state
        got = ours.encode_pixels(pixels)
    assert got.shape == want.shape == (3, 16, 64)
    assert _rel_err(got, want) < 1e-4


def test_encoder_matches_transformers_from_meta_layout(tmp_path):
    """The same weights written as Meta's AC file (fused qkv, ``module.backbone.`` names)."""
    hf = _hf_model(tmp_path)
    state = hf.state_dict()
    meta = {}
    for name, t in state.items():
        if not name.startswith("encoder."):
            continue
        n = name.removeprefix("encoder.").replace("embeddings.patch_embeddings.", "patch_embed.")
        n = n.replace("layer.", "blocks.", 1).replace(".attention.", ".attn.").replace("layernorm.", "norm.")
        meta[n] = t
    for i in range(2):
        p = f"blocks.{i}.attn."
        for kind in ("weight", "bias"):
            meta[f"{p}qkv.{kind}"] = torch.cat([meta.pop(f"{p}{q}.{kind}") for q in ("query", "key", "value")])
    out = tmp_path / "meta"
    out.mkdir()
    torch.save({"encoder": {f"module.backbone.{k}": v for k, v in meta.items()}, "predictor": {}}, out / "ac.pt")
    (out / "config.json").write_text(
        json.dumps(
            {"encoder": {"width": 64, "depth": 2, "heads": 4, "mlp_hidden": 128, "image_size": 32, "patch_size": 8}}
        )
    )
    ours = load_encoder(resolve_source(out))
    pixels = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = hf(pixel_values_videos=pixels[:, None], skip_predictor=True).last_hidden_state
        assert _rel_err(ours.encode_pixels(pixels), want) < 1e-4


def test_frames_are_prepared_as_metas_transform():
    """Centre square crop, bilinear resize without antialias, ImageNet normalisation."""
    torch.manual_seed(1)
    frames = torch.randint(0, 256, (2, 48, 64, 3), dtype=torch.uint8)
    got = prepare_frames(frames, 32)
    x = frames.float().permute(0, 3, 1, 2)[:, :, :, 8:56]  # the centre 48 x 48
    x = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False) / 255.0
    want = (x - torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)) / torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    assert torch.allclose(got, want, atol=1e-5)


def test_encoder_node_normalises_latents_and_batches(vj_encoder):
    torch.manual_seed(2)
    a = torch.randint(0, 256, (32, 32, 3), dtype=torch.uint8)
    b = torch.randint(0, 256, (32, 32, 3), dtype=torch.uint8)
    calls = [NodeCall("r1", {"frames": a}), NodeCall("r2", {"frames": b})]
    with torch.no_grad():
        batched = vj_encoder.split_outputs(vj_encoder(**vj_encoder.prepare_inputs(calls)), calls)
        alone = vj_encoder(frames=b[None])["latents"][0]
        raw = vj_encoder.encode_pixels(prepare_frames(b[None], 32))[0]
    assert torch.allclose(batched[1]["latents"], alone, atol=1e-5)
    want = F.layer_norm(raw, (raw.shape[-1],), eps=1e-5)  # the world-model wrapper's normalize_reps
    assert torch.allclose(alone, want, atol=1e-5)
    assert torch.allclose(alone.mean(-1), torch.zeros(16), atol=1e-5)


def test_bad_frames_are_refused(vj_encoder):
    import pytest

    with pytest.raises(ValueError, match=r"\[H, W, 3\]"):
        vj_encoder.prepare_inputs([NodeCall("r", {"frames": torch.zeros(32, 32)})])
    with pytest.raises(ValueError, match="NaN"):
        vj_encoder(frames=torch.full((1, 32, 32, 3), float("nan")))
