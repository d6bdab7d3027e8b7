"""The pi0.5 prompt: the references' text format with the state discretised into 256 bins, images first,
tokenized with PaliGemma's SentencePiece model or a tokenizer.json, cut to the checkpoint's budget."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mstar_graphs.pi05.prompt import (
    IMAGE_PLACEHOLDER_ID,
    PromptEncoder,
    PromptError,
    build_prefix,
    discretize_state,
    format_prompt,
)
from mstar_graphs.pi05.tokenizer import load_tokenizer
from support.pi05_layouts import train_sentencepiece


def _openpi_bins(state: np.ndarray) -> list[int]:
    """openpi PaligemmaTokenizer.tokenize's discretisation, verbatim in numpy."""
    return (np.digitize(state, bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1).tolist()


def _openpi_ids(sp_file, task: str, state: np.ndarray, max_len: int) -> list[int]:
    """What openpi's PaligemmaTokenizer.tokenize returns (unpadded part), written out with sentencepiece."""
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(sp_file))
    cleaned = task.strip().replace("_", " ").replace("\n", " ")
    text = f"Task: {cleaned}, State: {' '.join(map(str, _openpi_bins(state)))};\nAction: "
    return sp.encode(text, add_bos=True)[:max_len]


def test_discretisation_matches_numpy_digitize_everywhere():
    edges = np.linspace(-1, 1, 257)
    values = np.concatenate(
        [
            np.linspace(-1.3, 1.3, 20001),
            edges,
            np.nextafter(edges, -2),
            np.nextafter(edges, 2),
            [-1.0, 1.0, 0.0, -1e-9, 1e-9, 5.0, -5.0],
        ]
    )
    for dtype in (np.float64, np.float32):
        x = values.astype(dtype)
        assert discretize_state(torch.from_numpy(x)) == _openpi_bins(x)
    assert discretize_state([-1.0, 0.0, 0.999, 1.0, -1.01, 2.0]) == [0, 128, 255, 255, -1, 255]


def test_nan_or_inf_state_is_rejected():
    with pytest.raises(ValueError, match=r"NaN or infinite values at indices \[1, 3\]"):
        discretize_state(torch.tensor([0.0, float("nan"), 0.5, float("inf")]))


def test_prompt_text_is_the_references_pi05_format_with_only_the_real_state_dims():
    text = format_prompt("  pick_up the\ncube  ", torch.tensor([0.1, -0.5, 1.0, -1.0], dtype=torch.float32))
    assert text == "Task: pick up the cube, State: 140 64 255 0;\nAction: "  # 4 values: not padded to 32


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
    assert ids[n_img] == model.config.bos_token_id == 2  # both references put <bos> first
    assert tokenizer.decode(ids[n_img + 1 :].tolist()) == text
    assert int(ids.max()) < model.vocab_size
    ids0, mask0 = build_prefix(tokenizer, 0, "open the top drawer", state)  # no images: <bos> + text
    assert not mask0.any() and torch.equal(ids0, ids[n_img:])


def test_sentencepiece_ids_are_openpis(sp_model):
    """PaliGemma's SentencePiece model, as openpi tokenizes with it: encode(full prompt, add_bos=True)."""
    rng = np.random.default_rng(0)
    encoder = PromptEncoder(load_tokenizer(sp_model), bos_id=2, max_len=200)
    task = encoder.task("put_the spoon\nnext to the plate")
    for _ in range(50):
        state = rng.uniform(-1.3, 1.3, size=int(rng.integers(1, 20))).astype(np.float32)
        ids, truncated = encoder.ids(task, torch.from_numpy(state))
        assert ids == _openpi_ids(sp_model, "put_the spoon\nnext to the plate", state, 200) and not truncated


@pytest.mark.parametrize("dummy_prefix", [False, True])
def test_tokenizing_the_task_once_gives_the_whole_prompts_ids(tmp_path, tokenizer, dummy_prefix):
    """Split mode (task once, the state per request) only where it is exact; else the whole text, same ids."""
    rng = np.random.default_rng(1)
    for tok in (tokenizer, load_tokenizer(train_sentencepiece(tmp_path, dummy_prefix=dummy_prefix))):
        split, whole = (PromptEncoder(tok, bos_id=2, max_len=400, split=s) for s in (True, False))
        for prompt in ("go", "stack the green block on the blue block", "Task: 1 2, State: 3"):
            for _ in range(20):
                state = torch.from_numpy(rng.uniform(-1.2, 1.2, size=8))
                a, b = split.ids(split.task(prompt), state), whole.ids(whole.task(prompt), state)
                assert a == b and a[0][1:] == tok.encode(format_prompt(prompt, state)), (tok, prompt)
    sp_dummy = PromptEncoder(
        load_tokenizer(train_sentencepiece(tmp_path / "d", dummy_prefix=True)), bos_id=2, max_len=400
    )
    assert PromptEncoder(tokenizer, bos_id=2, max_len=400).split_safe  # the byte-level BPE never merges across
    assert sp_dummy.task("go").whole == (not sp_dummy.split_safe)


def test_a_prompt_over_the_budget_is_cut_as_the_references_cut_it(sp_model):
    """Both references keep the first max_len ids (openpi: tokens[:max_len]; LeRobot: truncation=True, right)."""
    state = np.linspace(-1, 1, 32).astype(np.float32)
    encoder = PromptEncoder(load_tokenizer(sp_model), bos_id=2, max_len=40)
    ids, truncated = encoder.ids(encoder.task("open the top drawer"), torch.from_numpy(state))
    assert truncated and len(ids) == 40 and ids == _openpi_ids(sp_model, "open the top drawer", state, 40)
    short, cut = encoder.ids(encoder.task("go"), torch.zeros(1))
    assert not cut and len(short) < 40


def test_a_task_without_room_for_the_state_is_refused(tokenizer):
    encoder = PromptEncoder(tokenizer, bos_id=2, max_len=8)
    with pytest.raises(PromptError, match="before the state, over the limit of 8"):
        encoder.task("stack the green block on the blue block")
    with pytest.raises(PromptError, match="over the limit of 5"):
        PromptEncoder(tokenizer, bos_id=2, max_len=200).task("stack the green block", max_tokens=5)


def test_without_the_state_in_the_prompt_the_text_is_the_task_and_a_newline(sp_model):
    """openpi's pi05_libero (discrete_state_input=False): encode(task, add_bos=True) + encode("\\n")."""
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(sp_model))
    encoder = PromptEncoder(load_tokenizer(sp_model), bos_id=2, max_len=48, state_in_prompt=False)
    ids, _ = encoder.ids(encoder.task(" open_the drawer "), torch.tensor([0.3, 0.9]))
    assert ids == sp.encode("open the drawer", add_bos=True) + sp.encode("\n")
