"""A graph (or one partition cut out of it) as a ROS 2 node: its streams and outputs are topics.

Every graph output is a topic: each value the graph streams out is published as it is
produced (mstar_ros.ros.partition.stream_msgs: one std_msgs MultiArray per item, with a header
naming the request's stream, the item's sequence number and the request's seed), then
an end message. Every streamed graph input (a streaming edge cut at a partition, see
mstar.graph.split) is a subscription: the first item of a new stream starts a request
whose StreamInput the following items feed, so the cut edge's chunk policy runs here
just as it would inside one graph. A graph with ordinary inputs takes its requests as
text on ``text`` (std_msgs/String: the text itself, or a JSON object with ``text``
and optionally ``id``, ``seed``, ``max_tokens``, ``temperature``), built by the
model's request factory.

So a model whose partitions are joined by a streaming edge runs as one node per
partition, and the edge between them can be watched with ``ros2 topic echo``. Nothing
is lost silently: a malformed message, an item out of sequence, a stream that starts
mid-way, a failed request -- each is reported on /diagnostics, and the stream's end
message says ``failed`` so the next partition fails that request too.

This module imports rclpy: the node processes import it where ROS runs.
"""
from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import torch
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from mstar.conductor import Conductor, Request, RequestError
from mstar.conductor.stream_input import StreamInput
from mstar.engine.sampling_params import SamplingParams
from mstar.graph.model_graph import ModelGraph
from mstar_ros.ros.common.diagnostics import publish_status
from mstar_ros.ros.partition.stream_msgs import (StreamHeader, StreamMessageError, check_stream_id, end_message,
                                                 item_message, message_type, read_message)

log = logging.getLogger("mstar_ros.partition")

#: text, request id, seed, the JSON's other fields -> Request (ValueError for bad input)
RequestFactory = Callable[[str, str, int, Mapping[str, object]], Request]

#: reliable, keep-all: the middleware never drops a stream item (depth: the resource hint)
STREAM_QOS_DEPTH = 1000
STREAM_QOS = QoSProfile(depth=STREAM_QOS_DEPTH, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_ALL)
MAX_TEXT_BYTES = 64 * 1024


@dataclass
class PartitionStats:
    requests: int = 0
    finished: int = 0
    failed: int = 0
    published: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


@dataclass
class _Incoming:
    feeds: dict[str, StreamInput]
    next_seq: dict[str, int]
    last_seen: float


