"""mstar_ros.bag.ros_env and config/fastdds_localhost.xml: localhost-only DDS by default.

The socket test starts a real rclpy node (a publisher and a subscription) with the product's
defaults and reads which addresses its sockets are bound to, from /proc/PID/fd (socket inodes)
and /proc/PID/net/{udp,udp6,tcp,tcp6} (that process's network namespace).
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mstar_ros.bag.ros_env import apply_localhost_defaults, describe_discovery

ROOT = Path(__file__).resolve().parents[3]

NODE = textwrap.dedent("""
    import sys, rclpy
    from std_msgs.msg import String
    from mstar_ros.bag.ros_env import apply_localhost_defaults
    if sys.argv[1] == "defaults":
        apply_localhost_defaults()  # what every mstar_ros process does before rclpy
    rclpy.init()
    node = rclpy.create_node("socket_probe")
    node.create_publisher(String, "/probe", 10)
    node.create_subscription(String, "/probe", lambda m: None, 10)
    for _ in range(5):
        rclpy.spin_once(node, timeout_sec=0.05)
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes it
""")


def _address(hex_address: str) -> str:
    """/proc/net/udp* local_address (ADDR:PORT, the address in host byte order words) -> 'ip'."""
    raw = bytes.fromhex(hex_address.split(":")[0])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def bound_addresses(pid: int) -> list[tuple[str, str, int]]:
    """(protocol, local address, port) of every UDP/TCP socket the process holds."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for proto in ("udp", "udp6", "tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{proto}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                found.append((proto, _address(fields[1]), int(fields[1].split(":")[1], 16)))
    return found


def _probe(env: dict[str, str], mode: str) -> list[tuple[str, str, int]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", NODE, mode],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        return bound_addresses(proc.pid)
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


@pytest.mark.timeout(90)
def test_with_the_product_defaults_no_dds_socket_is_bound_beyond_loopback(monkeypatch):
    monkeypatch.setenv("ROS_DOMAIN_ID", "231")  # a domain of its own; the node only talks to itself
    for key in ("ROS_AUTOMATIC_DISCOVERY_RANGE", "FASTDDS_DEFAULT_PROFILES_FILE", "RMW_IMPLEMENTATION"):
        monkeypatch.delenv(key, raising=False)
    sockets = _probe(dict(os.environ), "defaults")
    # metatraffic and user unicast listeners, a sending socket, the ros_discovery_info reader's own flow
    # (port 7000 + n): all UDP on 127.0.0.1, no TCP, no IPv6
    assert len(sockets) >= 3 and {proto for proto, _, _ in sockets} == {"udp"}, sockets
    assert all(address == "127.0.0.1" for _, address, _ in sockets), sockets
    # what SYSTEM_DEFAULT avoids: with LOCALHOST rmw_fastrtps adds a UDP transport of its own beside the
    # profile's, with sending sockets on 0.0.0.0 (and on every other interface's address)
    widened = {
        **os.environ,
        "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
        "FASTDDS_DEFAULT_PROFILES_FILE": str(ROOT / "config" / "fastdds_localhost.xml"),
    }
    assert "0.0.0.0" in {address for _, address, _ in _probe(widened, "as-set")}


def test_the_defaults_apply_the_profile_without_rmws_own_localhost_transport():
    env: dict[str, str] = {}
    assert (
        apply_localhost_defaults(env)
        == env
        == {
            "FASTDDS_DEFAULT_PROFILES_FILE": str(ROOT / "config" / "fastdds_localhost.xml"),
            "ROS_AUTOMATIC_DISCOVERY_RANGE": "SYSTEM_DEFAULT",
        }
    )
    assert describe_discovery(env).startswith("DDS on 127.0.0.1 only")
    # LOCALHOST set by the user: the same scope, served by the profile alone
    env = {"ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"}
    apply_localhost_defaults(env)
    assert env["ROS_AUTOMATIC_DISCOVERY_RANGE"] == "SYSTEM_DEFAULT" and "FASTDDS_DEFAULT_PROFILES_FILE" in env
    # another RMW does not read the profile: it keeps LOCALHOST
    env = {"RMW_IMPLEMENTATION": "rmw_cyclonedds_cpp"}
    apply_localhost_defaults(env)
    assert env["ROS_AUTOMATIC_DISCOVERY_RANGE"] == "LOCALHOST"


def test_the_defaults_never_override_a_users_choice():
    mine = {"ROS_AUTOMATIC_DISCOVERY_RANGE": "SUBNET", "FASTDDS_DEFAULT_PROFILES_FILE": "/etc/my.xml"}
    assert apply_localhost_defaults(mine) == {} and mine["ROS_AUTOMATIC_DISCOVERY_RANGE"] == "SUBNET"
    own_profile = {"FASTDDS_DEFAULT_PROFILES_FILE": "/etc/my.xml"}
    assert apply_localhost_defaults(own_profile) == {"ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"}
    wider = {"ROS_AUTOMATIC_DISCOVERY_RANGE": "SUBNET"}  # widening is a choice: no localhost profile over it
    assert apply_localhost_defaults(wider) == {} and describe_discovery(wider).startswith("DDS: ")
