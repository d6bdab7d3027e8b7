"""The Conductor's end of one Worker process: sends node messages, routes replies, notices death.

Same surface as the in-process ``Worker`` (``WorkerLink``: execute / handle / export_kv / stats /
kv_blocks_used), so the Conductor does not care where a Worker lives. Replies arrive
on the event loop (one reader task per connection). When the connection drops, every
call still in flight on this Worker ends with an error that says which Worker died
and how; nothing waits forever.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import time
from collections.abc import Awaitable, Callable

from mstar.engine.messages import CloseSession, ExecuteNode, ExportKV, FeedInput, KVExported, NodeOutput, ReleaseRequest
from mstar.worker.protocol import (
    HEADER_SIZE,
    Message,
    Ready,
    StatsRequest,
    WorkerStats,
    decode_body,
    encode_frame,
    frame_length,
)

log = logging.getLogger("mstar.conductor.workers")


class WorkerDied(RuntimeError):
    pass


class RemoteWorker:
    def __init__(
        self,
        rank: int,
        nodes: list[str],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        pid: int,
        host: str,
        ready: Ready,
        process: subprocess.Popen | None = None,
    ) -> None:
        self.rank = rank
        self.nodes = list(nodes)
        self.pid = pid
        self.host = host
        self.endpoints = dict(ready.endpoints)
        self.segment_prefix = ready.segment_prefix
        self.dtype, self.dtype_reason = ready.dtype or None, ready.dtype_reason or None
        self.process = process
        self._reader = reader
        self._writer = writer
        self._calls: dict[int, tuple[str, Callable[[NodeOutput], None]]] = {}  # call id -> (node, reply)
        self._kv_exports: dict[int, Callable[[KVExported], None]] = {}
        self._stats_waiters: dict[int, asyncio.Future] = {}
        self._stats_seq = 0
        self._last_stats = WorkerStats(0, {}, 0, 0)
        self.last_heard = time.monotonic()  # Ready, then each heartbeat (stats) reply: its age tells a wedged Worker
        self.death: str | None = None
        self.lost = False  # the connection dropped; death says why once known
        self.dead = asyncio.Event()
        # asked once the connection drops: the supervisor can say more (the exit code)
        self.explain_death: Callable[[], Awaitable[str | None]] | None = None
        self.on_lost: Callable[[RemoteWorker], None] | None = None  # told at once, before the reason is known
        self._task: asyncio.Task | None = None

    def __repr__(self) -> str:
        return f"worker rank {self.rank} (pid {self.pid})"

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.ensure_future(self._read_loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._writer.close()

    async def _read_loop(self) -> None:
        reason = "closed its connection"
        try:
            while True:
                header = await self._reader.readexactly(HEADER_SIZE)
                self._on_message(decode_body(await self._reader.readexactly(frame_length(header))))
        except (asyncio.IncompleteReadError, ConnectionError):
            self.lost = True  # calls made from now on wait for _fail_all below, with the reason
            if self.on_lost is not None:
                self.on_lost(self)
            if self.explain_death is not None:
                try:
                    reason = await asyncio.wait_for(self.explain_death(), 0.5) or reason
                except asyncio.TimeoutError:
                    pass
        except asyncio.CancelledError:
            self._fail_all("was stopped")
            raise
        except Exception as exc:  # a garbled frame: the stream can no longer be trusted
            reason = f"sent a bad frame ({type(exc).__name__}: {exc})"
            log.error("%r %s", self, reason)
        self._fail_all(reason)
        self._writer.close()

    def _on_message(self, msg: Message) -> None:
        if isinstance(msg, NodeOutput):
            entry = self._calls.get(msg.call_id)
            if entry is None:
                return  # a call that was already failed (or released)
            if msg.final or msg.error is not None:
                self._calls.pop(msg.call_id, None)
            entry[1](msg)
        elif isinstance(msg, KVExported):
            reply = self._kv_exports.pop(msg.call_id, None)
            if reply is not None:
                reply(msg)
        elif isinstance(msg, WorkerStats):
            self._last_stats = msg
            self.last_heard = time.monotonic()
            waiter = self._stats_waiters.pop(msg.seq, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(msg)
        else:
            log.warning("%r sent an unexpected %s", self, type(msg).__name__)

    def _fail_all(self, reason: str) -> None:
        if self.death is None:
            self.death = reason
        text = f"{self!r} {self.death}"
        calls, self._calls = self._calls, {}
        for call_id, (node, reply) in calls.items():
            reply(NodeOutput(call_id, "", 0, final=True, error=f"{text} while running node {node!r}"))
        exports, self._kv_exports = self._kv_exports, {}
        for call_id, reply in exports.items():
            reply(KVExported(call_id, "", error=f"{text} while handing over KV"))
        for waiter in self._stats_waiters.values():
            if not waiter.done():
                waiter.set_exception(WorkerDied(text))
        self._stats_waiters.clear()
        self.dead.set()

    def mark_dead(self, reason: str) -> None:
        """The supervisor knows more (the exit code): fail what is in flight with that."""
        self.death = reason
        self._fail_all(reason)
        self.stop()

    # -- the Worker surface -------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.death is None and not self.lost

    def _send(self, msg: Message) -> bool:
        """False once the Worker is known dead; while the reason is being found, drops the message
        (a call registered meanwhile is failed with that reason)."""
        if self.death is not None:
            return False
        if not self.lost and not self._writer.is_closing():
            self._writer.write(encode_frame(msg))
        return True

    def execute(self, msg: ExecuteNode, reply: Callable[[NodeOutput], None]) -> None:
        self._calls[msg.call_id] = (msg.node, reply)
        if not self._send(msg):
            self._calls.pop(msg.call_id, None)
            reply(
                NodeOutput(
                    msg.call_id,
                    msg.request_id,
                    0,
                    final=True,
                    error=f"{self!r} {self.death or 'is gone'}; node {msg.node!r} did not run",
                )
            )

    def handle(self, msg: ReleaseRequest | CloseSession | FeedInput) -> None:
        self._send(msg)  # after the calls sent before it: one connection keeps the order

    def export_kv(self, msg: ExportKV, reply: Callable[[KVExported], None]) -> None:
        self._kv_exports[msg.call_id] = reply
        if not self._send(msg):
            self._kv_exports.pop(msg.call_id, None)
            reply(KVExported(msg.call_id, msg.request_id, error=f"{self!r} {self.death or 'is gone'}"))

    async def refresh_stats(self, timeout: float = 5.0) -> WorkerStats:
        """The Worker's counters; raises asyncio.TimeoutError when it does not answer in time."""
        if not self.alive:
            return self._last_stats
        self._stats_seq += 1
        seq = self._stats_seq
        waiter = asyncio.get_running_loop().create_future()
        self._stats_waiters[seq] = waiter
        self._send(StatsRequest(seq))
        try:
            return await asyncio.wait_for(waiter, timeout)
        except WorkerDied:
            return self._last_stats
        finally:
            self._stats_waiters.pop(seq, None)

    def stats(self) -> dict[str, dict[str, int]]:
        return dict(self._last_stats.engines)

    def kv_blocks_used(self) -> int:
        return 0 if self.death is not None else self._last_stats.kv_blocks_used

    def tensors_held(self) -> int:
        return 0 if self.death is not None else self._last_stats.tensors_held
