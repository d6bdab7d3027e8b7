"""Probe a running voice gateway as a hostile client would, and print what it cost the server.

Starts ``mstar-ros serve voice --model qwen3-omni`` on a free loopback port (or probes ``--url``
with ``--pid``), runs the probes named by ``--probes`` one after another, and prints one JSON line
per probe: the HTTP statuses it got, the time to the answer, the server's resident memory before,
at its peak and a few seconds after, and its open file descriptors. These are the numbers of
issue 28 points 1-7; run it before and after a change on the same machine.

Probes: ``chunked`` (concurrent chunked 15 MiB bodies to /offer), ``wav`` (low-rate WAVs as
chat input audio, and a rate of 0), ``png`` (an 8192 x 8192 PNG, then 8 concurrent large images
beside a text request), ``slots`` (offers that never do ICE, then a real peer), ``slowloris``
(connections that send half a request head), ``nested`` (deeply nested JSON on three routes),
``auth`` (a non-ASCII Authorization header, a lower-case scheme).

Loopback only: run it inside ``unshare -n`` as the tests do.

    python tools/probe_gateway.py [--probes chunked,wav,png,slots,slowloris,nested,auth] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

PROBES = ("chunked", "wav", "png", "slots", "slowloris", "nested", "auth")
TOKEN = "probe-token"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Watch:
    """The server's RSS sampled every 50 ms while a probe runs: (before, peak, settled after)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.before, self.peak, self.max_fds = pid, rss_mb(pid), 0.0, 0
        self._task: asyncio.Task | None = None

    async def _sample(self) -> None:
        while True:
            self.peak, self.max_fds = max(self.peak, rss_mb(self.pid)), max(self.max_fds, fds(self.pid))
            await asyncio.sleep(0.05)

    async def __aenter__(self) -> Watch:
        self._task = asyncio.ensure_future(self._sample())
        return self

    async def __aexit__(self, *_exc) -> None:
        self._task.cancel()

    async def settled(self, wait_s: float = 3.0) -> dict:
        await asyncio.sleep(wait_s)
        return {
            "rss_before_mb": round(self.before),
            "rss_peak_mb": round(max(self.peak, rss_mb(self.pid))),
            "rss_after_mb": round(rss_mb(self.pid)),
            "fds_peak": self.max_fds,
            "fds_after": fds(self.pid),
        }


def wav_bytes(rate: int, frames: int) -> bytes:
    """A mono 16-bit WAV header claiming ``rate`` and ``frames``, with that many (silent) frames."""
    data = bytes(2 * frames)
    return (
        b"RIFF"
        + struct.pack("<I", 36 + len(data))
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", len(data))
        + data
    )


def png_data_url(width: int, height: int) -> str:
    import PIL.Image

    buf = io.BytesIO()
    PIL.Image.new("RGB", (width, height), (200, 30, 30)).save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def chat_body(parts: list[dict]) -> dict:
    return {"model": "qwen3-omni", "messages": [{"role": "user", "content": parts}], "max_tokens": 2}


async def timed(coro) -> tuple[float, object]:
    started = time.monotonic()
    result = await coro
    return round(time.monotonic() - started, 3), result


async def post(http, url: str, **kwargs) -> tuple[int, str]:
    try:
        async with http.post(url, **kwargs) as r:
            return r.status, (await r.text())[:200]
    except Exception as exc:  # the server closed on us: what a refused flood sees
        return 0, type(exc).__name__


async def probe_chunked(http, url: str, watch: Watch) -> dict:
    out = {}
    for n in (40, 80):

        async def body():
            for _ in range(15 * 16):
                yield b"x" * 65536

        took, statuses = await timed(asyncio.gather(*(post(http, f"{url}/offer", data=body()) for _ in range(n))))
        out[f"{n}_bodies"] = {"statuses": sorted({s for s, _ in statuses}), "seconds": took}
    return out


async def probe_wav(http, url: str, watch: Watch) -> dict:
    out = {}
    for name, rate, frames in (("rate_100_2.6MB", 100, 1_300_000), ("rate_1_156KB", 1, 78_000), ("rate_0", 0, 100)):
        part = {
            "type": "input_audio",
            "input_audio": {"format": "wav", "data": base64.b64encode(wav_bytes(rate, frames)).decode()},
        }
        took, (status, text) = await timed(post(http, f"{url}/v1/chat/completions", json=chat_body([part])))
        out[name] = {"status": status, "seconds": took, "says": text[:120], "rss_peak_mb": round(watch.peak)}
    return out


async def probe_png(http, url: str, watch: Watch) -> dict:
    out = {}
    big = {"type": "image_url", "image_url": {"url": png_data_url(8192, 8192)}}
    took, (status, text) = await timed(post(http, f"{url}/v1/chat/completions", json=chat_body([big])))
    out["8192x8192"] = {
        "status": status,
        "seconds": took,
        "bytes": len(big["image_url"]["url"]),
        "says": text[:120],
        "rss_peak_mb": round(watch.peak),
    }
    text_only = chat_body([{"type": "text", "text": "Hello?"}])
    alone, _ = await timed(post(http, f"{url}/v1/chat/completions", json=text_only))
    many = {"type": "image_url", "image_url": {"url": png_data_url(4096, 3000)}}
    floods = [post(http, f"{url}/v1/chat/completions", json=chat_body([many])) for _ in range(8)]
    flood = asyncio.gather(*floods)
    await asyncio.sleep(0.05)
    beside, _ = await timed(post(http, f"{url}/v1/chat/completions", json=text_only))
    statuses = await flood
    out["8_images_beside_text"] = {
        "image_bytes": len(many["image_url"]["url"]),
        "statuses": sorted({s for s, _ in statuses}),
        "text_alone_s": alone,
        "text_beside_s": beside,
        "slowdown": round(beside / max(alone, 1e-3), 1),
    }
    return out


