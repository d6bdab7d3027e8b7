"""Shared BAGEL test fixtures: the tiny checkpoint (written once per session), its LLM, raw tensors, tokenizer."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

from mstar_graphs.bagel.config import BagelConfig
from mstar_graphs.bagel.llm import BagelLLM
from mstar_graphs.bagel.tiny import write_tiny_bagel
from mstar_graphs.bagel.tokenizer import BagelTokenizer


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory: pytest.TempPathFactory):
    return write_tiny_bagel(tmp_path_factory.mktemp("bagel_tiny") / "ckpt")


@pytest.fixture(scope="session")
def config(ckpt) -> BagelConfig:
    return BagelConfig.from_dir(ckpt)


@pytest.fixture(scope="session")
def model(ckpt) -> BagelLLM:
    return BagelLLM.from_pretrained_dir(ckpt)


@pytest.fixture(scope="session")
def state(ckpt):
    return load_file(str(ckpt / "ema.safetensors"))


@pytest.fixture(scope="session")
def tok(ckpt) -> BagelTokenizer:
    return BagelTokenizer.from_dir(ckpt)


@pytest.fixture(scope="session")
def markers(tok) -> tuple[int, int]:
    return tok.special.vision_start, tok.special.vision_end
