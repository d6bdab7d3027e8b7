"""Voice chat in a real headless Chromium (Debian's, playwright): the page's fake microphone says a sentence,
tiny Qwen3-Omni (random weights) answers it in voice with its transcript; speaking over an answer cancels
it and every stage's KV is freed; an image picked in the page joins the conversation, scaled to 640 px.

Chromium loops the microphone file: the pause after the sentence must outlast the spoken answer, or the
sentence's next loop barges in on every answer and none completes (on a slow CI machine with a 1.5 s
pause, it did)."""

from __future__ import annotations

import asyncio

import pytest

from mstar.conductor import Conductor
from mstar_ros.webrtc.server import VoiceGateway
from support.chromium import open_with_microphone
from support.images import picture
from support.webrtc_gateway import serve_gateway

pytestmark = pytest.mark.browser


STAMP_EVENTS = (
    "(() => { const events = window.mstarVoice.events, push = events.push.bind(events);"
    " events.push = (e) => { e.received_ms = Math.round(performance.now()); return push(e); }; })()"
)


async def wait_for_response(page, status: str) -> None:
    """Until a ``response.done`` with ``status`` came; on a timeout, the error lists what did come, and when."""
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    try:
        await page.wait_for_function(
            f"window.mstarVoice.events.some(e => e.type === 'response.done' && e.response.status === '{status}')",
            timeout=90000,
        )
    except PlaywrightTimeout:
        events = await page.evaluate("window.mstarVoice.events")
        came = [
            (e.get("received_ms"), e["type"], e.get("response", {}).get("status"))
            for e in events
            if not e["type"].endswith(".delta")
        ]
        raise AssertionError(f"no response.done {status!r} in 90 s; the events: {came}") from None


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_a_spoken_turn_in_the_browser_is_answered_and_a_barge_in_frees_every_stage(
    qwen3_omni, speech_wav_long_pause, tmp_path
):
    from playwright.async_api import async_playwright

    mic, _ = speech_wav_long_pause  # 2.5 s silence, a sentence, 8 s silence; Chromium plays it in a loop
    photo = tmp_path / "photo.png"
    picture(800, 500, 4).save(photo)

    async def main():
        async with Conductor(qwen3_omni.graph(), qwen3_omni.modules()) as c:
            idle = c.kv_blocks_used()
            gateway = VoiceGateway(qwen3_omni, c, model_name="qwen3-omni")
            runner, url = await serve_gateway(gateway)
            try:
                async with async_playwright() as pw:
                    browser, page = await open_with_microphone(pw, url, mic)
                    await page.evaluate(STAMP_EVENTS)
                    # short answers: each is done before the looped sentence comes round again
                    await page.evaluate(
                        "window.mstarVoice.channel.send(JSON.stringify({type: 'session.update', "
                        "session: {max_output_tokens: 25, seed: 5}}))"
                    )
                    await wait_for_response(page, "completed")
                    transcript = await page.inner_text("#conversation .turn.assistant .text")  # the answer
                    heard = await page.evaluate("""async () => {
                        const stats = await window.mstarVoice.pc.getStats();
                        let samples = 0;
                        stats.forEach(s => { if (s.type === 'inbound-rtp' && s.kind === 'audio') samples = s.totalSamplesReceived; });
                        return samples; }""")
                    # a long typed answer, talked over by the next loop of the sentence
                    await page.evaluate(
                        "window.mstarVoice.channel.send(JSON.stringify({type: 'session.update', "
                        "session: {max_output_tokens: 1000}}))"
                    )
                    await page.fill("#text", "tell me a long story about robots")
                    await page.click("#speak")
                    await wait_for_response(page, "cancelled")
                    # the page offers images (the session says the model takes them): one picked joins the conversation
                    assert await page.is_visible("#imagebox")
                    await page.set_input_files("#image", str(photo))
                    await page.wait_for_function(
                        "window.mstarVoice.events.some(e => e.type === "
                        "'conversation.item.created' && e.item.content.some("
                        "c => c.type === 'input_image'))",
                        timeout=30000,
                    )
                    shown = [turn[3] for peer in gateway.peers.values() for turn in peer.history if len(turn) > 3]
                    events = await page.evaluate("window.mstarVoice.events")
                    await browser.close()
                for _ in range(300):
                    if c.kv_blocks_used() == idle:
                        break
                    await asyncio.sleep(0.02)
                return events, transcript, heard, c.kv_blocks_used(), idle, shown
            finally:
                await runner.cleanup()

    events, transcript, heard, blocks, idle, shown = asyncio.run(main())
    types = [e["type"] for e in events]
    assert types.index("input_audio_buffer.speech_started") < types.index("input_audio_buffer.committed")
    answered = next(e for e in events if e["type"] == "response.done" and e["response"]["status"] == "completed")
    done_text = [e["transcript"] for e in events if e["type"] == "response.output_audio_transcript.done"]
    assert done_text and transcript.strip() and answered
    assert heard > 0  # the answer's audio reached the browser's receiver
    assert any(e["type"] == "response.done" and e["response"]["status"] == "cancelled" for e in events)
    assert blocks == idle  # the Thinker's and the Talker's KV are free after the barge-in
    item = next(
        e["item"]
        for e in events
        if e["type"] == "conversation.item.created" and any(c["type"] == "input_image" for c in e["item"]["content"])
    )
    assert item["role"] == "user" and item["content"] == [{"type": "input_image", "width": 640, "height": 400}]
    assert [len(images) for images in shown] == [1]  # kept prepared for the model (mstar_ros.webrtc.peer)
