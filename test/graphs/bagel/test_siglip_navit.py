"""Our SigLIP NaViT vs transformers' SiglipVisionModel (one full square image), and packing vs single calls."""

from __future__ import annotations

import pytest
import torch
import transformers

from mstar_graphs.bagel.patch_grid import grid_position_ids, patch_rows
from mstar_graphs.bagel.siglip_navit import SiglipNavitModel
from mstar_graphs.bagel.tiny_vision import randomise, vit_config_dict
from mstar_graphs.bagel.vit_config import VitConfig
from support.bagel_vision import rel_err

GRID = 4


@pytest.fixture(scope="module")
def navit() -> SiglipNavitModel:
    cfg = VitConfig.from_dict(vit_config_dict("tiny", GRID))
    model = SiglipNavitModel(cfg).eval()
    randomise(model, torch.Generator().manual_seed(1))
    return model


def _to_transformers(model: SiglipNavitModel) -> transformers.SiglipVisionModel:
    cfg = model.vision_model.config
    hf = transformers.SiglipVisionModel(
        transformers.SiglipVisionConfig(
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_hidden_layers=cfg.num_hidden_layers,  # ours: the file's count - 1
            num_attention_heads=cfg.num_attention_heads,
            image_size=cfg.image_size,
            patch_size=cfg.patch_size,
            layer_norm_eps=cfg.layer_norm_eps,
            vision_use_head=False,
        )
    ).eval()
    p = cfg.patch_size
    state = {k.removeprefix("vision_model."): t.clone() for k, t in model.state_dict().items()}
    # the Linear's input order is (py, px, c): back to the conv's (out, c, py, px)
    linear = state["embeddings.patch_embedding.weight"]
    state["embeddings.patch_embedding.weight"] = linear.reshape(-1, p, p, 3).permute(0, 3, 1, 2).contiguous()
    # transformers 5 has no "vision_model." level in SiglipVisionModel's names; 4.x does
    if any(k.startswith("vision_model.") for k in hf.state_dict()):
        state = {f"vision_model.{k}": t for k, t in state.items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and all("position_ids" in m for m in missing), (missing, unexpected)
    return hf


def _image(seed: int, h: int, w: int) -> torch.Tensor:
    return torch.rand(3, h, w, generator=torch.Generator().manual_seed(seed)) * 2 - 1


@torch.no_grad()
def test_one_full_image_matches_transformers(navit):
    cfg = navit.vision_model.config
    side = cfg.image_size
    image = _image(0, side, side)
    ids = grid_position_ids(side, side, cfg.patch_size, cfg.grid)
    ours = navit(patch_rows(image, cfg.patch_size), ids, [ids.numel()])
    ref = _to_transformers(navit)(pixel_values=image[None]).last_hidden_state[0]
    assert ours.shape == ref.shape == (GRID * GRID, cfg.hidden_size)
    assert rel_err(ours, ref) < 1e-5
    assert ref.std() > 0.1


@torch.no_grad()
def test_packed_images_equal_separate_calls(navit):
    cfg = navit.vision_model.config
    p = cfg.patch_size
    images = [_image(1, 2 * p, 3 * p), _image(2, 4 * p, 4 * p), _image(3, p, 2 * p)]
    rows = [patch_rows(im, p) for im in images]
    ids = [grid_position_ids(im.shape[1], im.shape[2], p, cfg.grid) for im in images]
    lens = [r.shape[0] for r in rows]
    packed = navit(torch.cat(rows), torch.cat(ids), lens).split(lens)
    for r, i, out in zip(rows, ids, packed):
        torch.testing.assert_close(out, navit(r, i, [r.shape[0]]), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="seq_lens"):
        navit(torch.cat(rows), torch.cat(ids), [1, 2])
