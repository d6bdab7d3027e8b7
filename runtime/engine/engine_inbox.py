"""Message intake shared by the engines: any thread posts, the device thread drains."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from mstar.engine.device_loop import DeviceLoop
from mstar.engine.messages import CloseSession, ExecuteNode, ExportKV, FeedInput, NodeOutput, ReleaseRequest

Reply = Callable[[NodeOutput], None]
# what an engine's device thread is handed; an ExecuteNode or ExportKV comes with a reply callback
InboxMessage = ExecuteNode | ReleaseRequest | CloseSession | FeedInput | ExportKV


class EngineInbox:
    name: str

    def __init__(self) -> None:
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.wake = threading.Event()  # replaced by the device loop's shared event
        self._own_loop: DeviceLoop | None = None

    def _post(self, msg: InboxMessage, reply: Callable | None = None) -> None:
        self._inbox.put((msg, reply))
        self.wake.set()

    def submit(self, msg: ExecuteNode, reply: Reply) -> None:
        self._post(msg, reply)

    def release(self, request_id: str) -> None:
        self._post(ReleaseRequest(request_id))

    def start(self) -> None:
        """Step on the device thread alone (a Worker instead runs its engines in one DeviceLoop)."""
        self._own_loop = DeviceLoop([self], self.name)  # type: ignore[list-item]
        self._own_loop.start()

    def stop(self) -> None:
        if self._own_loop is not None:
            self._own_loop.stop()

    def poll(self) -> None:
        """Handles every message posted so far (device thread only)."""
        while True:
            try:
                msg, reply = self._inbox.get_nowait()
            except queue.Empty:
                return
            self._handle(msg, reply)

    def _handle(self, msg: InboxMessage, reply: Callable | None = None) -> None:
        raise NotImplementedError
