"""A real headless Chromium (Debian's, driven by playwright) on the gateway's page: it connects, speaks a
typed text, hears the audio (inbound RTP and an AnalyserNode level), gets the events, and interrupts."""

from __future__ import annotations

import asyncio

import pytest

from support.chromium import ARGS, CHROMIUM, open_with_microphone
from support.webrtc_gateway import gateway_for

pytestmark = pytest.mark.browser


async def _open(browser, url: str):
    page = await browser.new_page()
    await page.goto(url)
    await page.click("#connect")
    await page.wait_for_function(
        "window.mstarVoice.channel && window.mstarVoice.channel.readyState === 'open'", timeout=30000
    )
    return page


async def _types(page) -> list[str]:
    return await page.evaluate("window.mstarVoice.events.map(e => e.type)")


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_two_browsers_hear_their_responses_and_one_interrupts(orpheus):
    from playwright.async_api import async_playwright

    async def main():
        async with gateway_for(orpheus) as (c, gateway, url):
            idle_blocks = c.kv_blocks_used()
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
                one, two = await _open(browser, url), await _open(browser, url)
                assert len(gateway.peers) == 2
                await one.fill("#text", "Hello from the first browser.")
                await one.click("#speak")
                await two.fill("#text", "A much longer sentence for the second browser to hear. " * 4)
                await two.click("#speak")
                # the second browser interrupts as soon as its audio plays (both utterances run ~14 s)
                await two.wait_for_function("window.mstarVoice.maxLevel > 0.001", timeout=60000)
                await two.click("#interrupt")
                await two.wait_for_function(
                    "window.mstarVoice.events.some(e => e.type === 'response.done')", timeout=20000
                )
                done_two = await two.evaluate(
                    "window.mstarVoice.events.filter(e => e.type === 'response.done')[0].response.status"
                )
                await one.wait_for_function(  # the whole answer heard: after response.done
                    "window.mstarVoice.events.some(e => e.type === 'output_audio_buffer.stopped')", timeout=120000
                )
                stats_one = await one.evaluate("window.mstarInboundStats()")
                level_one = await one.evaluate("window.mstarVoice.maxLevel")
                ttfa = await one.evaluate("window.mstarVoice.ttfaMs")
                transcript = await one.inner_text("#conversation .turn.assistant .text")  # the reply
                await asyncio.sleep(0.5)
                blocks = c.kv_blocks_used()
                before = await two.evaluate("window.mstarInboundStats()")
                await asyncio.sleep(0.5)
                after = await two.evaluate("window.mstarInboundStats()")
                types_one = await _types(one)
                await browser.close()
                return (stats_one, level_one, ttfa, transcript, types_one, done_two, blocks, idle_blocks, before, after)

    stats_one, level, ttfa, transcript, types, done_two, blocks, idle_blocks, before, after = asyncio.run(main())
    assert stats_one["packetsReceived"] > 50 and stats_one["totalSamplesReceived"] > 48000 * 0.5, stats_one
    assert level > 0.01  # an AnalyserNode heard the (random-weight) speech, not silence
    assert ttfa is not None and ttfa > 0
    assert transcript == "Hello from the first browser."
    assert types[:5] == [
        "session.created",
        "response.created",
        "response.output_item.added",
        "conversation.item.created",
        "response.content_part.added",
    ], types
    assert types.index("response.done") < types.index("output_audio_buffer.stopped"), types
    assert done_two == "cancelled" and blocks == idle_blocks
    assert after["packetsReceived"] > before["packetsReceived"]  # the track goes on (silence), paced


@pytest.mark.timeout(180)
def test_a_fake_microphone_speaking_over_the_response_interrupts_it(orpheus, tmp_path):
    """Chromium's fake capture plays a WAV (silence, then espeak-ng speech) as the page's microphone."""
    import subprocess
    import wave

    import numpy as np
    from playwright.async_api import async_playwright

    spoken = tmp_path / "spoken.wav"
    subprocess.run(["espeak-ng", "-w", str(spoken), "Excuse me, stop talking please."], check=True)
    with wave.open(str(spoken)) as w:
        rate, speech = w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    mic = tmp_path / "mic.wav"
    with wave.open(str(mic), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.concatenate([np.zeros(rate * 2, np.int16), speech, np.zeros(rate * 2, np.int16)]).tobytes())

    async def main():
        async with gateway_for(orpheus) as (c, _, url):
            idle = c.kv_blocks_used()
            async with async_playwright() as pw:
                browser, page = await open_with_microphone(pw, url, mic)
                await page.fill("#text", "A long answer that the user talks over. " * 4)
                await page.click("#speak")
                await page.wait_for_function(
                    "window.mstarVoice.events.some(e => e.type === 'input_audio_buffer.speech_started') && "
                    "window.mstarVoice.events.some(e => e.type === 'response.done')",
                    timeout=60000,
                )
                events = await page.evaluate("window.mstarVoice.events")
                await asyncio.sleep(0.3)
                await browser.close()
                return events, c.kv_blocks_used(), idle

    events, blocks, idle = asyncio.run(main())
    types = [e["type"] for e in events]
    assert types.index("input_audio_buffer.speech_started") < types.index("response.done"), types
    assert [e for e in events if e["type"] == "response.done"][0]["response"]["status"] == "cancelled"
    assert blocks == idle
