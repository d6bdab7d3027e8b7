"""Fast DDS ports a process used go at its clean exit, unless a live process still uses them.

The unit tests make ports as Fast DDS lays them out in /dev/shm (segment, lock file, POSIX semaphore),
under port numbers no Fast DDS participant uses. The process tests run real rclpy participants: a peer
that discovered ours is SIGKILLed (its reference in our ports is never given back), then ours is
stopped with SIGINT, and none of the ports it used may stay behind.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import re
import signal
import subprocess
import sys
import threading
import time

import posix_ipc
import pytest

from mstar_ros.bag.shm_ports import SHM_DIR, ports_in_use, remove_unused_ports

_BASE = 4_000_000_000 + (os.getpid() % 100_000) * 10  # above every UDP-derived port: never a real one


class FakePort:
    """A port laid out as Fast DDS lays one out: segment, listener lock file, mutex semaphore."""

    def __init__(self, index: int) -> None:
        self.name = f"fastdds_port{_BASE + index}"
        self.segment, self.lock = SHM_DIR / self.name, SHM_DIR / f"{self.name}_el"
        self.segment.write_bytes(bytes(4096))
        self.lock.write_bytes(b"")
        self.mutex = posix_ipc.Semaphore(f"/{self.name}_mutex", posix_ipc.O_CREX, initial_value=1)

    def files(self) -> list[str]:
        return sorted(p.name for p in SHM_DIR.iterdir() if self.name in p.name)

    def remove(self) -> None:
        for path in (self.segment, self.lock):
            path.unlink(missing_ok=True)
        try:
            self.mutex.unlink()
        except posix_ipc.ExistentialError:
            pass
        self.mutex.close()


@pytest.fixture
def fake_ports():
    made: list[FakePort] = []

    def make() -> FakePort:
        made.append(FakePort(len(made)))
        return made[-1]

    yield make
    for port in made:
        port.remove()


def test_an_unused_port_goes_with_its_lock_file_and_mutex(fake_ports):
    port = fake_ports()
    assert port.files() == [port.name, f"{port.name}_el", f"sem.{port.name}_mutex"]
    assert remove_unused_ports([port.name]) == [port.name]
    assert port.files() == []


def test_a_port_whose_listener_lives_stays(fake_ports):
    port = fake_ports()
    with open(port.lock, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert remove_unused_ports([port.name]) == []
    assert len(port.files()) == 3


def test_a_port_another_live_process_maps_stays(fake_ports):
    port = fake_ports()
    mapper = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import mmap, sys\n"
            f"f = open({str(port.segment)!r}, 'r+b'); m = mmap.mmap(f.fileno(), 0)\n"
            "print('mapped', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert mapper.stdout.readline().strip() == "mapped"
        assert port.name in ports_in_use(mapper.pid)
        assert remove_unused_ports([port.name]) == []
        assert len(port.files()) == 3
    finally:
        mapper.kill()
        mapper.wait()
    assert remove_unused_ports([port.name]) == [port.name]  # the last user is gone: now it goes


def test_a_port_being_opened_right_now_stays(fake_ports):
    """Fast DDS holds the port's mutex while it opens or closes the port: we never take it from under it."""
    port = fake_ports()
    port.mutex.acquire()
    try:
        assert remove_unused_ports([port.name]) == []
    finally:
        port.mutex.release()
    assert len(port.files()) == 3


def test_ports_of_this_process_are_read_from_its_memory_maps(fake_ports):
    port = fake_ports()
    with open(port.segment, "r+b") as f, mmap.mmap(f.fileno(), 0):
        assert port.name in ports_in_use()
        assert remove_unused_ports([port.name]) == []  # we map it ourselves
    assert port.name not in ports_in_use()


# -- real participants


