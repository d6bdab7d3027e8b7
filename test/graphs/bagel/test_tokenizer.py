"""BagelTokenizer: the four specials read from tokenizer.json, text turns without a chat template."""

from __future__ import annotations

import json
import shutil

import pytest

from mstar_graphs.bagel.tokenizer import BagelTokenizer


def test_specials_come_from_the_tokenizer(tok):
    s = tok.special
    # the tiny tokenizer puts them after its BPE vocabulary, in Qwen2.5's order
    assert (s.im_start, s.im_end, s.vision_start, s.vision_end) == (497, 498, 499, 500)
    assert tok.decode([s.im_start, s.vision_start, s.vision_end, s.im_end]) == (
        "<|im_start|><|vision_start|><|vision_end|><|im_end|>"
    )


def test_text_turn_wraps_the_plain_encoding(tok):
    ids = tok.encode("Describe this image in detail.")
    assert ids and all(i < tok.special.im_start for i in ids)
    assert tok.decode(ids) == "Describe this image in detail."
    assert tok.text_turn("Describe this image in detail.") == [tok.special.im_start, *ids, tok.special.im_end]
    assert tok.encode("<|im_end|>") == [tok.special.im_end]  # an added token is one id, as in Qwen2.5


def test_missing_special_is_named(ckpt, tmp_path):
    data = json.loads((ckpt / "tokenizer.json").read_text())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "<|vision_end|>"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"no token <\|vision_end\|>"):
        BagelTokenizer.from_dir(tmp_path)


def test_missing_file_is_named(ckpt, tmp_path):
    shutil.copy(ckpt / "vocab.json", tmp_path / "vocab.json")
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        BagelTokenizer.from_dir(tmp_path)
