"""The edge config (mstar_ros.edge.config): what it accepts, and errors that name the file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from mstar_ros.edge.config import EdgeConfigError, EdgeFile, load_edge_config

ROOT = Path(__file__).resolve().parents[3]

GOOD = """\
processes:
  - name: control
    threads: 1
    pi05: {robots: [/robot1, /robot2], rate: 10}
  - name: media
    threads: 1
    gateway:
      port: 0
      voice: {model: orpheus}
      images: {model: bagel}
"""


def test_the_shipped_config_runs_robots_and_voice_together_and_images_idle():
    edge = load_edge_config(ROOT / "config" / "edge.yaml", cores=2)
    box, batch = edge.config.processes
    assert box.threads == 2 and box.scheduling == "normal" and box.pi05.robots == ["/robot1", "/robot2"]
    assert (box.gateway.voice.model, box.gateway.images) == ("orpheus", None)
    assert (batch.scheduling, batch.pi05, batch.gateway.voice, batch.gateway.images.model) == (
        "idle",
        None,
        None,
        "bagel",
    )
    assert box.gateway.port != batch.gateway.port


def test_an_idle_process_is_not_counted_against_the_cores_but_still_fits_them():
    idle = GOOD.replace("  - name: media\n    threads: 1", "  - name: media\n    threads: 2\n    scheduling: idle")
    assert EdgeFile.parse(idle, "e.yaml", cores=2).config.process("media").scheduling == "idle"
    with pytest.raises(EdgeConfigError, match=r"e.yaml:\d+: processes\[1\].threads: 3 intra-op threads .* 2 cores"):
        EdgeFile.parse(idle.replace("threads: 2\n    scheduling", "threads: 3\n    scheduling"), "e.yaml", cores=2)


def test_a_good_config_gives_its_process_groups():
    edge = EdgeFile.parse(GOOD, "e.yaml", cores=2)
    assert edge.config.names() == ["control", "media"]
    assert edge.config.process("media").front_ends() == ["voice (orpheus) [interactive]", "images (bagel) [batch]"]
    with pytest.raises(ValueError, match="no process 'x'.*control, media"):
        edge.config.process("x")


@pytest.mark.parametrize(
    "text, says",
    [
        (
            GOOD.replace("threads: 1\n    pi05", "threads: 2\n    pi05"),
            r"e.yaml:1: processes: 3 intra-op threads .* 2 cores",
        ),
        (
            GOOD.replace("threads: 1\n    pi05", "threads: 0\n    pi05"),
            r"e.yaml:3: processes\[0\].threads: must be >= 1",
        ),
        (
            GOOD.replace("threads: 1\n    pi05", "threds: 1\n    pi05"),
            r"e.yaml:3: processes\[0\].threds: Object contains unknown field `threds`$",
        ),
        (GOOD.replace("name: media", "name: control"), r"e.yaml:5: processes\[1\].name: .*named twice"),
        (
            GOOD.replace("threads: 1\n    pi05", "threads: 1\n    scheduling: nice\n    pi05"),
            r"e.yaml:4: processes\[0\].scheduling: 'nice' is not one of normal, idle",
        ),
        (GOOD.replace("name: media", "name: Media!"), r"processes\[1\].name: 'Media!' is not a name"),
        (GOOD.replace("/robot2", "/9robot"), r"e.yaml:4: processes\[0\].pi05.robots: '/9robot' is not a valid"),
        (GOOD.replace("rate: 10", "rate: -1"), r"processes\[0\].pi05.rate: must be > 0"),
        (
            GOOD.replace("rate: 10", "rate: fast"),
            r"e.yaml:4: processes\[0\].pi05.rate: Expected `float \| null`, got `str`$",
        ),
        (
            GOOD.replace("model: orpheus", "model: nope"),
            r"e.yaml:9: processes\[1\].gateway.voice.model: no model 'nope'",
        ),
        (
            GOOD.replace("model: orpheus", "model: bagel"),
            r"processes\[1\].gateway.images.model: bagel is the voice model",
        ),
        (GOOD.replace("port: 0", "port: 70000"), r"e.yaml:8: processes\[1\].gateway.port: 70000 is not a TCP port"),
        (
            GOOD.replace("{robots: [/robot1, /robot2], rate: 10}", "{robots: [/r], weights: nowhere}"),
            r"pi05.weights: no file or directory .*nowhere",
        ),
        ("processes: []\n", r"processes: names no process group"),
        ("processes:\n  - {name: a, threads: 1}\n", r"e.yaml:2: processes\[0\]: runs no front-end"),
        ("processes:\n  - {name: a, threads: 1, gateway: {port: 1}}\n", r"processes\[0\].gateway: serves nothing"),
        ("- a\n", r"e.yaml: expected a mapping with processes"),
        (
            GOOD.replace("rate: 10", "priority: urgent"),
            r"e.yaml:4: processes\[0\].pi05.priority: 'urgent' is not a class",
        ),
        (
            GOOD.replace("{model: bagel}", "{model: bagel, class_limits: {later: 1}}"),
            r"e.yaml:10: processes\[1\].gateway.images.class_limits.later: 'later' is not a class",
        ),
        (
            GOOD.replace("{model: bagel}", "{model: bagel,\n        class_limits: {batch: 0}}"),
            r"e.yaml:11: processes\[1\].gateway.images.class_limits.batch: 0 is not an in-flight limit",
        ),
        (
            GOOD.replace("rate: 10", "class_limits: {control: two}"),
            r"e.yaml:4: processes\[0\].pi05.class_limits.control: 'two' is not an in-flight limit",
        ),
    ],
)
def test_a_bad_config_is_refused_naming_the_line_and_field(text, says):
    with pytest.raises(EdgeConfigError, match=says):
        EdgeFile.parse(text, "e.yaml", cores=2)


def test_a_front_ends_class_is_its_requests_own_unless_set():
    edge = EdgeFile.parse(GOOD, "e.yaml", cores=2)
    assert edge.config.process("control").pi05.priority == ""
    assert edge.config.process("control").front_ends() == ["pi0.5 for /robot1 /robot2 [control]"]
    edge = EdgeFile.parse(GOOD.replace("rate: 10", "priority: interactive"), "e.yaml", cores=2)
    assert edge.config.process("control").front_ends() == ["pi0.5 for /robot1 /robot2 [interactive]"]


def test_each_front_end_may_limit_its_classes_in_flight():
    text = GOOD.replace("{model: bagel}", "{model: bagel, class_limits: {batch: 1}}")
    media = EdgeFile.parse(text, "e.yaml", cores=2).config.process("media")
    assert media.gateway.images.class_limits == {"batch": 1} and media.gateway.voice.class_limits == {}


def test_robots_and_ports_are_not_shared_between_processes():
    two = GOOD.replace("    gateway:\n      port: 0", "    pi05: {robots: [/robot2]}\n    gateway:\n      port: 0")
    with pytest.raises(EdgeConfigError, match=r"processes\[1\].pi05.robots: /robot2 is served by process 'control'"):
        EdgeFile.parse(two, "e.yaml", cores=2)
    ports = GOOD.replace(
        "pi05: {robots: [/robot1, /robot2], rate: 10}", "gateway: {port: 8080, voice: {model: orpheus}}"
    )
    with pytest.raises(EdgeConfigError, match=r"processes\[1\].gateway.port: port 8080 is taken by process 'control'"):
        EdgeFile.parse(ports.replace("port: 0", "port: 8080"), "e.yaml", cores=2)


def test_oversubscribe_lets_the_threads_pass_the_cores():
    text = GOOD + "oversubscribe: true\n"
    assert sum(g.threads for g in EdgeFile.parse(text, "e.yaml", cores=1).config.processes) == 2


def test_paths_are_relative_to_the_file(tmp_path):
    (tmp_path / "engine.yaml").write_text("max_num_seqs: 4\n")
    config = tmp_path / "edge.yaml"
    config.write_text(GOOD.replace("rate: 10}", "rate: 10, engine_config: engine.yaml}"))
    edge = load_edge_config(config, cores=2)
    assert edge.path(edge.config.processes[0].pi05.engine_config) == str(tmp_path / "engine.yaml")
    assert edge.path("") == ""
    with pytest.raises(EdgeConfigError, match="cannot read the edge config"):
        load_edge_config(tmp_path / "missing.yaml")
