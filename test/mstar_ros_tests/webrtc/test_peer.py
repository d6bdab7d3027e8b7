"""A peer as an OpenAI Realtime client meets it (tiny Orpheus, real aiortc peers and a real Chromium): the
session names the model and its voices, every field not served is an error naming it and changes nothing,
the ids of items, parts and deltas, the audio buffer's events, items truncated and deleted; a tab closed
mid-response logs no traceback, and a peer lost to ICE consent is logged with its cause."""

from __future__ import annotations

import asyncio
import base64
import gc
import logging
import subprocess
import sys
import time

import pytest
from aiohttp import ClientSession

from mstar_ros.webrtc.client import GatewayClient
from support.vanishing_peer import VANISHING_PEER
from support.webrtc_gateway import gateway_for


def errors(client) -> list[dict]:
    return [e["error"] for e in client.events if e["type"] == "error"]


@pytest.mark.timeout(180)
def test_an_openai_client_gets_its_events_and_an_error_naming_each_field_not_served(orpheus):
    async def main():
        async with gateway_for(orpheus, model_name="orpheus") as (c, gateway, url):
            client = GatewayClient()
            try:
                async with ClientSession() as http:
                    pc_id = (await client.connect(http, url))["pc_id"]
                peer = gateway.peers[pc_id]
                await client.until(lambda: "session.created" in client.types(), 10, "session.created")
                refused = [
                    {"type": "realtime", "audio": {"output": {"voice": "alloy"}}, "max_output_tokens": 21},
                    {"instructions": "Be brief."},
                    {"tools": [{"type": "function", "name": "lookup"}]},
                    {"audio": {"input": {"transcription": {"model": "whisper-1"}}}},
                ]
                for i, session in enumerate(refused):
                    client.send(type="session.update", event_id=f"evt_{i}", session=session)
                client.send(type="input_audio_buffer.append", audio=base64.b64encode(b"\0\0" * 2400).decode())
                await client.until(lambda: len(errors(client)) == 5, 10, "the refusals")
                unchanged = peer.session_state()
                client.send(
                    type="session.update",
                    session={
                        "type": "realtime",
                        "output_modalities": ["audio"],
                        "audio": {"output": {"voice": "Leah"}},
                        "max_output_tokens": 21,
                        "seed": 1,
                    },
                )
                await client.until(lambda: "session.updated" in client.types(), 10, "session.updated")
                client.send(type="response.create", text="Hello there.")
                await client.until(lambda: "output_audio_buffer.stopped" in client.types(), 60, "the audio's end")
                answer = next(e for e in client.events if e["type"] == "response.done")["response"]
                item_id = answer["output"][0]["id"]
                client.send(type="conversation.item.truncate", item_id=item_id, content_index=0, audio_end_ms=10**6)
                client.send(type="conversation.item.truncate", item_id=item_id, content_index=0, audio_end_ms=100)
                client.send(type="conversation.item.delete", item_id=item_id)
                client.send(type="conversation.item.delete", item_id=item_id, event_id="evt_again")
                await client.until(lambda: len(errors(client)) == 7, 10, "the bad truncate and delete")
                # a long answer, its audio cut by the client (output_audio_buffer.clear)
                client.send(type="session.update", session={"max_output_tokens": 1200})
                client.send(type="response.create", text="A long answer the client cuts short. " * 4)
                await client.until(lambda: client.types().count("output_audio_buffer.started") == 2, 60, "audio")
                client.send(type="output_audio_buffer.clear")
                await client.until(lambda: "output_audio_buffer.cleared" in client.types(), 10, "cleared")
                await client.until(lambda: client.types().count("response.done") == 2, 10, "the cut response")
                await asyncio.sleep(0.2)
                frames = peer.track.frames_with_audio
                await asyncio.sleep(0.3)
                return client.events, unchanged, frames, peer.track.frames_with_audio
            finally:
                await client.close()

    events, unchanged, frames, frames_later = asyncio.run(main())
    created = events[0]["session"]
    assert created["model"] == "orpheus" and created["random_weights"] is True  # the tiny weights are random
    assert created["voice"] == "tara" and "leah" in created["voices"]
    errs = [e["error"] for e in events if e["type"] == "error"]
    assert [(e["param"], e["event_id"]) for e in errs[:4]] == [
        (None, "evt_0"),
        ("session.instructions", "evt_1"),
        ("session.tools", "evt_2"),
        ("session.audio.input.transcription", "evt_3"),
    ], errs
    assert "session.audio.output.voice 'alloy'" in errs[0]["message"] and "tara" in errs[0]["message"]
    assert all(e["type"] == "invalid_request_error" and e["message"] for e in errs)
    assert errs[4]["param"] == "audio" and "takes no audio input" in errs[4]["message"]
    assert (
        unchanged["voice"] == "tara" and unchanged["max_output_tokens"] == 1200
    )  # the refused updates changed nothing
    updated = next(e for e in events if e["type"] == "session.updated")["session"]
    assert updated["audio"]["output"]["voice"] == updated["voice"] == "leah" and updated["max_output_tokens"] == 21

    first = next(e for e in events if e["type"] == "response.created")["response"]["id"]
    mine = [e for e in events if e.get("response_id") == first or e.get("response", {}).get("id") == first]
    done = next(e for e in mine if e["type"] == "response.done")["response"]
    item = done["output"][0]
    assert item["role"] == "assistant" and item["status"] == "completed"
    assert item["content"] == [{"type": "output_audio", "transcript": "Hello there."}]
    for e in mine:
        if e["type"].startswith(("response.output_audio", "response.content_part")):
            assert (e["item_id"], e["output_index"], e["content_index"]) == (item["id"], 0, 0), e
    assert done["audio"]["output"]["voice"] == "leah"
    use = done["usage"]
    assert use["input_tokens"] > 3 and use["output_token_details"]["audio_tokens"] > 0
    assert use["total_tokens"] == use["input_tokens"] + use["output_tokens"]
    assert use["output_tokens"] == use["output_token_details"]["audio_tokens"] <= 21  # max_output_tokens
    truncated = next(e for e in events if e["type"] == "conversation.item.truncated")
    assert (truncated["item_id"], truncated["audio_end_ms"]) == (item["id"], 100)
    assert errs[5]["param"] == "audio_end_ms"
    assert next(e for e in events if e["type"] == "conversation.item.deleted")["item_id"] == item["id"]
    assert errs[6]["code"] == "item_not_found" and errs[6]["event_id"] == "evt_again"
    cut = [e for e in events if e["type"] == "response.done"][1]["response"]
    assert cut["status"] == "cancelled" and cut["output"][0]["status"] == "incomplete"
    assert frames == frames_later  # nothing played after the clear