PEER = """\
import rclpy, sys
from std_msgs.msg import String
rclpy.init(args=[])
node = rclpy.create_node("doomed_peer")
node.create_subscription(String, "/anything", lambda m: None, 10)
print("up", flush=True)
rclpy.spin(node)
"""

ROS_PROCESS = """\
import asyncio, rclpy
from std_msgs.msg import String
from mstar_ros.ros.common.ros_process import RosProcess

async def main():
    async with RosProcess("shm_probe", []) as ros:
        node = rclpy.create_node("shm_probe")
        node.create_publisher(String, "/anything", 10)
        ros.add(node)
        ros.spin()
        print("up", flush=True)
        await ros.stopped()
asyncio.run(main())
"""


def _listening(pid: int) -> set[str]:
    """The ports whose listener lock the process holds (its open ``fastdds_portN_el`` files)."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if m := re.fullmatch(r"/dev/shm/(fastdds_port\d+)_el", target):
            out.add(m.group(1))
    return out


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _mapped_by_anyone(port: str) -> bool:
    return any(port in ports_in_use(p) for p in os.listdir("/proc") if p.isdigit())


class Output:
    """A process's output lines, read by a thread."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self.thread = threading.Thread(target=lambda: self.lines.extend(proc.stdout), daemon=True)
        self.thread.start()

    def has(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def text(self) -> str:
        self.thread.join(timeout=10)
        return "".join(self.lines)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("process", ["bag play", "node set process"])
def test_a_clean_stop_after_a_peer_was_killed_leaves_no_port_behind(process, small_bag, ros_env, tmp_path):
    bag, _spec = small_bag
    if process == "bag play":
        cmd = [
            sys.executable,
            "-m",
            "mstar_ros.cli",
            "bag",
            "play",
            str(bag),
            "--no-wait",
            "--loop",
            "--progress",
            "0.2",
            "--rate",
            "0.2",
        ]
        serving = "msgs ("  # a progress line: playing
    else:
        cmd, serving = [sys.executable, "-c", ROS_PROCESS], "up"
    ours = subprocess.Popen(cmd, env=ros_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peer = subprocess.Popen([sys.executable, "-c", PEER], env=ros_env, stdout=subprocess.PIPE, text=True)
    output = Output(ours)
    try:
        _wait(lambda: output.has(serving), 60, f"{process} to serve")
        _wait(lambda: _listening(ours.pid), 60, "our participant's ports")
        _wait(lambda: _listening(ours.pid) <= ports_in_use(peer.pid), 60, "the peer to open our ports")
        used = ports_in_use(ours.pid)
        peer.kill()  # its reference in our ports is never given back
        peer.wait()
        ours.send_signal(signal.SIGINT)
        ours.wait(timeout=60)
    finally:
        for p in (ours, peer):
            if p.poll() is None:
                p.kill()
                p.wait()
    said = output.text()
    assert ours.returncode == 0, said
    assert used and "Traceback" not in said, said
    # a port still here must be in use by a live process (another test on this host may reuse its number)
    left = sorted(p for p in used if (SHM_DIR / p).exists() and not _mapped_by_anyone(p))
    assert left == [], f"left in /dev/shm: {left}"
    sems = sorted(p for p in used if (SHM_DIR / f"sem.{p}_mutex").exists() and not (SHM_DIR / p).exists())
    assert sems == [], f"semaphores left in /dev/shm: {sems}"


def test_without_posix_ipc_the_ports_are_left_with_one_line_not_a_traceback(monkeypatch, caplog):
    """A colcon or /opt/ros install may lack posix_ipc (a pip dependency): a clean exit must stay clean."""
    import logging

    monkeypatch.setitem(sys.modules, "posix_ipc", None)  # `import posix_ipc` now raises ImportError
    with caplog.at_level(logging.INFO, logger="mstar_ros.bag.shm_ports"):
        assert remove_unused_ports(["fastdds_port7411"]) == []
    assert any("posix_ipc is not installed" in r.getMessage() for r in caplog.records)
