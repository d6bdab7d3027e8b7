"""Orpheus token layout, constrained-decoding rule, and prompt format."""

from __future__ import annotations

import hashlib

import pytest
import torch

from mstar_graphs.orpheus import tokens as T
from mstar_graphs.orpheus.prompt import build_prompt_ids, load_tokenizer
from mstar_graphs.orpheus.tiny_llm import build_tokenizer, write_tiny_llm


def test_constants_match_the_reference_layout():
    # <custom_token_N> = 128256 + N; audio codes start at custom token 10.
    assert (T.START_OF_SPEECH, T.END_OF_SPEECH, T.START_OF_HUMAN, T.END_OF_HUMAN, T.START_OF_AI, T.END_OF_AI) == (
        128257,
        128258,
        128259,
        128260,
        128261,
        128262,
    )
    assert T.EOT == 128009
    assert T.audio_token(0, 0) == 128266
    assert T.audio_token(4095, 6) == 128266 + 4095 + 6 * 4096 == T.AUDIO_TOKEN_END - 1
    assert T.AUDIO_TOKEN_END < T.VOCAB_SIZE == 156940
    assert T.slot_token_range(2) == (128266 + 2 * 4096, 128266 + 3 * 4096)
    with pytest.raises(ValueError, match="code"):
        T.audio_token(4096, 0)
    with pytest.raises(ValueError, match="slot"):
        T.slot_token_range(7)


def test_allowed_ranges_follow_the_slot_and_end_only_on_frames():
    for n in range(15):
        ranges = T.allowed_token_ranges(n)
        assert ranges[0] == T.slot_token_range(n % 7)
        assert ((T.END_OF_SPEECH, T.END_OF_SPEECH + 1) in ranges) == (n % 7 == 0)
        ids = T.allowed_token_ids(n)
        expected = sorted(i for lo, hi in ranges for i in range(lo, hi))
        assert ids.tolist() == expected
    with pytest.raises(ValueError, match="num_generated"):
        T.allowed_token_ranges(-1)


def test_snac_codes_round_trip_batched():
    gen = torch.Generator().manual_seed(0)
    frames = 5
    c0 = torch.randint(0, 4096, (2, 3, frames), generator=gen)
    c1 = torch.randint(0, 4096, (2, 3, 2 * frames), generator=gen)
    c2 = torch.randint(0, 4096, (2, 3, 4 * frames), generator=gen)
    ids = T.snac_codes_to_tokens(c0, c1, c2)
    assert ids.shape == (2, 3, 7 * frames)
    back = T.tokens_to_snac_codes(ids)
    for a, b in zip(back, (c0, c1, c2)):
        assert torch.equal(a, b)


def test_snac_codes_of_one_frame_by_hand():
    # slot -> (level, index within the frame's share): 0->(0,0) 1->(1,0) 2->(2,0) 3->(2,1) 4->(1,1) 5->(2,2) 6->(2,3)
    codes = [10, 11, 12, 13, 14, 15, 16]
    ids = torch.tensor([T.audio_token(c, s) for s, c in enumerate(codes)])
    c0, c1, c2 = T.tokens_to_snac_codes(ids)
    assert c0.tolist() == [10] and c1.tolist() == [11, 14] and c2.tolist() == [12, 13, 15, 16]


def test_snac_codes_reject_tokens_outside_their_slot():
    ids = torch.tensor([T.audio_token(c, s % 7) for s, c in enumerate(range(14))])
    ids[9] = T.audio_token(7, 0)  # a slot-0 token at slot 2
    with pytest.raises(ValueError, match=rf"position 9 \(slot 2\) holds {T.audio_token(7, 0)}"):
        T.tokens_to_snac_codes(ids)
    batch = torch.stack([ids, ids])
    batch[0, 9] = T.audio_token(9, 2)
    batch[1, 0] = T.END_OF_SPEECH
    with pytest.raises(ValueError, match=rf"row 1, position 0 \(slot 0\) holds {T.END_OF_SPEECH}"):
        T.tokens_to_snac_codes(batch)
    with pytest.raises(ValueError, match="multiple of 7"):
        T.tokens_to_snac_codes(ids[:10])


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_prompt_layout(tokenizer):
    ids = build_prompt_ids(tokenizer, "Hello there.", voice="tara")
    text_ids = tokenizer.encode("tara: Hello there.").ids
    assert text_ids[0] == T.BEGIN_OF_TEXT  # like Llama 3's tokenizer, the toy one prepends BOS
    assert ids == [T.START_OF_HUMAN, *text_ids, T.EOT, T.END_OF_HUMAN, T.START_OF_AI, T.START_OF_SPEECH]
    assert tokenizer.decode(ids[2:-4]) == "tara: Hello there."
    no_voice = build_prompt_ids(tokenizer, "Hello there.", voice=None)
    assert tokenizer.decode(no_voice[2:-4]) == "Hello there."
    for empty in ("", "  \n"):
        with pytest.raises(ValueError, match="text is empty"):
            build_prompt_ids(tokenizer, empty)


def test_load_tokenizer_names_the_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(tmp_path)


def test_tiny_llm_is_byte_identical_across_runs(tmp_path):
    def digest(d):
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}

    a = digest(write_tiny_llm(tmp_path / "a"))
    b = digest(write_tiny_llm(tmp_path / "b"))
    assert a == b
    assert {"config.json", "model.safetensors.index.json", "tokenizer.json"} <= set(a)
    assert load_tokenizer(tmp_path / "a").get_vocab_size() >= 500
