"""A partition node's requests from streams (a part of PartitionNode).

The first item of a new stream starts a request whose StreamInput the following items feed, in
sequence; an item out of sequence, a stream that starts mid-way, or one idle for
``stream_timeout_s`` fails its request, and every output still gets the end of the stream.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from mstar.conductor import Request
from mstar.conductor.stream_input import StreamInput
from mstar.sampling_params import SamplingParams
from mstar_ros.ros.partition.stream_msgs import StreamHeader, StreamMessageError, read_message

DROPPED_IDS_KEPT = 4096  # stream ids whose late messages are still recognised and ignored


@dataclass
class IncomingStream:
    """A stream being fed into its request: one StreamInput and the next sequence number per input."""

    feeds: dict[str, StreamInput]
    next_seq: dict[str, int]
    last_seen: float


class StreamIntake:
    """PartitionNode's streamed-input callbacks."""

    def _on_item(self, name: str, msg) -> None:
        try:
            header, item = read_message(msg, self.dtypes[name])
        except StreamMessageError as exc:
            self.report(f"{name}: message dropped: {exc}")
            return
        sid = header.stream_id
        with self._lock:
            if sid in self._dropped:
                return
            incoming = self._incoming.get(sid)
            problem = None
            if incoming is None and (header.seq != 0 or header.end or sid in self._active):
                self._drop(sid)  # nothing will run: every output still gets the end of the stream
                if header.seq:
                    problem = (
                        f"stream {sid} joined at item {header.seq} on {name}: items 0..{header.seq - 1} "
                        "were lost (a partition started late?)"
                    )
                elif not header.end:
                    problem = f"stream {sid} started again while its request is in flight"
                elif header.failed:
                    problem = f"stream {sid} ended before its first item: its producer failed"
                self.stats.failed += problem is not None
            elif incoming is None:
                incoming = self._incoming[sid] = IncomingStream(
                    {n: StreamInput() for n in self.stream_inputs}, {n: 0 for n in self.stream_inputs}, time.monotonic()
                )
                self._active.add(sid)
                request = Request(dict(incoming.feeds), SamplingParams(seed=header.seed), request_id=sid)
                asyncio.run_coroutine_threadsafe(self._serve(request), self.loop)
            if incoming is not None:
                self._feed(sid, incoming, name, header, item)
                return
        self._publish_ends(sid, {n: 0 for n in self.graph.output_names}, failed=problem is not None)
        if problem:
            self.report(problem)

    def _feed(self, sid: str, incoming: IncomingStream, name: str, header: StreamHeader, item) -> None:
        """Under the lock: the item (or end) joins its request's StreamInput, in sequence."""
        incoming.last_seen = time.monotonic()
        expected = incoming.next_seq[name]
        feed = incoming.feeds[name]
        if header.seq != expected:
            self._drop(sid)
            feed.fail(f"{name} item {expected} never arrived (got item {header.seq})")
            return
        incoming.next_seq[name] = expected + 1
        if item is not None:
            feed.put(item)
        elif header.failed:
            feed.fail(f"the partition producing {name} failed this request")
        else:
            feed.close()
        if all(f.closed for f in incoming.feeds.values()):
            del self._incoming[sid]

    def _expire_idle_streams(self) -> None:
        now = time.monotonic()
        with self._lock:
            idle = [(sid, inc) for sid, inc in self._incoming.items() if now - inc.last_seen > self.stream_timeout_s]
            for sid, incoming in idle:
                self._drop(sid)
                for name, feed in incoming.feeds.items():
                    if not feed.closed:
                        feed.fail(
                            f"no {name} item for {self.stream_timeout_s:g} s after item "
                            f"{incoming.next_seq[name] - 1} (the producing partition stopped?)"
                        )

    def _drop(self, sid: str) -> None:
        """Under the lock: later messages of ``sid`` are ignored."""
        self._incoming.pop(sid, None)
        self._dropped[sid] = None
        while len(self._dropped) > DROPPED_IDS_KEPT:
            self._dropped.pop(next(iter(self._dropped)))
