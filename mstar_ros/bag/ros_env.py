"""Localhost-only ROS 2 defaults, applied before rclpy creates a DDS participant.

When neither ``FASTDDS_DEFAULT_PROFILES_FILE`` nor ``ROS_AUTOMATIC_DISCOVERY_RANGE`` says
otherwise:

- ``FASTDDS_DEFAULT_PROFILES_FILE`` = the shipped ``config/fastdds_localhost.xml`` (the
  source tree's, else ``<prefix>/share/mstar_ros/config/``): shared memory with a 32 MB
  segment (camera frames over 512 KB otherwise fall onto fragmented UDP), UDP on
  127.0.0.1 only, discovery by unicast to 127.0.0.1, no multicast: every socket of the
  participant is bound to 127.0.0.1.
- ``ROS_AUTOMATIC_DISCOVERY_RANGE=SYSTEM_DEFAULT`` with that profile, so that rmw_fastrtps
  uses the profile as it is: with ``LOCALHOST`` it adds a UDP transport of its own beside
  the profile's, with no interface whitelist, whose sending sockets are bound to 0.0.0.0
  and to every interface's address. Discovery stays on this host either way, so a
  ``LOCALHOST`` you set yourself becomes ``SYSTEM_DEFAULT`` too when the profile is applied
  (the same scope, fewer sockets).
- Fast DDS segments of processes that died are removed first (``shm_segments``).
- ``ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST`` when the profile is not applied (your own
  profile, another RMW, or the file not found; on Kilted ``ROS_LOCALHOST_ONLY=1`` is
  silently ignored).

Nothing else you set is changed: your own profile stays, and a range other than LOCALHOST
(SUBNET, SYSTEM_DEFAULT) is a choice to widen discovery, so the localhost profile is not
applied then.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from pathlib import Path

from mstar_ros.bag.shm_segments import remove_stale_segments
from mstar_ros.config_files import find_config

log = logging.getLogger(__name__)

PROFILE_NAME = "fastdds_localhost.xml"
PROFILE_VAR, RANGE_VAR = "FASTDDS_DEFAULT_PROFILES_FILE", "ROS_AUTOMATIC_DISCOVERY_RANGE"
#: the RMWs that read FASTDDS_DEFAULT_PROFILES_FILE ("" = the default RMW, Fast DDS)
FASTDDS_RMWS = ("", "rmw_fastrtps_cpp", "rmw_fastrtps_dynamic_cpp")


def fastdds_profile_path() -> Path | None:
    """The shipped Fast DDS profile (mstar_ros.config_files order), or None."""
    return find_config(PROFILE_NAME)


def apply_localhost_defaults(env: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Sets the defaults above in ``env`` (os.environ by default) where unset; returns what it set."""
    env = os.environ if env is None else env
    applied: dict[str, str] = {}
    discovery = env.get(RANGE_VAR, "")
    if not env.get(PROFILE_VAR) and discovery in ("", "LOCALHOST"):
        profile = fastdds_profile_path()
        if profile is None:
            log.warning("%s not found: Fast DDS keeps its defaults (frames over 512 KB go over UDP)", PROFILE_NAME)
        else:
            applied[PROFILE_VAR] = str(profile)
    on_profile = PROFILE_VAR in applied and env.get("RMW_IMPLEMENTATION", "") in FASTDDS_RMWS
    if on_profile:
        applied[RANGE_VAR] = "SYSTEM_DEFAULT"
        remove_stale_segments()  # the profile's segments are 32 MB: a killed process's must not stay
    elif not discovery:
        applied[RANGE_VAR] = "LOCALHOST"
    env.update(applied)
    return applied


def describe_discovery(env: MutableMapping[str, str] | None = None) -> str:
    """One line for users: what DDS discovery and transport are limited to."""
    env = os.environ if env is None else env
    profile = env.get(PROFILE_VAR, "")
    if Path(profile).name == PROFILE_NAME and env.get(RANGE_VAR) == "SYSTEM_DEFAULT":
        return f"DDS on 127.0.0.1 only ({profile})"
    return f"DDS: {RANGE_VAR}={env.get(RANGE_VAR, '(unset)')}, {PROFILE_VAR}={profile or '(unset)'}"
