"""The peers of ``mstar-ros bench webrtc``, in a process of their own (as browsers would be).

``python -m mstar_ros.bench.webrtc_peers URL N ROUNDS MAX_TOKENS SEED``: N aiortc peers connect
to the gateway at URL, set their sampling (``session.update``), then ROUNDS times all ask for a
response at once and wait until every answer has played (``output_audio_buffer.stopped``). It prints one JSON line per response
(``pc_id``, ``round``, ``sent``, ``heard``: time.monotonic() of ``response.create`` and of the
first audible decoded frame, comparable with the gateway process's clock on one host), then one
line with each peer's RTP jitter; then ``{"idle": true}``, and they stay connected (idle) until a line
comes on stdin. Running them apart keeps their Opus decoding, SRTP and event
loop off the gateway process's interpreter, as a browser's are.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

TEXTS = [
    "Hello there, and welcome to the voice gateway benchmark.",
    "The quick brown fox jumps over the lazy dog, twice in a row.",
    "Streaming speech starts playing long before the whole answer is ready.",
    "Every peer has its own session, and one Conductor batches them all.",
    "Time to first audio is what a listener notices first.",
    "Robots and browsers share one runtime on this machine.",
    "A paced clock sends one frame every twenty milliseconds.",
    "Interrupt me whenever you like, and I will stop at once.",
]
OPUS_CLOCK = 48_000
JITTER_PREFETCH = 1  # frames the peers' receivers buffer (aiortc's fixed default is 4: 80 ms; browsers adapt)


async def _jitter_ms(client) -> float:
    stats = await client.pc.getStats()
    found = [s.jitter for s in stats.values() if getattr(s, "type", "") == "inbound-rtp" and s.jitter is not None]
    return max(found) * 1000 / OPUS_CLOCK if found else float("nan")  # RFC 3550 jitter is in RTP clock ticks


async def run_peers(url: str, n: int, rounds: int, max_tokens: int, seed: int) -> None:
    from aiohttp import ClientSession

    from mstar_ros.webrtc.client import GatewayClient
    from mstar_ros.webrtc.server import configure_ice

    configure_ice("127.0.0.1", 1.5)
    clients = [GatewayClient(keep_samples=False, jitter_prefetch=JITTER_PREFETCH) for _ in range(n)]
    try:
        async with ClientSession() as http:
            answers = [await c.connect(http, url) for c in clients]
        for i, c in enumerate(clients):
            c.send(type="session.update", session={"max_output_tokens": max_tokens, "seed": seed + i})
        await asyncio.gather(
            *(c.until(lambda c=c: "session.updated" in c.types(), 10, "session.updated") for c in clients)
        )
        print(json.dumps({"connected": [a["pc_id"] for a in answers]}), flush=True)
        for r in range(rounds):
            sent = []
            for i, c in enumerate(clients):
                sent.append(time.monotonic())
                c.send(type="response.create", text=TEXTS[(i + r) % len(TEXTS)])
            # each answer heard to its end (output_audio_buffer.stopped comes after response.done, once played)
            await asyncio.gather(
                *(
                    c.until(
                        lambda c=c, r=r: c.types().count("output_audio_buffer.stopped") == r + 1,
                        600,
                        "output_audio_buffer.stopped",
                    )
                    for c in clients
                )
            )
            # the last frames of this round are still in flight (jitter buffers): let them land, so
            # that the next round's first audible frame is its own
            await asyncio.sleep(0.3)
            for c, a, t in zip(clients, answers, sent):
                print(
                    json.dumps({"pc_id": a["pc_id"], "round": r, "sent": t, "heard": c.first_loud_after(t)}), flush=True
                )
        print(json.dumps({"jitter_ms": [await _jitter_ms(c) for c in clients]}), flush=True)
        # connected and idle (the gateway sends them silence) while the bench times the whole-file path at
        # the same load; a line on stdin lets them go
        print(json.dumps({"idle": True}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    finally:
        for c in clients:
            await c.close()


if __name__ == "__main__":
    url, n, rounds, max_tokens, seed = sys.argv[1], *map(int, sys.argv[2:6])
    asyncio.run(run_peers(url, n, rounds, max_tokens, seed))
