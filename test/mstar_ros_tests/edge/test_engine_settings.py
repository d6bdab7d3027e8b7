"""mstar_ros.edge.engine_settings: every front-end's engine_config is read before any front-end starts,
a bad field named with the edge file's line."""

from __future__ import annotations

import pytest

from mstar_ros.edge.config import EdgeConfigError, load_edge_config
from mstar_ros.edge.engine_settings import check_engine_configs, front_engine_config
from mstar_ros.edge.launch_spec import edge_processes

EDGE = """\
processes:
  - name: box
    threads: 1
    pi05: {robots: [/robot1]}
    gateway:
      port: 0
      voice: {model: orpheus, engine_config: voice.yaml}
"""


def test_a_bad_engine_config_field_is_named_with_the_edge_line(tmp_path):
    (tmp_path / "voice.yaml").write_text("max_num_seqs: many\n")
    (tmp_path / "edge.yaml").write_text(EDGE)
    edge = load_edge_config(tmp_path / "edge.yaml", cores=1)
    with pytest.raises(
        EdgeConfigError, match=r"edge.yaml:7: processes\[0\].gateway.voice.engine_config: .*max_num_seqs"
    ):
        check_engine_configs(edge)
    with pytest.raises(EdgeConfigError, match=r"gateway.voice.engine_config"):
        edge_processes(str(tmp_path / "edge.yaml"), cores=1)  # the launch refuses before starting anything


def test_good_engine_configs_pass_and_are_what_the_front_end_gets(tmp_path):
    (tmp_path / "voice.yaml").write_text("max_num_seqs: 4\n")
    (tmp_path / "edge.yaml").write_text(EDGE)
    edge = load_edge_config(tmp_path / "edge.yaml", cores=1)
    check_engine_configs(edge)
    assert front_engine_config(str(tmp_path / "voice.yaml"), None).max_num_seqs == 4
