from __future__ import annotations

import pytest

from mstar.engine.config import EngineConfig, load_engine_config


def test_shipped_engine_yaml_loads():
    from pathlib import Path

    cfg = load_engine_config(Path(__file__).parents[3] / "config" / "engine.yaml")
    assert cfg.block_size == 16 and cfg.dtype == "auto"
    assert cfg.starvation_wait_ms == 200 and cfg.starved_share == 0.05  # the defaults, written out
    assert cfg.compile is False  # eager unless asked: parity tests and references compare eager numerics


def test_shipped_voice_engine_yaml_compiles_where_it_can():
    from pathlib import Path

    cfg = load_engine_config(Path(__file__).parents[3] / "config" / "engine_voice.yaml")
    assert cfg.compile == "auto" and cfg == EngineConfig(compile="auto")  # nothing else differs


@pytest.mark.parametrize(
    "text, needle",
    [
        ("block_size: abc\n", "block_size"),
        ("blok_size: 3\n", "blok_size"),
        ("block_size: -3\n", "block_size"),
        ("dtype: float8\n", "dtype"),
        ("starvation_wait_ms: -5\n", "starvation_wait_ms"),
        ("starved_share: 1.5\n", "starved_share"),
        ("- 1\n- 2\n", "mapping"),
        (
            "block_size: [1,\n",
            r"engine.yaml:2: not valid YAML: expected the node content, but found .<stream end>. \(column 1\)",
        ),
        ("size: &n 16\nblock_size: *n\n", r"engine.yaml:2: not valid YAML: aliases are not accepted \(\*n\)"),
    ],
)
def test_bad_engine_yaml_names_the_field(tmp_path, text, needle):
    path = tmp_path / "engine.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=needle) as err:
        load_engine_config(path)
    assert str(path) in str(err.value)


def test_engine_config_rejects_bad_values_directly():
    with pytest.raises(ValueError, match="max_num_seqs"):
        EngineConfig(max_num_seqs=0)
