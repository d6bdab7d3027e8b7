"""Our SigLIP tower + PaliGemma projector vs transformers' SiglipVisionModel on the tiny checkpoint."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from mstar.graph.node import NodeCall
from mstar_graphs.pi05.siglip import preprocess_images

transformers = pytest.importorskip("transformers")

VT = "paligemma_with_expert.paligemma.model.vision_tower."
MM = "paligemma_with_expert.paligemma.model.multi_modal_projector.linear."


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.fixture(scope="module")
def hf_tower(ckpt, encoder):
    v = encoder.config.vision
    cfg = transformers.SiglipVisionConfig(
        hidden_size=v.width,
        intermediate_size=v.mlp_dim,
        num_hidden_layers=v.depth,
        num_attention_heads=v.heads,
        image_size=v.image_size,
        patch_size=v.patch_size,
        layer_norm_eps=v.layer_norm_eps,
        vision_use_head=False,
    )
    model = transformers.SiglipVisionModel(cfg).eval()
    state = {
        k.removeprefix("model."): t for k, t in load_file(str(ckpt / "model.safetensors")).items()
    }  # LeRobot names
    # transformers 5 loads SiglipVisionModel without the "vision_model." level; 4.x keeps it
    strip = VT if any(k.startswith("vision_model.") for k in model.state_dict()) else VT + "vision_model."
    tower = {k[len(strip) :]: t for k, t in state.items() if k.startswith(strip)}
    missing, unexpected = model.load_state_dict(tower, strict=False)
    assert not unexpected and all("position_ids" in m for m in missing), (missing, unexpected)
    projector = (state[MM + "weight"], state[MM + "bias"])
    return model, projector


def _images(cameras: int, seed: int, h: int = 224, w: int = 224) -> torch.Tensor:
    return torch.randint(0, 256, (cameras, h, w, 3), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


@torch.no_grad()
def test_tower_and_projector_match_transformers(encoder, hf_tower):
    hf, (w, b) = hf_tower
    images = _images(3, seed=0)
    pixels = images.permute(0, 3, 1, 2).float() / 255.0 * 2.0 - 1.0  # openpi's uint8 -> [-1, 1]
    ref = F.linear(hf(pixel_values=pixels).last_hidden_state, w, b).reshape(-1, w.shape[0])

    out = encoder(**encoder.prepare_inputs([NodeCall("r", {"images": images})]))["embeds"]
    assert out.shape == (1, 3 * 256, encoder.config.prefix.width)
    err = _rel_err(out[0], ref)
    assert err < 1e-4, err
    assert ref.std() > 0.1  # not a degenerate output


@torch.no_grad()
def test_batched_calls_equal_single_calls(encoder):
    calls = [NodeCall(f"r{i}", {"images": _images(2, seed=10 + i)}) for i in range(3)]
    batched = encoder.split_outputs(encoder(**encoder.prepare_inputs(calls)), calls)
    for call, out in zip(calls, batched):
        alone = encoder(**encoder.prepare_inputs([call]))["embeds"][0]
        torch.testing.assert_close(out["embeds"], alone, rtol=1e-5, atol=1e-5)
    assert encoder.batch_key(calls[0]) == encoder.batch_key(calls[1])
    assert encoder.batch_key(NodeCall("x", {"images": _images(1, 0)[0]})) != encoder.batch_key(calls[0])


def test_preprocessing_normalises_and_letterboxes():
    img = _images(1, seed=1)[0]
    out = preprocess_images(img, 224)
    assert out.shape == (1, 3, 224, 224)
    torch.testing.assert_close(out[0], img.permute(2, 0, 1).float() / 255.0 * 2.0 - 1.0, rtol=0, atol=1e-6)
    # float input in [0, 1] takes the same path
    torch.testing.assert_close(preprocess_images(img.float() / 255.0, 224), out, rtol=0, atol=1e-6)
    # a 112 x 224 frame is resized to 112 x 224 inside 224 x 224 and padded black (-1) above and below
    wide = preprocess_images(_images(2, seed=2, h=112, w=448), 224)
    assert wide.shape == (2, 3, 224, 224)
    assert torch.all(wide[:, :, :56] == -1) and torch.all(wide[:, :, 168:] == -1)
    assert wide[:, :, 56:168].std() > 0.3


@pytest.mark.parametrize(
    "bad, message",
    [
        (torch.zeros(224, 224, 4, dtype=torch.uint8), "RGB, channels last"),
        (torch.zeros(3, 224, 224, dtype=torch.uint8), "RGB, channels last"),
        (torch.full((224, 224, 3), 2.0), r"must be in \[0, 1\]"),
        (torch.full((224, 224, 3), float("nan")), "NaN"),
        (torch.zeros(224, 224, 3, dtype=torch.int32), "uint8 or floating"),
    ],
)
def test_bad_images_are_rejected_with_a_reason(encoder, bad, message):
    with pytest.raises(ValueError, match=message):
        encoder.prepare_inputs([NodeCall("robot7", {"images": bad})])


def _openpi_resize_with_pad(image, size):
    """openpi_client.image_tools.resize_with_pad (openpi's training pipeline), written out with PIL."""
    import numpy as np
    from PIL import Image

    h, w = image.shape[:2]
    ratio = max(w / size, h / size)
    rh, rw = int(h / ratio), int(w / ratio)
    resized = Image.fromarray(image).resize((rw, rh), resample=Image.BILINEAR)
    out = Image.new("RGB", (size, size), 0)
    out.paste(resized, (max(0, int((size - rw) / 2)), max(0, int((size - rh) / 2))))
    return np.asarray(out)


@pytest.mark.parametrize("h, w", [(480, 640), (333, 481), (100, 300), (224, 300), (500, 224)])
def test_frames_of_other_sizes_are_resized_as_openpis_training_pipeline(h, w):
    g = torch.Generator().manual_seed(h * w)
    img = torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8)
    want = torch.from_numpy(_openpi_resize_with_pad(img.numpy(), 224).copy()).permute(2, 0, 1).float() / 255.0 * 2 - 1
    got = preprocess_images(img, 224)[0]
    assert torch.equal(got, want)  # bit for bit: the same PIL filter on the same uint8 pixels
