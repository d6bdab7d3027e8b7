"""The voice page's time to first audio, measured in headless Chromium on the page itself.

Starts ``mstar-ros serve voice --model MODEL`` on a free loopback port (or uses ``--url``), opens the page in
Debian's Chromium (playwright with ``executable_path``; no browser is downloaded) and reads what the page
measures (``window.mstarVoice.ttfas``): from a typed turn's send, or from the arrival of a spoken turn's
``input_audio_buffer.speech_stopped`` (the VAD's end of turn, itself ``silence_duration_ms`` after the last
word), until the received audio is first audible in the page's AnalyserNode.

- typed: ``--turns`` texts typed and sent one after another, each when the previous reply has played out;
- spoken (a model that answers speech: Qwen3-Omni): Chromium's fake microphone loops a WAV of silence, a
  sentence said by espeak-ng and a long pause, so that each loop is one turn.

Each reply is bounded by ``session.update`` (``--max-output-tokens``, a fixed ``seed``). ``--warmup`` turns
come first and are not counted. Loopback only: run it inside ``unshare -n`` as the tests do, with nothing else
running (timings on a shared machine swing 2-4x).

    python tools/page_ttfa.py --model qwen3-omni [--turns 10] [--kinds typed,spoken] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import wave
from pathlib import Path

import numpy as np

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--no-sandbox",
    "--autoplay-policy=no-user-gesture-required",
    "--allow-loopback-in-peer-connection",
]
CONNECTED = "window.mstarVoice.phase === 'connected' && window.mstarVoice.channel.readyState === 'open'"
SENTENCE = "Hello there. Can you tell me what time it is?"


def start_server(model: str) -> tuple[subprocess.Popen, str]:
    """``serve voice`` on a free loopback port: (its process, its base URL)."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "mstar_ros.cli", "serve", "voice", "--model", model, "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    for line in proc.stdout:
        found = re.search(r"(http://[\d.]+:\d+)", line)
        if found:
            return proc, found.group(1)
    raise SystemExit(f"serve voice exited ({proc.wait()}) before it printed its URL")


def microphone_wav(directory: Path, pause_s: float) -> Path:
    """Silence, the sentence (espeak-ng), then ``pause_s`` of silence: one spoken turn per loop."""
    said = directory / "said.wav"
    subprocess.run(["espeak-ng", "-w", str(said), SENTENCE], check=True)
    with wave.open(str(said)) as w:
        rate, speech = w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), np.int16)
    out = directory / "mic.wav"
    with wave.open(str(out), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(
            np.concatenate([np.zeros(rate, np.int16), speech, np.zeros(int(rate * pause_s), np.int16)]).tobytes()
        )
    return out


async def open_page(pw, url: str, args: argparse.Namespace, mic: Path | None):
    extra = [f"--use-file-for-fake-audio-capture={mic}"] if mic else []
    browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS + extra)
    page = await browser.new_page()
    await page.goto(url)
    if mic:
        await page.check("#mic")
    await page.click("#connect")
    await page.wait_for_function(CONNECTED, timeout=30000)
    session = json.dumps(
        {"type": "session.update", "session": {"max_output_tokens": args.max_output_tokens, "seed": 5}}
    )
    await page.evaluate(f"window.mstarVoice.channel.send({json.dumps(session)})")
    return browser, page


PAGE_STATE = """() => { const s = window.mstarVoice; return { phase: s.phase, ttfas: s.ttfas, maxLevel: s.maxLevel,
  level: s.level, events: s.events.slice(-40).map(e => [e.type, e.response_id || e.response?.id || null,
  e.response?.status || e.error?.message || null]) }; }"""


async def waited(page, condition: str, timeout_s: float) -> None:
    """Wait until ``condition`` holds on the page; past ``timeout_s`` fail with what the page saw (its last
    events, its first-audio times and output level), so that a turn that never got timed says why."""
    from playwright.async_api import TimeoutError as PageTimeout

    try:
        await page.wait_for_function(condition, timeout=timeout_s * 1000)
    except PageTimeout:
        seen = await page.evaluate(PAGE_STATE)
        raise SystemExit(f"waited {timeout_s:.0f} s for {condition}; the page saw: {json.dumps(seen)}") from None


