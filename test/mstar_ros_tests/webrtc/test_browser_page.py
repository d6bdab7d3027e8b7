"""The voice page in a real headless Chromium (Debian's, driven by playwright): its elements and states, one
screenshot per state in the test's output (the path is printed).

Orpheus: disconnected, connected (a double click opens one peer), a typed turn answered, a reply cut off,
Disconnect freeing the server's slot, a peer the server drops, phone width. Qwen3-Omni: the text box invites a
message, a typed message answered with its transcript folded into one log line, a spoken turn with the VAD's
segment and its time to first audio. Failed connections: no loopback in the browser, a full server, no token,
no network path.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from mstar_ros.webrtc.server import GatewayLimits
from support.chromium import ARGS, CHROMIUM, open_with_microphone
from support.webrtc_gateway import gateway_for

pytestmark = pytest.mark.browser

CONNECTED = (
    "window.mstarVoice.phase === 'connected' && window.mstarVoice.channel "
    "&& window.mstarVoice.channel.readyState === 'open'"
)


@pytest.fixture(scope="module")
def screens(tmp_path_factory):
    where = tmp_path_factory.mktemp("page_screens")
    print(f"\npage screenshots: {where}")
    return where


async def shot(page, screens, name: str) -> None:
    await page.screenshot(path=str(screens / f"{name}.png"), full_page=True)


def done_with(status: str, nth: int = 1) -> str:
    return (
        f"window.mstarVoice.events.filter(e => e.type === 'response.done' && e.response.status === '{status}')"
        f".length >= {nth}"
    )


async def replies(page) -> list[dict]:
    return await page.evaluate("""[...document.querySelectorAll('#conversation .turn')].map(t => ({
        role: t.classList[1],
        kind: t.dataset.kind || null, status: t.dataset.status || null, who: t.querySelector('.who').textContent,
        text: t.querySelector('.text').textContent, meta: t.querySelector('.meta').textContent}))""")


async def log_lines(page) -> list[str]:
    return await page.evaluate("[...document.querySelectorAll('#log li')].map(li => li.textContent)")


async def until(condition, what: str, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout} s")


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_the_page_through_its_states_with_orpheus(orpheus, screens):
    from playwright.async_api import async_playwright

    async def main():
        out = {}
        async with gateway_for(orpheus) as (_, gateway, url):
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
                page = await browser.new_page(viewport={"width": 1000, "height": 900})
                await page.goto(url)
                await page.wait_for_function("!document.getElementById('connect').disabled")
                await page.wait_for_function("document.getElementById('model').textContent !== '-'")
                out["idle"] = {
                    "state": await page.inner_text("#state"),
                    "model": await page.inner_text("#model"),
                    "log_open": await page.evaluate("document.getElementById('events').open"),
                    "disconnect": await page.is_disabled("#disconnect"),
                    "speak": await page.is_disabled("#speak"),
                    "label": await page.inner_text("#text-label"),
                    "button": await page.inner_text("#speak"),
                    "ttfa": await page.inner_text("#ttfa"),
                    "weights": await page.is_visible("#weights"),
                }
                await shot(page, screens, "1-disconnected")

                # two clicks at once: one peer (the button is disabled by the first)
                await page.evaluate("const b = document.getElementById('connect'); b.click(); b.click();")
                await page.wait_for_function(CONNECTED, timeout=30000)
                out["connected"] = {
                    "peers": len(gateway.peers),
                    "state": await page.inner_text("#state"),
                    "connect": await page.is_disabled("#connect"),
                    "mic": await page.inner_text("#micstate"),
                    "weights": await page.is_visible("#weights"),
                }
                await shot(page, screens, "2-connected")

                await page.fill("#text", "Hello from the page.")
                await page.press("#text", "Enter")  # Enter sends
                await page.wait_for_function(done_with("completed"), timeout=120000)
                await page.wait_for_function("window.mstarVoice.ttfas.length >= 1", timeout=10000)
                out["typed"] = {
                    "turns": await replies(page),
                    "ttfa": await page.inner_text("#ttfa"),
                    "ttfas": await page.evaluate("window.mstarVoice.ttfas"),
                    "log": await log_lines(page),
                }
                await shot(page, screens, "3-typed-turn-answered")

                await page.fill("#text", "A much longer sentence that the user cuts off halfway through. " * 4)
                await page.click("#speak")
                await page.wait_for_function("window.mstarVoice.ttfas.length >= 2", timeout=120000)
                await page.click("#interrupt")
                await page.wait_for_function(done_with("cancelled"), timeout=30000)
                out["cut"] = await replies(page)
                await shot(page, screens, "4-cut-off")

                await page.click("#disconnect")
                await until(lambda: not gateway.peers, "Disconnect frees the server's slot")
                out["disconnected"] = {
                    "state": await page.inner_text("#state"),
                    "connect": await page.is_enabled("#connect"),
                    "notice": await page.is_visible("#notice"),
                }

                await page.click("#connect")
                await page.wait_for_function(CONNECTED, timeout=30000)
                # the server drops the peer as it does when ICE consent expires (its connection "failed")
                await gateway._drop(next(iter(gateway.peers)))
                await page.wait_for_function("window.mstarVoice.phase === 'failed'", timeout=20000)
                out["dropped"] = {
                    "notice": await page.inner_text("#notice"),
                    "connect": await page.is_enabled("#connect"),
                    "state": await page.inner_text("#state"),
                }
                await shot(page, screens, "5-dropped-by-the-server")

                await page.set_viewport_size({"width": 390, "height": 844})
                out["phone_overflow"] = await page.evaluate(
                    "document.documentElement.scrollWidth - document.documentElement.clientWidth"
                )
                await shot(page, screens, "6-phone-width")
                await browser.close()
        return out

    out = asyncio.run(main())
    idle = out["idle"]
    assert idle["state"] == "disconnected" and idle["model"] == "orpheus" and idle["ttfa"] == "-"
    assert idle["log_open"] is False and idle["disconnect"] and idle["speak"]
    assert (idle["label"], idle["button"]) == ("Text to speak", "Speak")
    connected = out["connected"]
    assert (connected["peers"], connected["state"], connected["connect"], connected["mic"]) == (
        1,
        "connected",
        True,
        "off",
    )

    turns = out["typed"]["turns"]
    assert [(t["role"], t["kind"]) for t in turns] == [("user", "typed"), ("assistant", None)]
    assert turns[0]["text"] == turns[1]["text"] == "Hello from the page."
    assert turns[1]["status"] == "completed" and re.fullmatch(r"first audio \d+ ms after you sent it", turns[1]["meta"])
    assert re.fullmatch(r"\d+ ms \(typed\)", out["typed"]["ttfa"]), out["typed"]["ttfa"]
    assert out["typed"]["ttfas"][0]["kind"] == "typed" and out["typed"]["ttfas"][0]["ms"] > 0
    rid = out["typed"]["ttfas"][0]["response_id"]
    assert len([line for line in out["typed"]["log"] if rid in line]) == 1  # one line per response
    assert "completed" in next(line for line in out["typed"]["log"] if rid in line)

    cut = [t for t in out["cut"] if t["role"] == "assistant"][-1]
    assert cut["status"] == "cut-off" and "cut off" in cut["who"]

    assert out["disconnected"] == {"state": "disconnected", "connect": True, "notice": False}
    dropped = out["dropped"]
    assert dropped["connect"] and dropped["state"] == "dropped by the server"
    assert "The server ended this connection" in dropped["notice"] and "consent" in dropped["notice"]
    assert "--peer-lost-s 5" in dropped["notice"] and "Connect again" in dropped["notice"]
    assert out["phone_overflow"] <= 0  # nothing wider than a phone's screen
    # the tiny model's weights are random: the page says so before connecting (GET /v1/models) and after
    assert idle["weights"] and connected["weights"]


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_failed_connections_say_why_and_what_to_try(orpheus, screens):
    from playwright.async_api import async_playwright

    async def main():
        out = {}
        async with gateway_for(orpheus, token="s3cret", limits=GatewayLimits(max_peers=1)) as (_, gateway, url):
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
                first = await browser.new_page()
                await first.goto(url + "/#token=s3cret")
                await first.click("#connect")
                await first.wait_for_function(CONNECTED, timeout=30000)

                async def refused(page_url: str) -> dict:
                    page = await browser.new_page()
                    await page.goto(page_url)
                    await page.click("#connect")
                    await page.wait_for_function("window.mstarVoice.phase === 'failed'", timeout=20000)
                    return {
                        "page": page,
                        "notice": await page.inner_text("#notice"),
                        "state": await page.inner_text("#state"),
                    }

                out["no_token"] = await refused(url + "/")
                out["full"] = await refused(url + "/#token=s3cret")
                await shot(out["full"]["page"], screens, "7-failed-server-full")
                await first.click("#disconnect")
                await until(lambda: not gateway.peers, "the first page's slot")

                # a browser that leaves loopback out of ICE (a stock Chromium) never connects to 127.0.0.1
                stock = await pw.chromium.launch(
                    executable_path=CHROMIUM, headless=True, args=[a for a in ARGS if "loopback" not in a]
                )
                page = await stock.new_page()
                await page.goto(url + "/#token=s3cret")
                await page.click("#connect")
                await page.wait_for_function("window.mstarVoice.phase === 'failed'", timeout=20000)
                out["no_loopback"] = {
                    "notice": await page.inner_text("#notice"),
                    "state": await page.inner_text("#state"),
                    "connect": await page.is_enabled("#connect"),
                }
                await shot(page, screens, "8-failed-connection-no-loopback")
                await until(lambda: not gateway.peers, "the unconnected peer's slot")
                await stock.close()

                # both sides' candidates rewritten to a closed port: ICE never completes, and the page gives up
                def closed_port(sdp: str) -> str:
                    return re.sub(r"(a=candidate:\S+ \d+ udp \d+ 127\.0\.0\.1) \d+", r"\1 9", sdp)

                async def unreachable(route):
                    offer = json.loads(route.request.post_data)
                    reply = await route.fetch(post_data=json.dumps({**offer, "sdp": closed_port(offer["sdp"])}))
                    answer = await reply.json()
                    await route.fulfill(response=reply, json={**answer, "sdp": closed_port(answer["sdp"])})

                page = await browser.new_page()
                await page.route("**/offer", unreachable)
                await page.goto(url + "/#token=s3cret&connect_timeout_s=3")  # the page's wait, shortened
                await page.click("#connect")
                await page.wait_for_function("window.mstarVoice.phase === 'failed'", timeout=40000)
                out["no_path"] = {"notice": await page.inner_text("#notice"), "state": await page.inner_text("#state")}
                await shot(page, screens, "8b-failed-connection-no-path")
                await browser.close()
        return out

    out = asyncio.run(main())
    assert out["no_token"]["state"] == "refused" and "#token=" in out["no_token"]["notice"]
    assert "The server is full" in out["full"]["notice"] and "--max-peers" in out["full"]["notice"]
    no_loopback = out["no_loopback"]
    assert no_loopback["state"] == "failed" and no_loopback["connect"]
    assert "no network address" in no_loopback["notice"]
    assert "--allow-loopback-in-peer-connection" in no_loopback["notice"]
    assert "media.peerconnection.ice.loopback" in no_loopback["notice"]
    no_path = out["no_path"]
    assert no_path["state"] == "failed" and "found no network path (ICE did not complete)" in no_path["notice"]
    assert "--allow-loopback-in-peer-connection" in no_path["notice"]  # the page is on loopback: the likely cause


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_a_model_that_answers_a_typed_message_and_a_spoken_turn(qwen3_omni, speech_wav_long_pause, screens):
    """Qwen3-Omni: the text box invites a message; a typed one is answered; then the fake microphone's
    sentence is a spoken turn with the VAD's segment, answered, with its time to first audio."""
    from playwright.async_api import async_playwright

    mic, _ = speech_wav_long_pause  # 2.5 s silence, a sentence, 8 s silence, in a loop

    async def main():
        out = {}
        async with gateway_for(qwen3_omni, model_name="qwen3-omni") as (_, _gateway, url):
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
                page = await browser.new_page()
                await page.goto(url)
                await page.click("#connect")
                await page.wait_for_function(CONNECTED, timeout=30000)
                await page.evaluate(
                    "window.mstarVoice.channel.send(JSON.stringify({type: 'session.update', "
                    "session: {max_output_tokens: 25, seed: 5}}))"
                )
                out["box"] = {
                    "label": await page.inner_text("#text-label"),
                    "placeholder": await page.get_attribute("#text", "placeholder"),
                    "value": await page.input_value("#text"),
                    "button": await page.inner_text("#speak"),
                    "images": await page.is_visible("#imagebox"),
                }
                await page.fill("#text", "Hello, who are you?")
                await page.click("#speak")
                await page.wait_for_function(done_with("completed"), timeout=120000)
                out["typed"] = {
                    "turns": await replies(page),
                    "log": await log_lines(page),
                    "events": await page.evaluate("window.mstarVoice.events"),
                }
                await browser.close()

                browser, page = await open_with_microphone(pw, url, mic)
                await page.evaluate(
                    "window.mstarVoice.channel.send(JSON.stringify({type: 'session.update', "
                    "session: {max_output_tokens: 25, seed: 5}}))"
                )
                await page.wait_for_function("window.mstarVoice.ttfas.some(t => t.kind === 'spoken')", timeout=120000)
                await page.wait_for_function(done_with("completed"), timeout=60000)
                out["spoken"] = {
                    "turns": await replies(page),
                    "ttfa": await page.inner_text("#ttfa"),
                    "mic": await page.inner_text("#micstate"),
                    "ttfas": await page.evaluate("window.mstarVoice.ttfas"),
                }
                await shot(page, screens, "9-spoken-turn-answered")
                await browser.close()
        return out

    out = asyncio.run(main())
    box = out["box"]
    assert (box["label"], box["button"], box["value"]) == ("Message", "Send", "")
    assert "message" in box["placeholder"].lower() and "speak" not in box["placeholder"].lower()
    assert box["images"]

    typed = out["typed"]
    user, reply = typed["turns"][0], typed["turns"][-1]
    assert (user["role"], user["kind"], user["text"]) == ("user", "typed", "Hello, who are you?")
    assert reply["role"] == "assistant" and reply["status"] == "completed" and reply["text"].strip()
    rid = next(e["response"]["id"] for e in typed["events"] if e["type"] == "response.created")
    deltas = sum(e["type"] == "response.output_audio_transcript.delta" for e in typed["events"])
    line = [line for line in typed["log"] if rid in line]
    assert len(line) == 1 and (deltas < 2 or f"output_audio_transcript.delta \u00d7{deltas}" in line[0]), (deltas, line)

    spoken = out["spoken"]
    said = next(t for t in spoken["turns"] if t["kind"] == "spoken")
    assert said["status"] == "spoken" and re.search(
        r"spoken: \d+\.\d\d\u2013\d+\.\d\d s of the microphone", said["text"]
    )
    assert "of audio sent to the model" in said["meta"]
    answered = [t for t in spoken["turns"] if t["role"] == "assistant" and t["status"] == "completed"]
    assert answered and re.fullmatch(r"first audio \d+ ms after the end of your turn was detected", answered[0]["meta"])
    assert re.fullmatch(r"\d+ ms \(spoken\)", spoken["ttfa"]) or any(t["kind"] == "spoken" for t in spoken["ttfas"])
    assert spoken["mic"] in ("listening", "hearing you")


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_speech_over_a_reply_cuts_it_off_and_shows_the_spoken_turn(orpheus, speech_wav_long_pause, screens):
    """Orpheus takes no audio: the fake microphone's sentence barges in on a long reply, which is marked cut off,
    and the spoken turn is shown with its segment as heard, not answered."""
    from playwright.async_api import async_playwright

    mic, _ = speech_wav_long_pause  # 2.5 s of silence, then the sentence

    async def main():
        async with gateway_for(orpheus) as (_, _gateway, url):
            async with async_playwright() as pw:
                browser, page = await open_with_microphone(pw, url, mic)
                await page.fill("#text", "A long answer that the user talks over before it is done. " * 5)
                await page.click("#speak")
                await page.wait_for_function(done_with("cancelled"), timeout=60000)
                await page.wait_for_function(
                    "[...document.querySelectorAll('.turn.user')].some(t => t.dataset.status === 'spoken')",
                    timeout=30000,
                )
                out = {"turns": await replies(page), "mic": await page.inner_text("#micstate")}
                await shot(page, screens, "10-spoken-over-a-reply")
                await browser.close()
        return out

    out = asyncio.run(main())
    reply = next(t for t in out["turns"] if t["role"] == "assistant")
    assert reply["status"] == "cut-off" and "cut off" in reply["who"]
    said = next(t for t in out["turns"] if t["kind"] == "spoken")
    assert said["status"] == "spoken" and said["meta"] == "heard, not answered: this model speaks typed text"
    assert re.fullmatch(r"spoken: \d+\.\d\d\u2013\d+\.\d\d s of the microphone \(\d+\.\d\d s\)", said["text"])
    assert out["mic"] in ("listening", "hearing you")