# a tab's peer as any page makes one, asking for a long answer; nothing of it runs when the tab closes
CONNECT_AND_SPEAK = """async () => {
  const pc = new RTCPeerConnection();
  pc.addTransceiver("audio", {direction: "recvonly"});
  const channel = pc.createDataChannel("oai-events");
  await pc.setLocalDescription(await pc.createOffer());
  const answer = await (await fetch("/offer", {method: "POST", headers: {"Content-Type": "application/json"},
                                               body: JSON.stringify({sdp: pc.localDescription.sdp, type: "offer"})})).json();
  await pc.setRemoteDescription(answer);
  await new Promise(resolve => channel.onopen = resolve);
  channel.send(JSON.stringify({type: "response.create", text: "A long answer that nobody waits for. ".repeat(5)}));
  window.tabPeer = pc;
}"""


@pytest.mark.timeout(180)
@pytest.mark.browser
def test_a_tab_closed_mid_response_logs_why_in_one_line_and_no_traceback(orpheus, caplog):
    from playwright.async_api import async_playwright

    from support.chromium import ARGS, CHROMIUM

    async def main():
        async with gateway_for(orpheus) as (c, gateway, url):
            idle = c.kv_blocks_used()
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
                try:
                    page = await browser.new_page()
                    await page.goto(url)
                    await page.evaluate(CONNECT_AND_SPEAK)  # the tab's own peer, not the page's: no goodbye at close
                    peer = next(iter(gateway.peers.values()))
                    while peer.track.frames_with_audio < 5:
                        await asyncio.sleep(0.02)
                    with caplog.at_level(logging.INFO):
                        await page.close()
                        for _ in range(400):
                            if not gateway.peers:
                                break
                            await asyncio.sleep(0.01)
                        await asyncio.sleep(1.0)
                        gc.collect()  # a failed task's "exception was never retrieved" is logged when it is collected
                    return gateway.peers, c.kv_blocks_used(), idle
                finally:
                    await browser.close()

    left, blocks, idle = asyncio.run(main())
    assert not left and blocks == idle
    lines = [r for r in caplog.records if r.levelno >= logging.INFO and r.name.startswith(("asyncio", "mstar_ros"))]
    assert not [r for r in lines if r.name == "asyncio" or r.exc_info], [r.getMessage() for r in lines]
    # one line says why it went (a tab gone without a goodbye stops answering ICE consent), beside the gateway's
    # line that it is gone
    said = [r.getMessage() for r in lines if r.levelno >= logging.WARNING]
    assert len(said) == 1 and "ICE consent expired" in said[0], [r.getMessage() for r in lines]


@pytest.mark.timeout(120)
def test_a_peer_lost_to_ice_consent_is_logged_with_its_cause_and_what_to_try(orpheus, caplog):
    async def main():
        async with gateway_for(orpheus) as (c, gateway, url):
            proc = subprocess.Popen([sys.executable, "-c", VANISHING_PEER, url], stdout=subprocess.PIPE)
            try:
                loop = asyncio.get_running_loop()
                pc_id = (await asyncio.wait_for(loop.run_in_executor(None, proc.stdout.readline), 90)).decode().strip()
                assert pc_id in gateway.peers
                with caplog.at_level(logging.INFO, logger="mstar_ros.webrtc"):
                    proc.kill()
                    killed = time.monotonic()
                    while pc_id in gateway.peers and time.monotonic() - killed < 10:
                        await asyncio.sleep(0.01)
                return pc_id
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()

    pc_id = asyncio.run(main())
    lost = [r.getMessage() for r in caplog.records if "consent" in r.getMessage()]
    assert len(lost) == 1, lost
    assert lost[0].startswith(f"peer {pc_id}: lost during response resp_") and "--peer-lost-s" in lost[0], lost


def test_a_peer_is_not_idle_until_its_answer_has_played_and_then_idle_from_then():
    """Between the audio queue running dry and output_audio_buffer.stopped the peer is still busy:
    the idle watchdog once dropped a peer there, as idle since its response.create (seconds ago)."""
    from types import SimpleNamespace

    from mstar_ros.webrtc.peer import VoicePeer

    idle_s = VoicePeer.idle_s.fget
    long_ago = time.monotonic() - 60
    peer = SimpleNamespace(
        response_id=None, playing="resp_1", track=SimpleNamespace(queued_ms=0), last_activity=long_ago
    )
    assert idle_s(peer) == 0.0  # the answer's last frame is out, stopped not yet said
    peer.playing = None
    assert idle_s(peer) >= 59  # nothing playing, no event for a minute
    for busy in ({"response_id": "resp_2"}, {"track": SimpleNamespace(queued_ms=40)}):
        assert idle_s(SimpleNamespace(**{**vars(peer), **busy})) == 0.0
