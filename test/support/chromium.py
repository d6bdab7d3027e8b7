"""Debian's Chromium for the page tests (driven by playwright with executable_path; never a downloaded browser)."""
from __future__ import annotations

import shutil

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
        "--autoplay-policy=no-user-gesture-required", "--no-sandbox",
        "--allow-loopback-in-peer-connection"]  # the loopback-only namespace has no other interface
