"""`mstar-ros bag play` in a real subprocess publishing over real DDS to an rclpy subscriber.

The subscriber runs in the test process (its own rclpy context, spun by a thread) with
sensor-data QoS (best effort) on the cameras, as the policy nodes subscribe.
"""

from __future__ import annotations

import hashlib
import time

import numpy as np
import pytest
from rosbags.rosbag2 import Reader
from rosbags.typesys import Stores, get_typestore

from mstar_ros.bag.player import parse_remaps, remap_topic, select_topics

TS = get_typestore(Stores.ROS2_KILTED)


def recorded(path) -> dict[str, list[tuple[int, int, str]]]:
    """topic -> [(bag timestamp, header stamp, digest)] as the subscriber computes digests."""
    out: dict[str, list[tuple[int, int, str]]] = {}
    with Reader(path) as r:
        for c, t, d in r.messages():
            m = TS.deserialize_cdr(d, c.msgtype)
            if c.msgtype.endswith("Image"):
                digest = hashlib.sha1(m.data.tobytes()).hexdigest()
            else:
                digest = hashlib.sha1(repr([round(float(x), 12) for x in m.position]).encode()).hexdigest()
            stamp = m.header.stamp.sec * 10**9 + m.header.stamp.nanosec
            out.setdefault(c.topic, []).append((t, stamp, digest))
    return out


@pytest.mark.timeout(90)
@pytest.mark.slow
def test_play_waits_for_a_late_subscriber_and_follows_the_recording(small_bag, player_factory, subscriber_factory):
    path, spec = small_bag
    rate = 2.0
    bag = recorded(path)
    topics = {t: ("image" if "camera" in t else "joints") for t in bag}
    assert len(topics) == 6 and {t.split("/")[1] for t in topics} == {"robot1", "robot2"}

    player = player_factory(str(path), "--rate", str(rate), "--wait-timeout", "30", "--progress", "0.5")
    player.wait_for_line("waiting for a subscriber", timeout=30)
    time.sleep(1.0)  # the subscriber really is late: the player has been waiting a while
    assert player.proc.poll() is None, player.output
    sub = subscriber_factory(topics)
    assert player.wait(timeout=60) == 0, player.output
    time.sleep(0.3)  # the last messages are in flight when the player exits
    out = player.output
    assert "every topic has a subscriber" in out and "published 360 messages on 6 topics" in out, out

    got = sub.by_topic()
    for topic, recs in bag.items():
        rx = got[topic]
        stamp_to_rec = {s: (t, d) for t, s, d in recs}
        # the late subscriber still gets the first message, and everything arrives in order
        assert rx and rx[0].stamp_ns == recs[0][1], f"{topic}: first message lost"
        stamps = [r.stamp_ns for r in rx]
        assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps), topic
        assert len(rx) >= 0.95 * len(recs), f"{topic}: {len(rx)} of {len(recs)}"
        # the bytes are the recorded ones
        assert all(stamp_to_rec[r.stamp_ns][1] == r.digest for r in rx), topic
        # timing: arrivals follow the recorded receive times divided by the rate
        bag_t = np.array([stamp_to_rec[r.stamp_ns][0] for r in rx]) / 1e9
        arr = np.array([r.arrival for r in rx])
        span_ratio = (arr[-1] - arr[0]) / ((bag_t[-1] - bag_t[0]) / rate)
        assert 0.85 < span_ratio < 1.2, f"{topic}: span ratio {span_ratio:.3f}"
        step_ratio = np.median(np.diff(arr) / (np.diff(bag_t) / rate))
        assert 0.7 < step_ratio < 1.4, f"{topic}: median inter-arrival ratio {step_ratio:.3f}"
    # the two robots' streams are played together, interleaved as recorded
    r1 = [r.arrival for r in got["/robot1/joint_states"]]
    r2 = [r.arrival for r in got["/robot2/joint_states"]]
    assert r2[0] < r1[-1] and r1[0] < r2[-1]
    # the player's own account agrees
    achieved = float(out.split("achieved rate ")[1].split()[0])
    assert 0.85 * rate < achieved < 1.15 * rate, out


