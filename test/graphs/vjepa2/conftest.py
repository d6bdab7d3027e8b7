"""Shared V-JEPA 2-AC fixtures: the tiny checkpoint (Meta's layout) and its loaded modules."""

from __future__ import annotations

import pytest

from mstar_graphs.vjepa2.checkpoints import load_encoder, load_predictor, resolve_source
from mstar_graphs.vjepa2.tiny import write_tiny


@pytest.fixture(scope="session")
def vj_ckpt(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("vjepa2_tiny") / "ckpt"
    write_tiny(path, "tiny")
    return path


@pytest.fixture(scope="session")
def vj_source(vj_ckpt):
    return resolve_source(vj_ckpt)


@pytest.fixture(scope="session")
def vj_encoder(vj_source):
    return load_encoder(vj_source)


@pytest.fixture(scope="session")
def vj_predictor(vj_source):
    return load_predictor(vj_source)
