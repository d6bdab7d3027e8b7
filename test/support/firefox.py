"""Debian's Firefox ESR for the page tests, driven over WebDriver BiDi (Firefox's own Remote Agent).

Playwright drives only its patched Firefox (a download) and Debian ships no geckodriver, so the
tests speak BiDi to ``firefox-esr --remote-debugging-port`` directly: a WebSocket, ``session.new``,
``browsingContext.navigate`` and ``script.evaluate`` are all the page tests need.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp

FIREFOX = shutil.which("firefox-esr") or shutil.which("firefox") or "/usr/bin/firefox-esr"

# Fake media without a prompt, autoplay allowed, and ICE on the loopback interface with plain host
# addresses (the loopback-only namespace has no other interface; aiortc cannot resolve mDNS names).
PREFS = {
    "media.navigator.permission.disabled": True,
    "media.navigator.streams.fake": True,
    "media.autoplay.default": 0,
    "media.autoplay.blocking_policy": 0,
    "media.autoplay.block-webaudio": False,
    "media.cubeb.backend": "pulse",  # a private PulseAudio with a null sink: see PULSE_CONFIG
    "media.peerconnection.ice.loopback": True,
    "media.peerconnection.ice.obfuscate_host_addresses": False,
    # without a granted microphone Firefox gathers on its "default" address only, which it finds by
    # routing a UDP socket towards 8.8.8.8: the namespace has no route, so every interface instead
    "media.peerconnection.ice.default_address_only": False,
    "permissions.default.microphone": 1,
    "permissions.default.camera": 1,
    "remote.active-protocols": 1,  # WebDriver BiDi
    "browser.shell.checkDefaultBrowser": False,
    "datareporting.policy.dataSubmissionEnabled": False,
    "toolkit.telemetry.reportingpolicy.firstRun": False,
    "app.update.disabledForTesting": True,
    "network.captive-portal-service.enabled": False,
    "network.connectivity-service.enabled": False,
    "network.manage-offline-status": False,  # the namespace has no link up but loopback: stay online
}


# Without an audio output an AudioContext never leaves "suspended" (Chromium has a fake one built in), and
# ALSA's null device does not keep time (the page's clock, and the fake microphone, would race). A private
# PulseAudio server with a null sink is a clocked sound card without hardware.
PULSE = shutil.which("pulseaudio") or "/usr/bin/pulseaudio"
PULSE_CONFIG = (
    "load-module module-null-sink sink_name=mstar_null\n"
    "load-module module-native-protocol-unix auth-anonymous=1 socket={socket}\n"
    "set-default-sink mstar_null\n"
)


class BiDiError(RuntimeError):
    pass


class BiDiConnection:
    """Commands over one WebSocket; a reader task hands each reply to the command that waits for it."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for msg in self._ws:
            reply = json.loads(msg.data)
            future = self._pending.pop(reply.get("id"), None)  # events (none subscribed) have no id
            if future is not None and not future.done():
                future.set_result(reply)
        for future in self._pending.values():
            future.set_exception(BiDiError("Firefox closed the BiDi connection"))

    async def command(self, method: str, params: dict) -> dict:
        msg_id = next(self._ids)
        future = self._pending[msg_id] = asyncio.get_running_loop().create_future()
        await self._ws.send_json({"id": msg_id, "method": method, "params": params})
        reply = await future
        if reply.get("type") == "error":
            raise BiDiError(f"{method}: {reply.get('error')}: {reply.get('message')}")
        return reply["result"]

    async def close(self) -> None:
        self._reader.cancel()
        await self._ws.close()


