"""Debian's Chromium for the page tests (driven by playwright with executable_path; never a downloaded browser)."""

from __future__ import annotations

import shutil

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
    "--no-sandbox",
    "--allow-loopback-in-peer-connection",
]  # the loopback-only namespace has no other interface


async def open_with_microphone(pw, url: str, wav):
    """A headless Chromium whose fake microphone plays ``wav`` (in a loop), on the page at ``url``,
    connected with the microphone on: (browser, page)."""
    browser = await pw.chromium.launch(
        executable_path=CHROMIUM, headless=True, args=ARGS + [f"--use-file-for-fake-audio-capture={wav}"]
    )
    page = await browser.new_page()
    await page.goto(url)
    await page.check("#mic")
    await page.click("#connect")
    await page.wait_for_function(
        "window.mstarVoice.channel && window.mstarVoice.channel.readyState === 'open'", timeout=30000
    )
    return browser, page
