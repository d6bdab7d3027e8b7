"""Shared Qwen3-Omni fixtures: the tiny checkpoint (transformers' layout), our components, the reference."""

from __future__ import annotations

import pytest

from mstar_graphs.qwen3_omni.checkpoints import load_component
from mstar_graphs.qwen3_omni.tiny import write_tiny_checkpoint


@pytest.fixture(scope="session")
def q3_ckpt(tmp_path_factory: pytest.TempPathFactory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("qwen3_omni_tiny") / "ckpt")


@pytest.fixture(scope="session")
def q3(q3_ckpt):
    """Our four components, loaded through our loader from the checkpoint's own files."""
    return {
        name: load_component(name, q3_ckpt, progress=False)
        for name in ("thinker", "audio_encoder", "talker", "code2wav")
    }


@pytest.fixture(scope="session")
def q3_ref(q3_ckpt):
    from mstar_graphs.qwen3_omni.reference import load_reference

    return load_reference(q3_ckpt)
