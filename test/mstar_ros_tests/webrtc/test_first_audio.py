"""The page's first-audio timer (static/first_audio.js) in Chromium, driven tick by tick: a reply is timed at
its first audible output after a quiet moment since the turn, whichever of its audio and its response.created
the page sees first, and the tail of a reply cut off by the turn is not taken for the new one."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import mstar_ros.webrtc
from support.chromium import ARGS, CHROMIUM

pytestmark = pytest.mark.browser

SOURCE = (Path(mstar_ros.webrtc.__file__).parent / "static" / "first_audio.js").read_text()

# each case: the calls made on one FirstAudio in order; `tick` is one analyser frame's peak
CASES = """
window.run = (steps) => {
  const fired = [];
  const timer = new FirstAudio(() => {}, (id, ms, kind) => fired.push([id, kind]));
  for (const [call, arg] of steps) {
    if (call === "tick") timer._tick(arg); else timer[call](arg);
  }
  return fired;
};
"""


def run_cases(cases: dict[str, list]) -> dict[str, list]:
    from playwright.async_api import async_playwright

    async def main():
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            page = await browser.new_page()
            await page.add_script_tag(content=SOURCE.replace("export ", "") + CASES)
            out = {name: await page.evaluate("(s) => window.run(s)", steps) for name, steps in cases.items()}
            await browser.close()
            return out

    return asyncio.run(main())


def test_a_reply_is_timed_once_whatever_arrives_first_and_a_cut_off_tail_is_not_it():
    loud, quiet = 0.3, 0.0
    fired = run_cases(
        {
            "in_order": [["arm", "typed"], ["tick", quiet], ["responseCreated", "r1"], ["tick", loud], ["tick", loud]],
            # the audio overtook response.created: the quiet before it still counts
            "audio_first": [
                ["arm", "typed"],
                ["tick", quiet],
                ["tick", loud],
                ["responseCreated", "r1"],
                ["tick", loud],
            ],
            # the cut-off reply's tail plays on, loud, until the new one's audio: nothing is timed in the tail
            "tail": [["arm", "typed"], ["responseCreated", "r2"], ["tick", loud], ["tick", loud]],
            "tail_then_reply": [
                ["arm", "typed"],
                ["responseCreated", "r2"],
                ["tick", loud],
                ["tick", quiet],
                ["tick", loud],
            ],
            "cut_off_before_audio": [
                ["arm", "typed"],
                ["tick", quiet],
                ["responseCreated", "r1"],
                ["responseDone", "r1"],
                ["tick", loud],
            ],
        }
    )
    assert fired["in_order"] == [["r1", "typed"]]
    assert fired["audio_first"] == [["r1", "typed"]]
    assert fired["tail"] == []
    assert fired["tail_then_reply"] == [["r2", "typed"]]
    assert fired["cut_off_before_audio"] == []