async def typed(pw, url: str, args: argparse.Namespace) -> list[float]:
    browser, page = await open_page(pw, url, args, None)
    for i in range(args.warmup + args.turns):
        await page.fill("#text", f"Hello there, this is turn {i + 1}.")
        await page.click("#speak")
        # the next turn is typed once this reply has played out, as a listener would: its audio never
        # overlaps the next reply's, whose first audio is then timed from silence
        await waited(
            page,
            f"window.mstarVoice.ttfas.length > {i} && window.mstarVoice.events.filter("
            f"e => e.type === 'response.done').length > {i} && window.mstarVoice.events.filter("
            f"e => e.type === 'output_audio_buffer.stopped' || e.type === 'output_audio_buffer.cleared').length > {i}",
            args.timeout_s,
        )
    measured = await page.evaluate("window.mstarVoice.ttfas")
    await browser.close()
    return [t["ms"] for t in measured[args.warmup :]]


async def spoken(pw, url: str, args: argparse.Namespace) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="page-ttfa-") as tmp:
        browser, page = await open_page(pw, url, args, microphone_wav(Path(tmp), args.pause_s))
        want = args.warmup + args.turns
        await waited(
            page, f"window.mstarVoice.ttfas.filter(t => t.kind === 'spoken').length >= {want}", args.timeout_s * want
        )
        measured = await page.evaluate("window.mstarVoice.ttfas.filter(t => t.kind === 'spoken')")
        await browser.close()
    return [t["ms"] for t in measured[args.warmup : want]]


def summary(values: list[float]) -> dict:
    return {
        "n": len(values),
        "p50_ms": round(statistics.median(values)),
        "min_ms": round(min(values)),
        "max_ms": round(max(values)),
        "all_ms": [round(v) for v in values],
    }


async def main(args: argparse.Namespace) -> dict:
    from playwright.async_api import async_playwright

    proc, url = (None, args.url) if args.url else start_server(args.model)
    try:
        results = {"model": args.model, "url": url, "load_before": os.getloadavg()}
        async with async_playwright() as pw:
            for kind in args.kinds.split(","):
                results[kind] = summary(await (typed if kind == "typed" else spoken)(pw, url, args))
                print(
                    f"{args.model} {kind}: p50 {results[kind]['p50_ms']} ms "
                    f"(min {results[kind]['min_ms']}, max {results[kind]['max_ms']}, n {results[kind]['n']})",
                    flush=True,
                )
        results["load_after"] = os.getloadavg()
        return results
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="Run inside `unshare -n` (loopback only).")
    p.add_argument("--model", default="orpheus", help="speech model to serve (default orpheus)")
    p.add_argument("--url", help="a running gateway's base URL instead of starting one")
    p.add_argument(
        "--kinds", default="typed", help="typed, spoken or typed,spoken (spoken: a model that answers speech)"
    )
    p.add_argument("--turns", type=int, default=10, help="measured turns per kind (default 10)")
    p.add_argument("--warmup", type=int, default=1, help="turns first, not counted (default 1)")
    p.add_argument("--max-output-tokens", type=int, default=25, help="each reply's bound (default 25)")
    p.add_argument(
        "--pause-s",
        type=float,
        default=10.0,
        help="silence after the spoken sentence: more than a reply lasts, or the next loop cuts it off",
    )
    p.add_argument("--timeout-s", type=float, default=120.0, help="the longest one turn may take (default 120)")
    p.add_argument("--json", type=Path, help="write the results here too")
    return p.parse_args(argv)


if __name__ == "__main__":
    ARGS = parse_args()
    OUT = asyncio.run(main(ARGS))
    if ARGS.json:
        ARGS.json.write_text(json.dumps(OUT, indent=2) + "\n")
    print(json.dumps(OUT))
