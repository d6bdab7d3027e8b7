"""Localhost-only ROS 2 defaults, applied before rclpy creates a DDS participant.

- ``ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST`` when unset: discovery stays on this
  host (on Kilted ``ROS_LOCALHOST_ONLY=1`` is silently ignored). A wider range is
  an explicit user choice: set the variable yourself.
- ``FASTDDS_DEFAULT_PROFILES_FILE`` = ``config/fastdds_localhost.xml`` when unset: a
  32 MB shared-memory segment (camera frames over 512 KB otherwise fall onto
  fragmented UDP) and UDP on 127.0.0.1 only.

Variables the user has set are never changed.
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import MutableMapping

log = logging.getLogger(__name__)

PROFILE_NAME = "fastdds_localhost.xml"


def fastdds_profile_path() -> Path | None:
    """The shipped Fast DDS profile: the source tree's config/, else <prefix>/share/mstar_ros/config/."""
    candidates = [Path(__file__).resolve().parents[2] / "config" / PROFILE_NAME,
                  Path(sys.prefix) / "share" / "mstar_ros" / "config" / PROFILE_NAME]
    return next((p for p in candidates if p.is_file()), None)


def apply_localhost_defaults(env: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Sets the defaults above in ``env`` (os.environ by default) where unset; returns what it set."""
    env = os.environ if env is None else env
    applied: dict[str, str] = {}
    if not env.get("ROS_AUTOMATIC_DISCOVERY_RANGE"):
        env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = applied["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    if not env.get("FASTDDS_DEFAULT_PROFILES_FILE"):
        profile = fastdds_profile_path()
        if profile is None:
            log.warning("%s not found: Fast DDS keeps its defaults (frames over 512 KB go over UDP)", PROFILE_NAME)
        else:
            env["FASTDDS_DEFAULT_PROFILES_FILE"] = applied["FASTDDS_DEFAULT_PROFILES_FILE"] = str(profile)
    return applied
