"""The Thinker's M-RoPE positions against transformers' get_rope_index, and the decode offset.

The reference is called unbound, on a stand-in that has only the config and the grid helper it
reads. That way no model gets built.
"""

from __future__ import annotations

import json
import types

import pytest
import torch

from mstar_graphs.qwen3_omni.config import Qwen3OmniConfig
from mstar_graphs.qwen3_omni.mrope_positions import decode_positions, thinker_positions
from mstar_graphs.qwen3_omni.tiny import tiny_config

tmod = pytest.importorskip("transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe")
from transformers import Qwen3OmniMoeConfig  # noqa: E402

CFG = Qwen3OmniConfig.from_json(json.dumps(tiny_config()))
TH = CFG.thinker_config
MERGE = TH.vision_config.spatial_merge_size
VISION_END, AUDIO_END = 151653, 151670  # chat.py's specials


@pytest.fixture(scope="module")
def ref() -> types.SimpleNamespace:
    thinker = Qwen3OmniMoeConfig(**tiny_config()).thinker_config
    owner = tmod.Qwen3OmniMoePreTrainedModelForConditionalGeneration
    ns = types.SimpleNamespace(
        config=thinker, spatial_merge_size=thinker.vision_config.spatial_merge_size, rope_deltas=None
    )
    ns.get_llm_pos_ids_for_vision = lambda *a: owner.get_llm_pos_ids_for_vision(ns, *a)
    ns.get_rope_index = lambda *a, **k: owner.get_rope_index(ns, *a, **k)
    return ns


def text(n: int, base: int = 1000) -> list[int]:
    return list(range(base, base + n))