class PartitionNode(Node):
    def __init__(self, conductor: Conductor, graph: ModelGraph, loop: asyncio.AbstractEventLoop, *,
                 node_name: str, namespace: str, dtypes: Mapping[str, torch.dtype],
                 request_factory: RequestFactory | None = None, stream_timeout_s: float = 30.0,
                 wait_for_readers: Sequence[str] = (), reader_wait_s: float = 5.0) -> None:
        """``dtypes``: the tensor dtype of each streamed input and output (fixes its message type).
        ``stream_timeout_s``: a stream with no new item for this long fails (its producer is gone).
        ``wait_for_readers``: outputs that feed another partition; a request starts once each has a
        reader (at most ``reader_wait_s``), so the first items of a stream are not published to nobody
        while DDS discovery is still matching the nodes. ValueError (before the node exists) when the
        graph and these do not fit."""
        self.stream_inputs, self.plain_inputs = _inputs_of(graph, node_name, dtypes, request_factory)
        super().__init__(node_name, namespace=namespace)
        self.conductor, self.graph, self.loop, self.dtypes = conductor, graph, loop, dtypes
        self.request_factory, self.stream_timeout_s = request_factory, stream_timeout_s
        self.wait_for_readers, self.reader_wait_s = wait_for_readers, reader_wait_s
        self.stats = PartitionStats(published={name: 0 for name in self.graph.output_names})
        self.closing = False
        self._lock = threading.Lock()  # the rclpy thread and the Conductor's loop both come here
        self._incoming: dict[str, _Incoming] = {}
        self._dropped: dict[str, None] = {}  # stream ids whose later messages are ignored (bounded)
        self._active: set[str] = set()       # request ids in flight
        self._counter = 0
        self._warned_no_readers = False
        self._id_prefix = f"{node_name}-{secrets.token_hex(3)}"  # a restarted node never reuses an id
        self.diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.pubs = {name: self.create_publisher(message_type(self.dtypes[name]), name, STREAM_QOS)
                     for name in self.graph.output_names}
        for name in self.stream_inputs:
            self.create_subscription(message_type(self.dtypes[name]), name,
                                     lambda msg, name=name: self._guarded(self._on_item, name, msg), STREAM_QOS)
        if self.plain_inputs:
            self.create_subscription(String, "text", lambda msg: self._guarded(self._on_text, msg), 10)
        self.create_timer(1.0, self._publish_status)
        if self.stream_inputs:
            self.create_timer(1.0, self._expire_idle_streams)

    def _guarded(self, callback, *args) -> None:
        """No message, however malformed, may take the executor thread down with it."""
        try:
            callback(*args)
        except Exception as exc:  # noqa: BLE001 - reported, and the node keeps serving
            self.report(f"message dropped: {type(exc).__name__}: {exc}")

    # -- requests from text -----------------------------------------------------
    def _on_text(self, msg) -> None:
        try:
            request = self._text_request(msg.data)
        except (ValueError, TypeError) as exc:
            self.report(f"text request dropped: {exc}")
            return
        asyncio.run_coroutine_threadsafe(self._serve(request), self.loop)

    def _text_request(self, data: str) -> Request:
        if len(data.encode()) > MAX_TEXT_BYTES:
            raise ValueError(f"{len(data.encode())} bytes of text (at most {MAX_TEXT_BYTES})")
        fields: dict[str, object] = {"text": data}
        if data.lstrip().startswith("{"):
            try:
                fields = json.loads(data)
            except (json.JSONDecodeError, RecursionError) as exc:
                raise ValueError(f"text starts with '{{' but is not JSON: {exc}") from None
            if not isinstance(fields, dict) or not isinstance(fields.get("text"), str):
                raise ValueError("a JSON request is an object with a string 'text'")
        with self._lock:
            self._counter += 1
            default_id = f"{self._id_prefix}-{self._counter}"
        request_id = check_stream_id(str(fields.pop("id", default_id)))
        seed = fields.pop("seed", None)
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**62):
            raise ValueError(f"seed must be an integer in [0, 2**62), got {seed!r}")
        text = str(fields.pop("text"))
        # the seed is fixed here, not by the Conductor: the next partition must draw the same noise
        request = self.request_factory(text, request_id, secrets.randbits(62) if seed is None else seed, fields)
        with self._lock:
            if request_id in self._active:
                raise ValueError(f"request id {request_id!r} is already in flight")
            self._active.add(request_id)
        return request

    # -- requests from streams --------------------------------------------------
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
                    problem = (f"stream {sid} joined at item {header.seq} on {name}: items 0..{header.seq - 1} "
                               "were lost (a partition started late?)")
                elif not header.end:
                    problem = f"stream {sid} started again while its request is in flight"
                elif header.failed:
                    problem = f"stream {sid} ended before its first item: its producer failed"
                self.stats.failed += problem is not None
            elif incoming is None:
                incoming = self._incoming[sid] = _Incoming({n: StreamInput() for n in self.stream_inputs},
                                                           {n: 0 for n in self.stream_inputs}, time.monotonic())
                self._active.add(sid)
                request = Request(dict(incoming.feeds), SamplingParams(seed=header.seed), request_id=sid)
                asyncio.run_coroutine_threadsafe(self._serve(request), self.loop)
            if incoming is not None:
                self._feed(sid, incoming, name, header, item)
                return
        self._publish_ends(sid, {n: 0 for n in self.graph.output_names}, failed=problem is not None)
        if problem:
            self.report(problem)

    def _feed(self, sid: str, incoming: _Incoming, name: str, header: StreamHeader, item) -> None:
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
                        feed.fail(f"no {name} item for {self.stream_timeout_s:g} s after item "
                                  f"{incoming.next_seq[name] - 1} (the producing partition stopped?)")

    def _drop(self, sid: str) -> None:
        """Under the lock: later messages of ``sid`` are ignored."""
        self._incoming.pop(sid, None)
        self._dropped[sid] = None
        while len(self._dropped) > 4096:
            self._dropped.pop(next(iter(self._dropped)))

    # -- serving ----------------------------------------------------------------
    async def _serve(self, request: Request) -> None:
        """On the Conductor's loop: publishes each output item as it comes, then the end of each."""
        sid = request.request_id
        seed = request.sampling.seed or 0
        seqs = {name: 0 for name in self.graph.output_names}
        error: str | None = None
        with self._lock:
            self._active.add(sid)
            self.stats.requests += 1
        await self._readers_ready()
        try:
            async for out in self.conductor.submit(request):
                self.pubs[out.name].publish(item_message(out.data, StreamHeader(sid, seqs[out.name], seed)))
                seqs[out.name] += 1
        except Exception as exc:  # a bad request or a failed node: this request only
            error = str(exc) if isinstance(exc, RequestError) else f"request {sid} failed: {exc}"
        failed = error is not None
        with self._lock:
            self._active.discard(sid)
            if sid in self._incoming:  # it failed before its streams ended: ignore the rest of them
                self._drop(sid)
            self.stats.failed += failed
            self.stats.finished += not failed
            for name, seq in seqs.items():
                self.stats.published[name] += seq
        # the streams end before the error is told: a reader that sees the error finds them closed
        self._publish_ends(sid, seqs, failed)
        if error is not None and not self.closing:
            self.report(error)

    async def _readers_ready(self) -> None:
        waiting = [n for n in self.wait_for_readers if self.pubs[n].get_subscription_count() == 0]
        deadline = time.monotonic() + self.reader_wait_s
        while waiting and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            waiting = [n for n in waiting if self.pubs[n].get_subscription_count() == 0]
        if waiting and not self._warned_no_readers:
            self._warned_no_readers = True  # once: a partition may well run alone on purpose
            self.report(f"no reader on {', '.join(self.pubs[n].topic_name for n in waiting)} after "
                        f"{self.reader_wait_s:g} s: serving anyway (is the next partition running?)", level="WARN")

    def _publish_ends(self, sid: str, seqs: Mapping[str, int], failed: bool) -> None:
        for name, seq in seqs.items():
            self.pubs[name].publish(end_message(self.dtypes[name], sid, seq, failed=failed))

    def _publish_status(self) -> None:
        """Once a second: counters, and how many readers each output topic has (0: items go nowhere)."""
        values: dict[str, object] = {k: getattr(self.stats, k) for k in ("requests", "finished", "failed")}
        for name, pub in self.pubs.items():
            values[f"{name}.subscribers"] = pub.get_subscription_count()
            values[f"{name}.published"] = self.stats.published[name]
        publish_status(self, self.diag_pub, f"mstar: {self.get_fully_qualified_name()}", "serving", self.graph.name,
                       values)

    def report(self, text: str, level: str = "ERROR") -> None:
        with self._lock:
            self.stats.errors = (self.stats.errors + [text])[-20:]
        self.get_logger().warning(text)
        publish_status(self, self.diag_pub, f"mstar: {self.get_fully_qualified_name()}", text, self.graph.name,
                       {"requests": self.stats.requests, "failed": self.stats.failed}, level=level)


def _inputs_of(graph: ModelGraph, node_name: str, dtypes: Mapping[str, torch.dtype],
               request_factory: RequestFactory | None) -> tuple[list[str], list[str]]:
    """(streamed inputs, plain inputs) of ``graph``; ValueError when the node could not serve it."""
    stream_inputs = graph.stream_input_names
    plain_inputs = [n for n in graph.input_names if n not in stream_inputs]
    missing = [n for n in stream_inputs + graph.output_names if n not in dtypes]
    if missing:
        raise ValueError(f"{node_name}: no dtype given for {missing} (their message types)")
    if plain_inputs and stream_inputs:
        raise ValueError(f"{node_name}: graph {graph.name!r} takes both streams {stream_inputs} and values "
                         f"{plain_inputs}: a node cannot start its requests from either alone")
    if plain_inputs and request_factory is None:
        raise ValueError(f"{node_name}: graph {graph.name!r} takes {plain_inputs}: it needs a request factory")
    return stream_inputs, plain_inputs