class FirefoxPage:
    """One top-level browsing context of a running Firefox."""

    def __init__(self, bidi: BiDiConnection, context: str) -> None:
        self.command, self.context = bidi.command, context

    async def goto(self, url: str) -> None:
        await self.command("browsingContext.navigate", {"context": self.context, "url": url, "wait": "complete"})

    async def evaluate(self, expression: str):
        """The JSON value of ``expression`` (awaited when it is a promise)."""
        result = await self.command(
            "script.evaluate",
            {
                "expression": f"(async () => JSON.stringify(await ({expression})))()",
                "target": {"context": self.context},
                "awaitPromise": True,
                "userActivation": True,
            },
        )
        if result.get("type") == "exception":
            raise BiDiError(f"{expression}: {result['exceptionDetails'].get('text')}")
        value = result["result"].get("value")
        return None if value is None else json.loads(value)

    async def wait_for_function(self, expression: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not await self.evaluate(f"!!({expression})"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"Firefox: {expression} still false after {timeout} s")
            await asyncio.sleep(0.1)

    async def click(self, selector: str) -> None:
        await self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")

    async def fill(self, selector: str, text: str) -> None:
        await self.evaluate(f"document.querySelector({json.dumps(selector)}).value = {json.dumps(text)}")


class Firefox:
    """``async with Firefox() as ff: page = await ff.new_page()``: a headless Firefox ESR with its own
    throw-away profile, stopped (and its profile removed) at the end."""

    def __init__(self) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="mstar-firefox-")
        self._proc: subprocess.Popen | None = None
        self._session: aiohttp.ClientSession | None = None
        self._pulse: subprocess.Popen | None = None
        self._bidi: BiDiConnection | None = None
        self._pages: list[FirefoxPage] = []

    async def __aenter__(self) -> Firefox:
        profile = Path(self._profile.name)
        (profile / "user.js").write_text(
            "".join(f"user_pref({json.dumps(k)}, {json.dumps(v)});\n" for k, v in PREFS.items())
        )
        socket_path = profile / "pulse-native"
        (profile / "pulse.pa").write_text(PULSE_CONFIG.format(socket=socket_path))
        env = dict(
            os.environ,
            MOZ_HEADLESS="1",
            HOME=str(profile),
            XDG_RUNTIME_DIR=str(profile),
            PULSE_SERVER=f"unix:{socket_path}",
        )
        self._pulse = subprocess.Popen(
            [
                PULSE,
                "-n",
                "-F",
                str(profile / "pulse.pa"),
                "--daemonize=no",
                "--exit-idle-time=-1",
                "--disallow-exit",
                "--log-target=stderr",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while not socket_path.exists():
            if self._pulse.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"PulseAudio did not start ({PULSE}, rc {self._pulse.poll()})")
            await asyncio.sleep(0.05)
        self._proc = subprocess.Popen(
            [
                FIREFOX,
                "--headless",
                "--no-remote",
                "--profile",
                str(profile),
                "--remote-debugging-port",
                "0",
                "about:blank",
            ],  # its own port, written to the profile
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._session = aiohttp.ClientSession()
        server = profile / "WebDriverBiDiServer.json"  # {ws_host, ws_port} once it listens
        deadline = time.monotonic() + 60
        while not server.exists() or not server.read_text().strip().endswith("}"):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Firefox did not open its BiDi port ({FIREFOX}, rc {self._proc.poll()})")
            await asyncio.sleep(0.2)
        where = json.loads(server.read_text())
        ws = await self._session.ws_connect(f"ws://{where['ws_host']}:{where['ws_port']}/session", max_msg_size=0)
        self._bidi = BiDiConnection(ws)
        await self._bidi.command("session.new", {"capabilities": {"alwaysMatch": {"acceptInsecureCerts": True}}})
        return self

    async def new_page(self) -> FirefoxPage:
        tree = await self._bidi.command("browsingContext.getTree", {})
        unused = [
            c["context"]
            for c in tree["contexts"]
            if c["url"] == "about:blank" and c["context"] not in {p.context for p in self._pages}
        ]
        context = (
            unused[0] if unused else (await self._bidi.command("browsingContext.create", {"type": "tab"}))["context"]
        )
        page = FirefoxPage(self._bidi, context)
        self._pages.append(page)
        return page

    async def __aexit__(self, *exc) -> None:
        try:
            if self._bidi is not None:
                await asyncio.wait_for(self._bidi.command("session.end", {}), 5)
            await self._bidi.close()
        except Exception:  # noqa: BLE001 - the browser is stopped below either way
            pass
        if self._session is not None:
            await self._session.close()
        for proc in (self._proc, self._pulse):
            if proc is None:
                continue
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._profile.cleanup()