def image(t: int, h: int, w: int) -> list[int]:
    return [TH.vision_start_token_id, *[TH.image_token_id] * (t * h * w // MERGE**2), VISION_END]


def audio(mel_frames: int) -> list[int]:
    # As many pads as the audio encoder puts out for this many mel frames (the reference's formula).
    n = int(tmod._get_feat_extract_output_lengths(torch.tensor(mel_frames), TH.audio_config.n_window))
    return [TH.audio_start_token_id, *[TH.audio_token_id] * n, AUDIO_END]


def reference(
    ns, ids: list[int], grids: list[tuple[int, int, int]], mels: list[int], force_multimodal: bool = False
) -> tuple[torch.Tensor, int]:
    grid_t = torch.tensor(grids, dtype=torch.long).reshape(-1, 3) if (grids or force_multimodal) else None
    pos, deltas = ns.get_rope_index(
        torch.tensor([ids]),
        image_grid_thw=grid_t,
        attention_mask=torch.ones(1, len(ids)),
        use_audio_in_video=False,
        audio_seqlens=torch.tensor(mels, dtype=torch.long) if mels else None,
    )
    assert torch.equal(pos, pos.round())  # float in the reference; integral values
    return pos[:, 0].long(), int(deltas.reshape(-1)[0])


CASES = {
    "text": (text(7), [], []),
    "image_1x2x2": (text(3) + image(1, 2, 2) + text(4, 2000), [(1, 2, 2)], []),
    "image_1x4x6": (text(5) + image(1, 4, 6) + text(2, 2000), [(1, 4, 6)], []),
    "image_1x8x2_ends_prompt": (text(2) + image(1, 8, 2), [(1, 8, 2)], []),
    "image_1x14x10_first": (image(1, 14, 10) + text(3), [(1, 14, 10)], []),
    "image_t2_scaled_time": (text(2) + image(2, 2, 4) + text(3, 2000), [(2, 2, 4)], []),
    "two_images": (
        text(3) + image(1, 6, 4) + text(2, 2000) + image(1, 2, 8) + text(4, 3000),
        [(1, 6, 4), (1, 2, 8)],
        [],
    ),
    "image_then_audio": (text(3) + image(1, 4, 4) + text(2, 2000) + audio(230) + text(3, 3000), [(1, 4, 4)], [230]),
    "audio_then_image": (text(2) + audio(100) + text(1, 2000) + image(1, 2, 6) + text(5, 3000), [(1, 2, 6)], [100]),
    "audio_only": (text(4) + audio(517) + text(3, 2000), [], [517]),
    "two_audios": (text(1) + audio(80) + text(2, 2000) + audio(1000) + text(2, 3000), [], [80, 1000]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference(ref, name: str) -> None:
    ids, grids, mels = CASES[name]
    want_pos, want_delta = reference(ref, ids, grids, mels)
    got_pos, got_delta = thinker_positions(ids, CFG, grids)
    assert got_pos.dtype == torch.long and got_pos.shape == (3, len(ids))
    assert torch.equal(got_pos, want_pos)
    assert got_delta == want_delta
    # A tensor prompt and the thinker config alone give the same answer.
    pos2, delta2 = thinker_positions(torch.tensor(ids), TH, torch.tensor(grids, dtype=torch.long).reshape(-1, 3))
    assert torch.equal(pos2, got_pos) and delta2 == got_delta


@pytest.mark.parametrize("name", ["text", "audio_only", "two_audios"])
def test_text_and_audio_are_plain_arange(ref, name: str) -> None:
    ids, _, mels = CASES[name]
    pos, delta = thinker_positions(ids, CFG)
    assert torch.equal(pos, torch.arange(len(ids)).expand(3, -1)) and delta == 0
    # The reference's multimodal path (taken when a grid tensor is passed, even an empty one) puts audio
    # at its encoder length from the mel frames. That agrees with a plain count.
    want_pos, want_delta = reference(ref, ids, [], mels, force_multimodal=True)
    assert torch.equal(pos, want_pos) and delta == want_delta


def test_image_positions_by_hand() -> None:
    # 2 text, vision_start, 1x4x6 grid -> 2x3 merged, vision_end, 1 text.
    ids = text(2) + image(1, 4, 6) + text(1, 2000)
    pos, delta = thinker_positions(ids, CFG, [(1, 4, 6)])
    start = 3
    assert pos[:, :3].tolist() == [[0, 1, 2]] * 3
    assert pos[0, 3:9].tolist() == [start] * 6
    assert pos[1, 3:9].tolist() == [start + r for r in (0, 0, 0, 1, 1, 1)]
    assert pos[2, 3:9].tolist() == [start + c for c in (0, 1, 2, 0, 1, 2)]
    assert pos[:, 9:].tolist() == [[start + 3, start + 4]] * 3  # one past the image's max (start + 2)
    assert delta == (start + 5) - len(ids)


@pytest.mark.parametrize("name", ["text", "two_images", "image_t2_scaled_time", "image_then_audio"])
def test_decode_matches_reference(ref, name: str) -> None:
    ids, grids, mels = CASES[name]
    _, want_delta = reference(ref, ids, grids, mels)
    _, delta = thinker_positions(ids, CFG, grids)
    count = 5
    # The reference's decode step: its cached rope_deltas added to cache_length + arange on every axis.
    ref.rope_deltas = torch.tensor([[want_delta]])
    cache = types.SimpleNamespace(get_seq_length=lambda: len(ids))
    want = tmod.Qwen3OmniMoeThinkerModel.compute_3d_position_ids(
        ref,
        input_ids=None,
        image_grid_thw=None,
        video_grid_thw=None,
        inputs_embeds=torch.zeros(1, count, 1),
        attention_mask=None,
        cache=cache,
    )
    got = decode_positions(len(ids), count, delta)
    assert got.dtype == torch.long and torch.equal(got, want[:, 0].long())


def test_errors() -> None:
    prompt = text(2) + image(1, 4, 4) + text(2, 2000)
    with pytest.raises(ValueError, match="no image pad token"):
        thinker_positions(text(5), CFG, [(1, 2, 2)])
    with pytest.raises(ValueError, match="needs t\\*h\\*w"):
        thinker_positions(prompt, CFG, [(1, 4, 6)])
    with pytest.raises(ValueError, match="1 image.*2 grid"):
        thinker_positions(prompt, CFG, [(1, 4, 4), (1, 2, 2)])
    with pytest.raises(ValueError, match="1 image.*0 grid"):
        thinker_positions(prompt, CFG)
    with pytest.raises(ValueError, match="multiples of spatial_merge_size"):
        thinker_positions(text(2) + [TH.vision_start_token_id] + [TH.image_token_id] * 3, CFG, [(1, 3, 4)])
    with pytest.raises(ValueError, match="vision_start"):
        thinker_positions(text(2) + [TH.image_token_id] * 4, CFG, [(1, 4, 4)])
    with pytest.raises(ValueError, match="video"):
        thinker_positions(text(2) + [TH.vision_start_token_id, TH.video_token_id, VISION_END], CFG)
    with pytest.raises(ValueError, match="1-D"):
        thinker_positions(torch.tensor([text(3)]), CFG)