async def probe_slots(http, url: str, watch: Watch) -> dict:
    from mstar_ros.webrtc.client import GatewayClient
    from mstar_ros.webrtc.server import configure_ice

    configure_ice("127.0.0.1", 1.5)  # the real peer offers loopback candidates, as the tests' peers do

    async def ghost() -> int:
        """An offer whose client never does ICE with the answer."""
        client = GatewayClient(keep_samples=False)
        await client.pc.setLocalDescription(await client.pc.createOffer())
        status, _ = await post(http, f"{url}/offer", json={"sdp": client.pc.localDescription.sdp, "type": "offer"})
        await client.close()
        return status

    ghosts = [await ghost() for _ in range(8)]
    started, refusals = time.monotonic(), []
    while time.monotonic() - started < 90:
        client = GatewayClient(keep_samples=False)
        try:
            await client.connect(http, url, timeout=10)
            break
        except (ConnectionError, asyncio.TimeoutError) as exc:
            refusals.append(str(exc)[:80])
            await asyncio.sleep(1.0)
        finally:
            await client.close()
    return {
        "ghost_offers": ghosts,
        "real_peer_waited_s": round(time.monotonic() - started, 1),
        "real_peer_refusals": len(refusals),
        "first_refusal": refusals[0] if refusals else None,
    }


async def probe_slowloris(http, url: str, watch: Watch, n: int = 3000, hold_s: float = 30.0) -> dict:
    host, port = re.match(r"http://([^:]+):(\d+)", url).groups()
    writers, refused = [], 0
    for _ in range(n):
        try:
            _, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"POST /offer HTTP/1.1\r\nHost: x\r\n")  # never finishes its head
            writers.append(writer)
        except OSError:
            refused += 1
    opened = fds(watch.pid)
    await asyncio.sleep(hold_s)
    sum(1 for w in writers if not w.transport.is_closing() and not w.is_closing())
    server_fds = fds(watch.pid)
    async with http.get(f"{url}/v1/models") as r:
        status = r.status
    for w in writers:
        w.close()
    return {
        "connections": n,
        "refused_at_connect": refused,
        "server_fds_after_open": opened,
        f"server_fds_after_{hold_s:g}s": server_fds,
        "models_status_meanwhile": status,
    }


async def probe_nested(http, url: str, watch: Watch) -> dict:
    deep = b"[" * 30000
    bodies = {
        "/offer": deep,
        "/v1/audio/speech": b'{"input": "hi", "extra": ' + deep,
        "/v1/chat/completions": b'{"messages": [{"role": "user", "content": ' + deep,
    }
    return {
        route: (await post(http, f"{url}{route}", data=body, headers={"Content-Type": "application/json"}))[0]
        for route, body in bodies.items()
    }


async def probe_auth(http, url: str, watch: Watch) -> dict:
    out = {}
    for name, header in (
        ("non_ascii", b"Bearer \xe9t\xe9"),
        ("lower_case_scheme", f"bearer {TOKEN}".encode()),
        ("no_scheme", TOKEN.encode()),
        ("right", f"Bearer {TOKEN}".encode()),
    ):
        host, port = re.match(r"http://([^:]+):(\d+)", url).groups()
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: " + header + b"\r\n\r\n"
        )
        line = await reader.readline()
        writer.close()
        out[name] = int(line.split()[1]) if line else 0
    return out


async def run(probes: list[str], url: str, pid: int) -> dict:
    from aiohttp import ClientSession, ClientTimeout

    results = {}
    async with ClientSession(timeout=ClientTimeout(total=300)) as http:
        for name in probes:
            async with Watch(pid) as watch:
                took, got = await timed(globals()[f"probe_{name}"](http, url, watch))
            results[name] = {"seconds": took, **got, **await watch.settled()}
            print(json.dumps({name: results[name]}), flush=True)
    return results


def start_server(token: bool) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    args = [sys.executable, "-m", "mstar_ros.cli", "-q", "serve", "voice", "--model", "qwen3-omni", "--port", "0"]
    if token:
        env["MSTAR_GATEWAY_TOKEN"] = TOKEN
        args += ["--token", TOKEN] if "--token-in-argv" in sys.argv else []
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)
    for line in proc.stdout:
        found = re.search(r"POST (http://[^/]+)/offer", line)
        if found:
            return proc, found.group(1)
    raise RuntimeError(f"the gateway did not start (exit {proc.wait()})")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--probes", default=",".join(PROBES), help=f"comma-separated, of {', '.join(PROBES)}")
    parser.add_argument("--json", type=Path, help="write all results here")
    parser.add_argument(
        "--token-in-argv",
        action="store_true",
        help="give the auth probe's server its token with --token (a gateway without $MSTAR_GATEWAY_TOKEN support)",
    )
    args = parser.parse_args()
    probes = [p for p in args.probes.split(",") if p]
    unknown = set(probes) - set(PROBES)
    if unknown:
        parser.error(f"unknown probes {sorted(unknown)}")
    results = {}
    for group in ([p for p in probes if p != "auth"], [p for p in probes if p == "auth"]):
        if not group:
            continue
        proc, url = start_server(token=group == ["auth"])
        try:
            results |= asyncio.run(run(group, url, proc.pid))
        finally:
            proc.terminate()
            proc.wait(30)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
