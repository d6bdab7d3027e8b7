"""The generated checkpoints' presets: the bench preset keeps the released model's proportions."""

from __future__ import annotations

import pytest

from mstar_graphs.bagel.autoencoder import FluxAutoencoder, VaeShape
from mstar_graphs.bagel.config import BagelConfig
from mstar_graphs.bagel.image_transform import ImageTransform
from mstar_graphs.bagel.tiny import PRESETS, llm_config_dict
from mstar_graphs.bagel.tiny_vision import PRESETS as VISION_PRESETS
from mstar_graphs.bagel.tiny_vision import vit_config_dict
from mstar_graphs.bagel.vit_config import VitConfig


def test_bench_preset_keeps_the_release_proportions():
    cfg = BagelConfig.from_dict(llm_config_dict("bench"), source="bench")
    llm, dims = cfg.llm, cfg.dims
    assert llm.head_dim == 128 and llm.num_attention_heads // llm.num_key_value_heads == 7  # as 28 / 4
    assert llm.intermediate_size * 3584 == 18944 * llm.hidden_size  # the release's MLP ratio, exactly
    assert 1000 < llm.vocab_size < 10000 and cfg.random_weights
    vit = VitConfig.from_dict(vit_config_dict("bench", dims.vit_max_num_patch_per_side), source="bench vit")
    assert vit.hidden_size * 4 == 1152 and vit.hidden_size // vit.num_attention_heads == 72
    # a 512 px image: 32 x 32 latent tokens out, 35 x 35 ViT rows in (4096 and 4900 at the release's 1024 px)
    assert ImageTransform(*dims.vae_transform).size_for(512, 512) == (512, 512) and dims.max_latent_size == 32
    assert ImageTransform(*dims.vit_transform).size_for(512, 512) == (490, 490)
    vae = FluxAutoencoder(VaeShape(**VISION_PRESETS["bench"]["vae"]))  # FLUX's levels at a quarter width
    assert vae.shape.downsample == 8 and vae.shape.ch * 4 == 128
    assert PRESETS["bench"]["first_special_id"] + 5 <= llm.vocab_size


def test_unknown_preset_is_named():
    with pytest.raises(ValueError, match="unknown BAGEL preset 'huge'"):
        llm_config_dict("huge")