@pytest.mark.timeout(90)
def test_loop_topics_remap_and_restamp(small_bag, player_factory, subscriber_factory):
    path, spec = small_bag
    bag = recorded(path)["/robot1/joint_states"]
    sub = subscriber_factory({"/arm/joints": "joints"})  # subscribed before the player starts
    rate = 4.0
    player = player_factory(
        str(path),
        "--topics",
        "/robot1/joint_states",
        "--remap",
        "/robot1:=/arm",
        "--remap",
        "/robot1/joint_states:=/arm/joints",
        "--rate",
        str(rate),
        "--loop",
        "--stop-after",
        "1.8",
        "--restamp",
        "--progress",
        "0",
    )
    assert player.wait(timeout=60) == 0, player.output
    time.sleep(0.2)
    out = player.output
    assert "/arm/joints (from /robot1/joint_states)" in out and "passes" in out, out
    rx = sub.by_topic()["/arm/joints"]
    per_pass = len(bag)  # 90 messages, 0.75 s per pass at rate 4
    assert len(rx) > 1.5 * per_pass, f"{len(rx)} messages: the bag did not loop"
    # restamped: stamps are the publish times (ROS clock now), increasing across the loop seam
    stamps = np.array([r.stamp_ns for r in rx])
    assert np.all(np.diff(stamps) > 0)
    assert abs(stamps[-1] / 1e9 - time.time()) < 30 and stamps[0] > bag[-1][1]
    # the second pass replays the first one's content, at the same pace
    digests = [r.digest for r in rx]
    first = digests[0]
    assert first == bag[0][2] and digests.index(first, 1) >= per_pass - 3
    seam = digests.index(first, 1)
    arr = np.array([r.arrival for r in rx])
    steps = np.diff(arr)
    assert steps[seam - 1] < 4 * np.median(steps)  # no stall at the seam


@pytest.mark.timeout(60)
def test_no_subscriber_times_out_with_a_clear_message(small_bag, player_factory):
    path, _ = small_bag
    player = player_factory(str(path), "--topics", "/robot2", "--wait-timeout", "1")
    assert player.wait(timeout=40) == 1
    out = player.output
    assert "no subscriber on 3 of 3 topics after 1 s" in out, out
    assert "/robot2/joint_states" in out and "/robot1" not in out.split("no subscriber")[1]
    assert "--no-wait" in out


def test_topic_selection_and_remapping_rules():
    topics = ["/robot1/camera/wrist/image_raw", "/robot1/joint_states", "/robot10/joint_states"]
    assert select_topics(topics, None) == topics
    assert select_topics(topics, ["/robot1"]) == topics[:2]  # a namespace, not a string prefix
    assert select_topics(topics, ["robot10/joint_states"]) == topics[2:]
    with pytest.raises(ValueError, match="matches no topic"):
        select_topics(topics, ["/robot3"])
    remaps = parse_remaps(["/robot1:=/left", "/robot1/joint_states:=/left/joints", "robot10:=right"])
    assert remap_topic("/robot1/camera/wrist/image_raw", remaps) == "/left/camera/wrist/image_raw"
    assert remap_topic("/robot1/joint_states", remaps) == "/left/joints"
    assert remap_topic("/robot10/joint_states", remaps) == "/right/joint_states"
    assert remap_topic("/robot2/joint_states", remaps) == "/robot2/joint_states"
    with pytest.raises(ValueError, match="FROM:=TO"):
        parse_remaps(["/a=/b"])


