"""EngineConfig.quantization: the allowed names, and errors that name the field."""

from __future__ import annotations

import pytest

from mstar.engine.config import EngineConfig, load_engine_config


def test_quantization_defaults_to_none_and_accepts_int8_int4():
    assert EngineConfig().quantization == "none"
    assert EngineConfig(quantization="int4").quantization == "int4"


def test_bad_quantization_names_the_field(tmp_path):
    with pytest.raises(
        ValueError, match=r"quantization = 'fp8' is invalid \(expected one of none, int8, int4, int8_dynamic, fp16\)"
    ):
        EngineConfig(quantization="fp8")
    path = tmp_path / "engine.yaml"
    path.write_text("quantization: q4\n")
    with pytest.raises(ValueError, match="quantization") as err:
        load_engine_config(path)
    assert str(path) in str(err.value)
