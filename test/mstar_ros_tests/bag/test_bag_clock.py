"""`bag play --clock`: a node on sim time sees the recorded stamps as current; the clock follows the bag.

The subscriber is a real rclpy node with ``use_sim_time`` set, in this process; the player is
`mstar-ros bag play` in its own. The bag's stamps are from 2024: by the system clock they are old.
"""

from __future__ import annotations

import threading
import time

import pytest

from mstar_ros.bag.info import read_info
from mstar_ros.bag.player import PlayOptions

CAMERA = "/robot1/camera/exterior/image_raw"


class SimTimeNode:
    """An rclpy node with use_sim_time:=true: per camera frame, (header.stamp, its clock at arrival) in seconds;
    every /clock message it got."""

    def __init__(self, domain_id: int) -> None:
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.parameter import Parameter
        from rclpy.qos import qos_profile_sensor_data
        from rosgraph_msgs.msg import Clock
        from sensor_msgs.msg import Image

        self.context = Context()
        rclpy.init(args=[], context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node(
            "sim_time_probe", context=self.context, parameter_overrides=[Parameter("use_sim_time", value=True)]
        )
        self.frames: list[tuple[float, float]] = []
        self.clocks: list[float] = []
        self.node.create_subscription(Image, CAMERA, self._frame, qos_profile_sensor_data)
        self.node.create_subscription(Clock, "/clock", lambda m: self.clocks.append(_seconds(m.clock)), 100)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _frame(self, msg) -> None:
        self.frames.append((_seconds(msg.header.stamp), self.node.get_clock().now().nanoseconds * 1e-9))

    def _spin(self) -> None:
        while not self._stop.is_set():
            self.executor.spin_once(timeout_sec=0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.node.destroy_node()
        self.context.try_shutdown()


def _seconds(t) -> float:
    return t.sec + t.nanosec * 1e-9


@pytest.fixture
def sim_time_node(ros_env):
    node = SimTimeNode(int(ros_env["ROS_DOMAIN_ID"]))
    yield node
    node.close()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_node_on_sim_time_sees_recorded_stamps_as_current(small_bag, sim_time_node, player_factory):
    bag, spec = small_bag
    player = player_factory(str(bag), "--clock", "--loop", "--stop-after", "4.5", "--progress", "0", "--topics", CAMERA)
    assert player.wait(timeout=90) == 0, player.output
    assert "/clock  [rosgraph_msgs/msg/Clock]" in player.output
    frames, clocks = sim_time_node.frames, sim_time_node.clocks
    start = read_info(bag).start_ns / 1e9  # the first message's bag time (received a few ms after its stamp)
    assert len(frames) >= 40, player.output  # 15 Hz for 4.5 s, best effort
    # by the sim clock every frame is current: at most a clock period (25 ms) and a little delivery apart
    ages = [clock - stamp for stamp, clock in frames]
    assert max(abs(a) for a in ages) < 0.2, ages
    assert time.time() - frames[0][0] > 3600  # by the system clock they are old
    # the clock: the bag's start first, then at 40 Hz through the pass; the second pass starts it over
    assert clocks[0] == pytest.approx(start, abs=1e-6)
    first_pass = clocks[: clocks.index(max(clocks)) + 1]
    assert first_pass == sorted(first_pass) and max(clocks) - start == pytest.approx(spec.seconds, abs=0.2)
    assert 30 <= len(first_pass) / spec.seconds <= 50, len(first_pass)
    assert min(clocks[len(first_pass) :]) < start + 1.0  # over again


def test_clock_and_restamp_are_refused_together():
    with pytest.raises(ValueError, match="--clock and --restamp contradict"):
        PlayOptions(clock_hz=40.0, restamp=True)
    with pytest.raises(ValueError, match="--clock must be a positive"):
        PlayOptions(clock_hz=0.0)
