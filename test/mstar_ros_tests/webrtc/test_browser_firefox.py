"""The gateway's page in Debian's Firefox ESR (driven over WebDriver BiDi): it connects with its
(fake) microphone on, speaks a typed text, hears the audio, gets the events, and interrupts."""

from __future__ import annotations

import asyncio

import pytest

from support.firefox import Firefox
from support.webrtc_gateway import gateway_for

pytestmark = pytest.mark.browser


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_firefox_hears_a_response_and_interrupts_the_next(orpheus):
    async def main():
        async with gateway_for(orpheus) as (c, gateway, url):
            idle_blocks = c.kv_blocks_used()
            async with Firefox() as firefox:
                page = await firefox.new_page()
                await page.goto(url)
                await page.evaluate("document.querySelector('#mic').checked = true")
                await page.click("#connect")
                await page.wait_for_function(
                    "window.mstarVoice.channel && window.mstarVoice.channel.readyState === 'open'", 30
                )
                peers = len(gateway.peers)
                await page.fill("#text", "Hello from Firefox.")
                await page.click("#speak")
                await page.wait_for_function(  # the whole answer heard: after response.done
                    "window.mstarVoice.events.some(e => e.type === 'output_audio_buffer.stopped')", 120
                )
                stats = await page.evaluate("window.mstarInboundStats()")
                level = await page.evaluate("window.mstarVoice.maxLevel")
                ttfa = await page.evaluate("window.mstarVoice.ttfaMs")
                transcript = await page.evaluate(
                    "document.querySelector('#conversation .turn.assistant .text').textContent"
                )
                state = await page.evaluate("document.querySelector('#state').textContent")
                # a long second answer, interrupted as soon as it plays
                await page.fill("#text", "A much longer sentence that Firefox interrupts. " * 4)
                await page.click("#speak")
                await page.wait_for_function(
                    "window.mstarVoice.events.filter("
                    "e => e.type === 'response.output_audio_transcript.delta').length >= 2",
                    60,
                )
                await page.click("#interrupt")
                await page.wait_for_function(
                    "window.mstarVoice.events.filter(e => e.type === 'response.done').length >= 2", 20
                )
                events = await page.evaluate("window.mstarVoice.events")
                await asyncio.sleep(0.5)
                return peers, stats, level, ttfa, transcript, state, events, c.kv_blocks_used(), idle_blocks

    peers, stats, level, ttfa, transcript, state, events, blocks, idle_blocks = asyncio.run(main())
    assert peers == 1 and state == "connected"
    assert stats["packetsReceived"] > 50 and stats["totalSamplesReceived"] > 48000 * 0.5, stats
    assert level > 0.01  # an AnalyserNode heard the (random-weight) speech, not silence
    assert ttfa is not None and ttfa > 0
    assert transcript == "Hello from Firefox.", transcript
    types = [e["type"] for e in events]
    assert types[:5] == [
        "session.created",
        "response.created",
        "response.output_item.added",
        "conversation.item.created",
        "response.content_part.added",
    ], types
    assert types.index("response.done") < types.index("output_audio_buffer.stopped"), types
    done = [e["response"]["status"] for e in events if e["type"] == "response.done"]
    assert done == ["completed", "cancelled"], done
    assert "input_audio_buffer.speech_started" not in types  # the fake microphone's tone is not speech
    assert blocks == idle_blocks
