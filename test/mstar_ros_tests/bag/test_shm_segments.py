"""Dead participants' Fast DDS segments go; live ones, and ones being created, stay."""

from __future__ import annotations

import fcntl
import os
import time

from mstar_ros.bag.shm_segments import remove_stale_segments


def _segment(d, name: str, age_s: float) -> None:
    (d / name).write_bytes(b"x" * 1000)
    (d / f"{name}_el").write_bytes(b"")
    old = time.time() - age_s
    os.utime(d / f"{name}_el", (old, old))


def test_only_unlocked_old_segments_are_removed(tmp_path):
    _segment(tmp_path, "fastdds_0123456789abcdef", 120)  # dead owner
    _segment(tmp_path, "fastdds_aaaaaaaaaaaaaaaa", 120)  # live owner: holds the lock
    _segment(tmp_path, "fastdds_bbbbbbbbbbbbbbbb", 1)  # being created: lock not taken yet
    (tmp_path / "fastdds_port7411_el").write_bytes(b"")  # not a segment
    with open(tmp_path / "fastdds_aaaaaaaaaaaaaaaa_el", "ab") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert remove_stale_segments(tmp_path, min_age_s=30) == ["fastdds_0123456789abcdef"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [
        "fastdds_aaaaaaaaaaaaaaaa",
        "fastdds_aaaaaaaaaaaaaaaa_el",
        "fastdds_bbbbbbbbbbbbbbbb",
        "fastdds_bbbbbbbbbbbbbbbb_el",
        "fastdds_port7411_el",
    ]
    assert remove_stale_segments(tmp_path / "missing") == []


def test_a_real_participant_keeps_its_segment(ros_env, tmp_path):
    """A live rclpy participant's segment is locked: a sweep leaves it."""
    import rclpy
    from rclpy.context import Context

    before = set(os.listdir("/dev/shm"))
    context = Context()
    rclpy.init(args=[], context=context)
    try:
        node = rclpy.create_node("shm_probe", context=context)
        mine = [n for n in set(os.listdir("/dev/shm")) - before if n.startswith("fastdds_") and n.endswith("_el")]
        assert mine, "the participant made no segment"
        for name in mine:
            os.utime(f"/dev/shm/{name}", (time.time() - 120, time.time() - 120))
        removed = remove_stale_segments(min_age_s=30)
        assert not {n[:-3] for n in mine} & set(removed)
        node.destroy_node()
    finally:
        context.try_shutdown()
