"""The pi0.5 prompt: openpi's text format with the state discretised into 256 bins, images first."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mstar_graphs.pi05.prompt import IMAGE_PLACEHOLDER_ID, build_prefix, discretize_state, format_prompt


def _openpi_bins(state: np.ndarray) -> list[int]:
    """openpi PaligemmaTokenizer.tokenize's discretisation, verbatim in numpy."""
    return (np.digitize(state, bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1).tolist()


def test_discretisation_matches_numpy_digitize_everywhere():
    edges = np.linspace(-1, 1, 257)
    values = np.concatenate([np.linspace(-1.3, 1.3, 20001), edges, np.nextafter(edges, -2), np.nextafter(edges, 2),
                             [-1.0, 1.0, 0.0, -1e-9, 1e-9, 5.0, -5.0]])
    for dtype in (np.float64, np.float32):
        x = values.astype(dtype)
        assert discretize_state(torch.from_numpy(x)) == _openpi_bins(x)
    assert discretize_state([-1.0, 0.0, 0.999, 1.0, -1.01, 2.0]) == [0, 128, 255, 255, -1, 255]


def test_nan_or_inf_state_is_rejected():
    with pytest.raises(ValueError, match=r"NaN or infinite values at indices \[1, 3\]"):
        discretize_state(torch.tensor([0.0, float("nan"), 0.5, float("inf")]))


def test_prompt_text_is_openpis_pi05_format():
    text = format_prompt("  pick_up the\ncube  ", torch.tensor([0.1, -0.5, 1.0, -1.0], dtype=torch.float32))
    assert text == "Task: pick up the cube, State: 140 64 255 0;\nAction: "
    # LeRobot zero-pads the state to max_state_dim first (0.0 -> bin 128)
    padded = format_prompt("go", [0.1], state_pad_to=4)
    assert padded == "Task: go, State: 140 128 128 128;\nAction: "
    with pytest.raises(ValueError, match="more than max_state_dim=1"):
        format_prompt("go", [0.1, 0.2], state_pad_to=1)


@pytest.mark.parametrize("task", ["", "   ", "\n_\n"])
def test_empty_prompt_is_rejected(task):
    with pytest.raises(ValueError, match="prompt is empty"):
        format_prompt(task, [0.0])


def test_empty_state_is_rejected():
    with pytest.raises(ValueError, match="state is empty"):
        format_prompt("go", [])


def test_prefix_layout(tokenizer, model):
    state = torch.tensor([0.25, -0.75, 0.5])
    ids, mask = build_prefix(tokenizer, 2, "open the top drawer", state)
    text = format_prompt("open the top drawer", state)
    n_img = 2 * 256
    assert ids.dtype == torch.int64 and mask.dtype == torch.bool and ids.shape == mask.shape
    assert mask[:n_img].all() and not mask[n_img:].any()
    assert (ids[:n_img] == IMAGE_PLACEHOLDER_ID).all()
    assert ids[n_img] == model.config.bos_token_id == 2  # openpi encodes with add_bos=True
    assert tokenizer.decode(ids[n_img + 1:].tolist()) == text
    assert int(ids.max()) < model.vocab_size
    # no images: just <bos> + text
    ids0, mask0 = build_prefix(tokenizer, 0, "open the top drawer", state)
    assert not mask0.any() and torch.equal(ids0, ids[n_img:])


def test_prompt_over_max_token_len_is_refused(tokenizer):
    with pytest.raises(ValueError, match="over max_token_len=8"):
        build_prefix(tokenizer, 1, "stack the green block on the blue block", torch.zeros(8), max_token_len=8)


def test_model_build_prefix_uses_the_checkpoint_settings(tokenizer, model):
    import msgspec

    state = torch.tensor([0.5, -0.5])
    ids, mask = model.build_prefix(tokenizer, 1, "go", state)
    assert torch.equal(ids, build_prefix(tokenizer, 1, "go", state)[0]) and int(mask.sum()) == 256
    padded = type(model)(msgspec.structs.replace(model.config, state_pad_to=4, max_token_len=64), device="meta")
    ids4, _ = padded.build_prefix(tokenizer, 1, "go", state)
    assert tokenizer.decode(ids4[257:].tolist()) == "Task: go, State: 192 64 128 128;\nAction: "
