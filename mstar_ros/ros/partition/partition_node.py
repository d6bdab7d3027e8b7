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

Requests from text are taken by text_requests, requests from streams by stream_intake (parts
of the node). This module imports rclpy: the node processes import it where ROS runs.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from mstar.conductor import Conductor, Request, RequestError
from mstar.graph.model_graph import ModelGraph
from mstar_ros.ros.common.diagnostics import publish_status
from mstar_ros.ros.partition.stream_intake import IncomingStream, StreamIntake
from mstar_ros.ros.partition.stream_msgs import StreamHeader, end_message, item_message, message_type
from mstar_ros.ros.partition.text_requests import TextRequests

log = logging.getLogger("mstar_ros.partition")

#: text, request id, seed, the JSON's other fields -> Request (ValueError for bad input)
RequestFactory = Callable[[str, str, int, Mapping[str, object]], Request]

#: reliable, keep-all: the middleware never drops a stream item (depth: the resource hint)
STREAM_QOS_DEPTH = 1000
STREAM_QOS = QoSProfile(depth=STREAM_QOS_DEPTH, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_ALL)


@dataclass
class PartitionStats:
    requests: int = 0
    finished: int = 0
    failed: int = 0
    published: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


class PartitionNode(TextRequests, StreamIntake, Node):
    def __init__(
        self,
        conductor: Conductor,
        graph: ModelGraph,
        loop: asyncio.AbstractEventLoop,
        *,
        node_name: str,
        namespace: str,
        dtypes: Mapping[str, torch.dtype],
        request_factory: RequestFactory | None = None,
        stream_timeout_s: float = 30.0,
        wait_for_readers: Sequence[str] = (),
        reader_wait_s: float = 5.0,
    ) -> None:
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
        self._incoming: dict[str, IncomingStream] = {}
        self._dropped: dict[str, None] = {}  # stream ids whose later messages are ignored (bounded)
        self._active: set[str] = set()  # request ids in flight
        self._counter = 0
        self._warned_no_readers = False
        self._id_prefix = f"{node_name}-{secrets.token_hex(3)}"  # a restarted node never reuses an id
        self.diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.pubs = {
            name: self.create_publisher(message_type(self.dtypes[name]), name, STREAM_QOS)
            for name in self.graph.output_names
        }
        for name in self.stream_inputs:
            self.create_subscription(
                message_type(self.dtypes[name]),
                name,
                lambda msg, name=name: self._guarded(self._on_item, name, msg),
                STREAM_QOS,
            )
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
            self.report(
                f"no reader on {', '.join(self.pubs[n].topic_name for n in waiting)} after "
                f"{self.reader_wait_s:g} s: serving anyway (is the next partition running?)",
                level="WARN",
            )

    def _publish_ends(self, sid: str, seqs: Mapping[str, int], failed: bool) -> None:
        for name, seq in seqs.items():
            self.pubs[name].publish(end_message(self.dtypes[name], sid, seq, failed=failed))

    def _publish_status(self) -> None:
        """Once a second: counters, and how many readers each output topic has (0: items go nowhere)."""
        values: dict[str, object] = {k: getattr(self.stats, k) for k in ("requests", "finished", "failed")}
        for name, pub in self.pubs.items():
            values[f"{name}.subscribers"] = pub.get_subscription_count()
            values[f"{name}.published"] = self.stats.published[name]
        publish_status(
            self, self.diag_pub, f"mstar: {self.get_fully_qualified_name()}", "serving", self.graph.name, values
        )

    def report(self, text: str, level: str = "ERROR") -> None:
        with self._lock:
            self.stats.errors = (self.stats.errors + [text])[-20:]
        self.get_logger().warning(text)
        publish_status(
            self,
            self.diag_pub,
            f"mstar: {self.get_fully_qualified_name()}",
            text,
            self.graph.name,
            {"requests": self.stats.requests, "failed": self.stats.failed},
            level=level,
        )


def _inputs_of(
    graph: ModelGraph, node_name: str, dtypes: Mapping[str, torch.dtype], request_factory: RequestFactory | None
) -> tuple[list[str], list[str]]:
    """(streamed inputs, plain inputs) of ``graph``; ValueError when the node could not serve it."""
    stream_inputs = graph.stream_input_names
    plain_inputs = [n for n in graph.input_names if n not in stream_inputs]
    missing = [n for n in stream_inputs + graph.output_names if n not in dtypes]
    if missing:
        raise ValueError(f"{node_name}: no dtype given for {missing} (their message types)")
    if plain_inputs and stream_inputs:
        raise ValueError(
            f"{node_name}: graph {graph.name!r} takes both streams {stream_inputs} and values "
            f"{plain_inputs}: a node cannot start its requests from either alone"
        )
    if plain_inputs and request_factory is None:
        raise ValueError(f"{node_name}: graph {graph.name!r} takes {plain_inputs}: it needs a request factory")
    return stream_inputs, plain_inputs