@pytest.mark.timeout(90)
def test_large_frames_arrive_whole_through_the_localhost_profile(tmp_path, ros_env, player_factory, subscriber_factory):
    """640x480 rgb8 (921,600 bytes) to a best-effort subscriber: with config/fastdds_localhost.xml
    the frames go through 32 MB shared memory; with Fast DDS's defaults about a third were lost here."""
    from mstar_ros.bag.synthetic import SyntheticBagSpec, write_synthetic_bag

    assert ros_env["FASTDDS_DEFAULT_PROFILES_FILE"].endswith("config/fastdds_localhost.xml")
    spec = SyntheticBagSpec(robots=1, seconds=2.0, width=640, height=480, cameras=("exterior_1", "exterior_2", "wrist"))
    write_synthetic_bag(tmp_path / "vga", spec)
    cams = {t: "image" for t in spec.topics() if "camera" in t}
    sub = subscriber_factory(cams)
    player = player_factory(str(tmp_path / "vga"), "--topics", *cams, "--rate", "2", "--progress", "0")
    assert player.wait(timeout=60) == 0, player.output
    time.sleep(0.3)
    for topic, rx in sub.by_topic().items():
        assert len(rx) >= 29, f"{topic}: {len(rx)} of 30 frames"


def _bag_with_a_planted_type(tmp_path):
    """A bag with a standard topic and one whose type names a package that exists on PYTHONPATH
    (importing it would leave a marker file)."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import get_types_from_msg

    marker = tmp_path / "imported"
    pkg = tmp_path / "site" / "plantedmsgs"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('imported')\n")
    (pkg / "msg.py").write_text("Boom = object\n")
    ts = get_typestore(Stores.ROS2_KILTED)
    ts.register(get_types_from_msg("int32 x\n", "plantedmsgs/msg/Boom"))
    path = tmp_path / "planted_bag"
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        boom = writer.add_connection("/boom", "plantedmsgs/msg/Boom", typestore=ts)
        text = writer.add_connection("/chatter", "std_msgs/msg/String", typestore=ts)
        writer.write(boom, 1, ts.serialize_cdr(ts.types["plantedmsgs/msg/Boom"](x=1), "plantedmsgs/msg/Boom"))
        writer.write(text, 2, ts.serialize_cdr(ts.types["std_msgs/msg/String"](data="hi"), "std_msgs/msg/String"))
    return path, tmp_path / "site", marker


@pytest.mark.timeout(90)
def test_a_bag_naming_an_unknown_type_is_refused_for_that_topic_without_importing_it(tmp_path, ros_env):
    import os
    import subprocess
    import sys

    path, site, marker = _bag_with_a_planted_type(tmp_path)
    env = {**ros_env, "PYTHONPATH": os.pathsep.join([str(site), ros_env.get("PYTHONPATH", "")])}
    play = [sys.executable, "-m", "mstar_ros.cli", "bag", "play", str(path), "--no-wait", "--progress", "0"]
    refused = subprocess.run(play, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        "mstar-ros bag: error: /boom: message type 'plantedmsgs/msg/Boom' is not a standard ROS 2 message type "
        "(rosbags' Kilted type store); the player publishes only those and imports nothing a bag names "
        "(play the other topics with --topics)"
    )
    assert not marker.exists(), "the player imported a package named by the bag"
    played = subprocess.run(play + ["--topics", "/chatter"], env=env, capture_output=True, text=True, timeout=60)
    assert played.returncode == 0 and "published 1 messages on 1 topics" in played.stdout, played.stdout + played.stderr
    assert not marker.exists()


def test_ctrl_c_stops_a_player_started_with_sigint_ignored(small_bag, ros_env):
    """Started as a script's background job (SIGINT ignored, inherited): Ctrl-C still stops it with its
    summary. Python installs no SIGINT handler of its own there; the player installs one while it plays."""
    import signal
    import subprocess
    import sys

    path, _ = small_bag
    proc = subprocess.Popen(
        [sys.executable, "-m", "mstar_ros.cli", "bag", "play", str(path), "--no-wait", "--loop", "--progress", "0"],
        env=ros_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # its topics are listed once its publishers exist
            if "keep last" in line:
                break
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "stopped: published" in rest, rest
