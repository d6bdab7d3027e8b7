"""A graph (or one partition cut out of it) as a ROS 2 node: its streams and outputs are topics.

Every graph output is a topic: each value the graph streams out is published as it is
produced (mstar_ros.ros.stream_msgs: one std_msgs MultiArray per item, with a header
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
"""
from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch

from mstar.conductor import Conductor, Request, RequestError
from mstar.conductor.stream_input import StreamInput
from mstar.engine.sampling_params import SamplingParams
from mstar.graph.model_graph import ModelGraph
from mstar_ros.ros.stream_msgs import (StreamHeader, StreamMessageError, check_stream_id, end_message, item_message,
                                       message_type, read_message)

log = logging.getLogger("mstar_ros.partition")

#: text, request id, seed, the JSON's other fields -> Request (ValueError for bad input)
RequestFactory = Callable[[str, str, int, Mapping[str, object]], Request]

#: reliable and deep: a stream item is never dropped by the middleware for being early
STREAM_QOS_DEPTH = 1000
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


def make_partition_node(conductor: Conductor, graph: ModelGraph, loop: asyncio.AbstractEventLoop, *,
                        node_name: str, namespace: str, dtypes: Mapping[str, torch.dtype],
                        request_factory: RequestFactory | None = None):
    """``dtypes``: the tensor dtype of each streamed input and output (fixes its message type)."""
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
    from rclpy.node import Node
    from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
    from std_msgs.msg import String

    stream_inputs = graph.stream_input_names
    plain_inputs = [n for n in graph.input_names if n not in stream_inputs]
    missing = [n for n in stream_inputs + graph.output_names if n not in dtypes]
    if missing:
        raise ValueError(f"{node_name}: no dtype given for {missing} (their message types)")
    if plain_inputs and request_factory is None:
        raise ValueError(f"{node_name}: graph {graph.name!r} takes {plain_inputs}: it needs a request factory")
    qos = QoSProfile(depth=STREAM_QOS_DEPTH, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)

    class PartitionNode(Node):
        def __init__(self) -> None:
            super().__init__(node_name, namespace=namespace)
            self.stats = PartitionStats(published={name: 0 for name in graph.output_names})
            self.closing = False
            self._lock = threading.Lock()
            self._incoming: dict[str, _Incoming] = {}
            self._dropped: dict[str, None] = {}  # stream ids whose later messages are ignored (bounded)
            self._counter = 0
            self.diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
            self.pubs = {name: self.create_publisher(message_type(dtypes[name]), name, qos)
                         for name in graph.output_names}
            for name in stream_inputs:
                self.create_subscription(message_type(dtypes[name]), name,
                                         lambda msg, name=name: self._on_item(name, msg), qos)
            if plain_inputs:
                self.create_subscription(String, "text", self._on_text, 10)
            self.create_timer(1.0, self._publish_status)

        # -- requests from text -----------------------------------------------------
        def _on_text(self, msg) -> None:
            try:
                request = self._text_request(msg.data)
            except (ValueError, TypeError) as exc:
                self.report(f"text request dropped: {exc}")
                return
            asyncio.run_coroutine_threadsafe(self._serve(request), loop)

        def _text_request(self, data: str) -> Request:
            if len(data.encode()) > MAX_TEXT_BYTES:
                raise ValueError(f"{len(data.encode())} bytes of text (at most {MAX_TEXT_BYTES})")
            fields: dict[str, object] = {"text": data}
            if data.lstrip().startswith("{"):
                try:
                    fields = json.loads(data)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"text starts with '{{' but is not JSON: {exc}") from None
                if not isinstance(fields, dict) or not isinstance(fields.get("text"), str):
                    raise ValueError("a JSON request is an object with a string 'text'")
            with self._lock:
                self._counter += 1
                default_id = f"{node_name}-{self._counter}"
            request_id = check_stream_id(str(fields.pop("id", default_id)))
            seed = fields.pop("seed", None)
            if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**62):
                raise ValueError(f"seed must be an integer in [0, 2**62), got {seed!r}")
            text = str(fields.pop("text"))
            # the seed is fixed here, not by the Conductor: the next partition must draw the same noise
            return request_factory(text, request_id, secrets.randbits(62) if seed is None else seed, fields)

        # -- requests from streams --------------------------------------------------
        def _on_item(self, name: str, msg) -> None:
            try:
                header, item = read_message(msg, dtypes[name])
            except StreamMessageError as exc:
                self.report(f"{name}: message dropped: {exc}")
                return
            sid = header.stream_id
            with self._lock:
                if sid in self._dropped:
                    return
                incoming = self._incoming.get(sid)
                if incoming is None:
                    if header.seq != 0 or header.end:
                        self._drop(sid)
                        problem = f"stream {sid} joined at item {header.seq} on {name}: items 0..{header.seq - 1} " \
                                  "were lost (a partition started late?)" if header.seq else f"stream {sid} is empty"
                        self._later(problem, failed_request=bool(header.seq))
                        return
                    incoming = self._incoming[sid] = _Incoming({n: StreamInput() for n in stream_inputs},
                                                               {n: 0 for n in stream_inputs})
                    request = Request(dict(incoming.feeds), SamplingParams(seed=header.seed), request_id=sid)
                    asyncio.run_coroutine_threadsafe(self._serve(request), loop)
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

        def _drop(self, sid: str) -> None:
            self._incoming.pop(sid, None)
            self._dropped[sid] = None
            while len(self._dropped) > 4096:
                self._dropped.pop(next(iter(self._dropped)))

        def _later(self, text: str, failed_request: bool) -> None:
            self.report(text)
            if failed_request:
                self.stats.failed += 1

        # -- serving ----------------------------------------------------------------
        async def _serve(self, request: Request) -> None:
            """On the Conductor's loop: publishes each output item as it comes, then the end of each."""
            sid = request.request_id
            seed = request.sampling.seed or 0
            seqs = {name: 0 for name in graph.output_names}
            failed = False
            self.stats.requests += 1
            try:
                async for out in conductor.submit(request):
                    self.pubs[out.name].publish(item_message(out.data, StreamHeader(sid, seqs[out.name], seed)))
                    seqs[out.name] += 1
                self.stats.finished += 1
            except Exception as exc:  # a bad request or a failed node: this request only
                failed = True
                self.stats.failed += 1
                if not self.closing:
                    self.report(str(exc) if isinstance(exc, RequestError) else f"request {sid} failed: {exc}")
            for name, seq in seqs.items():
                self.stats.published[name] += seq
                self.pubs[name].publish(end_message(dtypes[name], sid, seq, failed=failed))

        def _publish_status(self) -> None:
            """Once a second: counters, and how many readers each output topic has (0: items go nowhere)."""
            status = DiagnosticStatus(level=DiagnosticStatus.OK, name=f"mstar: {self.get_fully_qualified_name()}",
                                      message="serving", hardware_id=graph.name)
            status.values = [KeyValue(key=k, value=str(getattr(self.stats, k))) for k in ("requests", "finished", "failed")]
            for name, pub in self.pubs.items():
                status.values += [KeyValue(key=f"{name}.subscribers", value=str(pub.get_subscription_count())),
                                  KeyValue(key=f"{name}.published", value=str(self.stats.published[name]))]
            array = DiagnosticArray(status=[status])
            array.header.stamp = self.get_clock().now().to_msg()
            self.diag_pub.publish(array)

        def report(self, text: str) -> None:
            self.stats.errors = (self.stats.errors + [text])[-20:]
            self.get_logger().warning(text)
            status = DiagnosticStatus(level=DiagnosticStatus.ERROR, name=f"mstar: {self.get_fully_qualified_name()}",
                                      message=text, hardware_id=graph.name)
            status.values = [KeyValue(key="requests", value=str(self.stats.requests)),
                             KeyValue(key="failed", value=str(self.stats.failed))]
            array = DiagnosticArray(status=[status])
            array.header.stamp = self.get_clock().now().to_msg()
            self.diag_pub.publish(array)

    return PartitionNode()
