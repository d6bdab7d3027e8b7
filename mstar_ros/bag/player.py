"""``mstar-ros bag play``: publish a rosbag2 into ROS 2 with rclpy, at the recorded timing.

How it plays (what ``ros2 bag play`` does, minus the parts that are not on PyPI):

1. Reads the bag with ``rosbags`` (MCAP or sqlite3), picks the topics (``--topics``)
   and renames them (``--remap``).
2. Creates one publisher per topic, of the type the bag records -- only a standard ROS 2
   message type (rosbags' Kilted type store); any other type is refused with its topic
   named, and no module a bag names is ever imported. QoS: reliable, keep last ``depth``, volatile by
   default. A reliable publisher matches both reliable subscribers and best-effort
   ones (sensor-data QoS, as the policy nodes use for cameras) -- a best-effort
   publisher would match only the latter. Delivery to a best-effort subscriber is
   still best effort, and with keep-last history a slow reliable subscriber never
   blocks the player (the oldest unacknowledged samples are replaced).
3. Waits until every topic has a subscriber (``get_subscription_count() > 0``), with a
   timeout and a message naming the topics nobody subscribed to -- it never sleeps
   blindly hoping for discovery. DDS discovery is two-sided: the publisher sees the
   subscriber a moment (measured: 60-80 ms) before the subscriber has matched the
   publisher, and a best-effort subscriber loses whatever arrives in that window, so
   playback starts ``settle`` seconds (0.5 by default) after the last match.
4. Publishes each message's serialized bytes as recorded (no deserialization) at
   its recorded time relative to the bag start, divided by ``rate``, scheduled
   against one monotonic start time: a late message never shifts the ones after it
   (no drift). ``--loop`` repeats the bag (one typical message period between the
   passes). Optionally re-stamps ``header.stamp`` with the publish time (``restamp``),
   or publishes the bag time being played on ``/clock`` (``--clock``, mstar_ros.bag.bag_clock)
   for nodes that run on sim time.
5. Reports progress and a summary: messages per topic, achieved rate, lateness.
6. At exit removes the Fast DDS shared-memory ports it used that nobody uses any more
   (mstar_ros.bag.shm_ports).
"""

from __future__ import annotations

import collections
import functools
import importlib
import itertools
import math
import signal
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mstar_ros.bag.bag_clock import CLOCK_TOPIC, BagClock
from mstar_ros.bag.open_bag import BagError, bag_messages, open_bag
from mstar_ros.bag.ros_env import apply_localhost_defaults
from mstar_ros.bag.shm_ports import shut_down_removing_ports


class NoSubscribersError(TimeoutError):
    """Some topics still had no subscriber when the wait timed out."""


class _StopAfter(Exception):
    """--stop-after reached."""


@dataclass
class PlayOptions:
    rate: float = 1.0
    loop: bool = False
    topics: Sequence[str] | None = None  # topic names or namespaces; None = all
    remap: Mapping[str, str] = field(default_factory=dict)  # topic or namespace -> new name
    wait: bool = True
    wait_timeout: float = 30.0
    settle: float = 0.5
    reliability: str = "reliable"  # or "best_effort"
    depth: int = 10
    restamp: bool = False
    clock_hz: float | None = None  # publish the bag time on /clock at this rate (None: no /clock)
    stop_after: float | None = None  # wall-clock seconds of playback, then stop
    progress_every: float = 2.0  # seconds between progress lines; 0 = none
    node_name: str = "mstar_bag_player"

    def __post_init__(self) -> None:
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"--rate must be a positive number, got {self.rate}")
        if self.reliability not in ("reliable", "best_effort"):
            raise ValueError(f"reliability must be 'reliable' or 'best_effort', got {self.reliability!r}")
        if self.depth < 1:
            raise ValueError(f"--depth must be at least 1, got {self.depth}")
        if self.wait_timeout <= 0:
            raise ValueError(f"--wait-timeout must be positive, got {self.wait_timeout}")
        if self.settle < 0:
            raise ValueError(f"--settle must not be negative, got {self.settle}")
        if self.clock_hz is not None and not (self.clock_hz > 0 and math.isfinite(self.clock_hz)):
            raise ValueError(f"--clock must be a positive number of Hz, got {self.clock_hz}")
        if self.clock_hz is not None and self.restamp:
            raise ValueError(
                "--clock and --restamp contradict each other: --clock keeps the recorded stamps and "
                "publishes the recording's time on /clock (for nodes on use_sim_time); --restamp "
                "stamps with the time now"
            )
        if self.stop_after is not None and self.stop_after <= 0:
            raise ValueError(f"--stop-after must be positive, got {self.stop_after}")


@dataclass
class TopicReport:
    topic: str  # as published (after remapping)
    source: str  # as in the bag
    msgtype: str
    published: int = 0
    subscribers: int = 0


@dataclass
class PlayReport:
    messages: int
    topics: list[TopicReport]
    passes: int  # bag passes begun (1 without --loop)
    wall_s: float  # first to last publish
    bag_s: float  # recorded time covered between the first and last message published
    achieved_rate: float  # bag_s / wall_s
    lateness_ms: dict[str, float]  # p50, p95, max of (publish time - scheduled time)
    waited_s: float  # waiting for subscribers (+ settle)
    interrupted: bool


def parse_remaps(items: Iterable[str]) -> dict[str, str]:
    """``["/a:=/b", ...]`` -> ``{"/a": "/b"}``; names are made absolute."""
    out: dict[str, str] = {}
    for item in items:
        src, sep, dst = item.partition(":=")
        if not sep or not src.strip() or not dst.strip():
            raise ValueError(f"--remap expects FROM:=TO (a topic or a namespace), got {item!r}")
        out[_absolute(src.strip())] = _absolute(dst.strip())
    return out


def _absolute(name: str) -> str:
    name = name if name.startswith("/") else "/" + name
    return name.rstrip("/") or "/"


def _under(topic: str, prefix: str) -> bool:
    return topic == prefix or topic.startswith(prefix.rstrip("/") + "/")


def remap_topic(topic: str, remaps: Mapping[str, str]) -> str:
    """Exact topic matches first, then the longest matching namespace prefix."""
    if topic in remaps:
        return remaps[topic]
    prefixes = [p for p in remaps if _under(topic, p)]
    if not prefixes:
        return topic
    p = max(prefixes, key=len)
    return (remaps[p].rstrip("/") + topic[len(p.rstrip("/")) :]) or "/"


def select_topics(available: Sequence[str], wanted: Sequence[str] | None) -> list[str]:
    """The bag topics to play: all, or those equal to or under each wanted name."""
    if not wanted:
        return list(available)
    chosen: list[str] = []
    for w in wanted:
        w_abs = _absolute(w)
        hits = [t for t in available if _under(t, w_abs)]
        if not hits:
            raise ValueError(f"--topics: {w!r} matches no topic in the bag; it has: {', '.join(available)}")
        chosen += [t for t in hits if t not in chosen]
    return [t for t in available if t in chosen]


def _message_class(topic: str, msgtype: str):
    """The rclpy class of ``msgtype``. Only the standard types of rosbags' ROS 2 Kilted type store are
    looked up (their packages are the standard ones), so a bag can never make us import a module it names."""
    pkg, kind, name = (msgtype.split("/") + ["", "", ""])[:3]
    if kind != "msg" or msgtype not in _kilted_typestore().fielddefs:
        raise ValueError(
            f"{topic}: message type {msgtype!r} is not a standard ROS 2 message type (rosbags' Kilted "
            f"type store); the player publishes only those and imports nothing a bag names "
            f"(play the other topics with --topics)"
        )
    try:
        return getattr(importlib.import_module(f"{pkg}.msg"), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(
            f"{topic}: cannot publish {msgtype}: its Python message package is not installed "
            f"(pip install ros-kilted-{pkg.replace('_', '-')}): {exc}"
        ) from None


def _message_classes(reports: Mapping[str, TopicReport]) -> dict:
    """Output topic -> message class; every topic that cannot be published is named in one error."""
    classes, errors = {}, []
    for topic, rep in reports.items():
        try:
            classes[topic] = _message_class(rep.source, rep.msgtype)
        except ValueError as exc:
            errors.append(str(exc))
    if errors:
        raise ValueError("; ".join(errors))
    return classes


@functools.lru_cache(maxsize=1)
def _kilted_typestore():
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.ROS2_KILTED)


def _has_leading_header(conn) -> bool:
    """True when the message starts with std_msgs/Header (stamp at CDR offset 4)."""
    try:
        fields = _kilted_typestore().fielddefs[conn.msgtype][1]
        return bool(fields) and fields[0][1][1] == "std_msgs/msg/Header"
    except KeyError:
        pass
    for line in conn.msgdef.data.splitlines():
        line = line.split("#", 1)[0].strip()
        if line and "=" not in line:
            return line.split()[0] in ("std_msgs/Header", "std_msgs/msg/Header", "Header")
    return False


def _restamp(data: bytes, sec: int, nanosec: int) -> bytes | None:
    """Writes header.stamp into plain-CDR bytes; None for encapsulations we do not patch."""
    if len(data) < 12 or data[0] != 0:
        return None
    fmt = {0x01: "<iI", 0x00: ">iI"}.get(data[1])
    if fmt is None:
        return None
    buf = bytearray(data)
    struct.pack_into(fmt, buf, 4, sec, nanosec)
    return bytes(buf)


class _Lateness:
    """Percentiles over the recent window and the maximum over all."""

    def __init__(self, window: int = 20000) -> None:
        self.recent: collections.deque[float] = collections.deque(maxlen=window)
        self.max = 0.0

    def add(self, seconds: float) -> None:
        self.recent.append(seconds)
        self.max = max(self.max, seconds)

    def summary(self) -> dict[str, float]:
        if not self.recent:
            return {"p50": 0.0, "p95": 0.0, "max": 0.0}
        xs = sorted(self.recent)
        return {
            "p50": 1e3 * xs[len(xs) // 2],
            "p95": 1e3 * xs[min(len(xs) - 1, int(0.95 * len(xs)))],
            "max": 1e3 * self.max,
        }


class BagPlayer:
    """Plays one bag; ``run()`` returns a :class:`PlayReport`. Prints through ``out``."""

    def __init__(
        self, bag: str | Path, options: PlayOptions | None = None, out: Callable[[str], None] | None = None
    ) -> None:
        self.bag = Path(bag)
        self.options = options or PlayOptions()
        self.out = out or (lambda s: print(s, flush=True))
        if not self.bag.exists():
            raise FileNotFoundError(f"no bag at {self.bag}")
        self._stop = threading.Event()
        self._bag_clock = None  # BagClock with --clock

    def stop(self) -> None:
        """Ends playback after the current message (thread-safe)."""
        self._stop.set()

    # -- the plan: bag topics -> output topics

    def _plan(self, reader) -> tuple[list, dict[str, TopicReport], dict[int, str]]:
        conns = reader.connections
        available = sorted({c.topic for c in conns})
        chosen = set(select_topics(available, self.options.topics))
        selected = [c for c in conns if c.topic in chosen]
        reports: dict[str, TopicReport] = {}
        by_conn: dict[int, str] = {}
        for c in selected:
            out_topic = remap_topic(c.topic, self.options.remap)
            prev = reports.get(out_topic)
            if prev is not None and prev.msgtype != c.msgtype:
                raise ValueError(
                    f"--remap sends {prev.source} ({prev.msgtype}) and {c.topic} ({c.msgtype}) to one topic {out_topic}"
                )
            reports.setdefault(out_topic, TopicReport(out_topic, c.topic, c.msgtype))
            by_conn[c.id] = out_topic
        return selected, reports, by_conn

    # -- ROS

    def _qos(self):
        from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

        rel = ReliabilityPolicy.RELIABLE if self.options.reliability == "reliable" else ReliabilityPolicy.BEST_EFFORT
        return QoSProfile(
            history=HistoryPolicy.KEEP_LAST,
            depth=self.options.depth,
            reliability=rel,
            durability=DurabilityPolicy.VOLATILE,
        )

    def _wait_for_subscribers(self, executor, publishers: dict) -> float:
        opts = self.options
        t0 = time.monotonic()
        deadline = t0 + opts.wait_timeout
        self.out(
            f"waiting for a subscriber on each of {len(publishers)} topics "
            f"(timeout {opts.wait_timeout:g} s; --no-wait to start at once) ..."
        )
        while True:
            missing = [t for t, p in publishers.items() if p.get_subscription_count() == 0]
            if not missing:
                break
            if self._stop.is_set():
                raise KeyboardInterrupt
            now = time.monotonic()
            if now >= deadline:
                raise NoSubscribersError(
                    f"no subscriber on {len(missing)} of {len(publishers)} topics after {opts.wait_timeout:g} s: "
                    f"{', '.join(missing)}. Start the subscribers first (same ROS_DOMAIN_ID, and "
                    f"ROS_AUTOMATIC_DISCOVERY_RANGE allowing this host), play only the topics that have "
                    f"subscribers with --topics, rename with --remap, or start at once with --no-wait."
                )
            # woken early by the publishers' matched events; the timeout bounds each check
            executor.spin_once(timeout_sec=min(0.1, deadline - now))
        matched = time.monotonic() - t0
        if self._bag_clock is not None:
            self._bag_clock.publish_start()  # the settle time lets it arrive before the first message
        if opts.settle > 0:
            # the subscriber side of discovery completes a moment after ours (see module doc)
            end = time.monotonic() + opts.settle
            while (left := end - time.monotonic()) > 0 and not self._stop.is_set():
                executor.spin_once(timeout_sec=left)
        self.out(
            f"every topic has a subscriber after {matched:.2f} s; starting in {opts.settle:g} s "
            "(subscriber-side discovery)"
        )
        return time.monotonic() - t0

    def run(self) -> PlayReport:
        opts = self.options
        with open_bag(self.bag) as reader:
            selected, reports, by_conn = self._plan(reader)
            if not selected:
                raise ValueError(f"{self.bag}: no topics to play")
            counts = {c.id: c.msgcount for c in selected}
            total = sum(counts.values())
            if total == 0:
                raise BagError(f"{self.bag}: holds no messages on the topics to play: nothing to publish")
            bag_start = reader.start_time
            bag_end = reader.end_time - 1
            periods = [(bag_end - bag_start) / (n - 1) for n in counts.values() if n > 1]
            span_ns = (bag_end - bag_start) + int(min(periods) if periods else 0)  # one pass, for --loop
            headers = {c.id: _has_leading_header(c) for c in selected} if opts.restamp else {}
            classes = _message_classes(reports)
            if opts.clock_hz is not None and CLOCK_TOPIC in reports:
                raise ValueError(
                    f"--clock: the bag plays a {CLOCK_TOPIC} topic of its own ("
                    f"{reports[CLOCK_TOPIC].source}); play it without --clock, or leave that topic out "
                    "with --topics"
                )

            self.out(
                f"bag {self.bag}: {total} messages on {len(reports)} topics, {(bag_end - bag_start) / 1e9:.2f} s; "
                f"rate {opts.rate:g}" + (", looping" if opts.loop else "")
            )
            apply_localhost_defaults()  # before rclpy creates a DDS participant
            import rclpy
            from rclpy.context import Context
            from rclpy.event_handler import PublisherEventCallbacks
            from rclpy.executors import SingleThreadedExecutor
            from rclpy.signals import SignalHandlerOptions

            context = Context()
            # never let rcl read our command line as ROS args; signals are ours (play()): rclpy's own handler
            # would shut the context down at Ctrl-C, before its Fast DDS ports could be seen and cleaned
            rclpy.init(args=[], context=context, signal_handler_options=SignalHandlerOptions.NO)
            node = None
            try:
                node = rclpy.create_node(opts.node_name, context=context)
                executor = SingleThreadedExecutor(context=context)
                executor.add_node(node)
                qos = self._qos()
                publishers = {}
                for topic, rep in reports.items():
                    # a matched-event callback makes the executor wake as soon as a subscriber matches
                    cb = PublisherEventCallbacks(matched=lambda _info: None)
                    publishers[topic] = node.create_publisher(classes[topic], topic, qos, event_callbacks=cb)
                    src = f" (from {rep.source})" if rep.source != topic else ""
                    self.out(f"  {topic}{src}  [{rep.msgtype}]  {opts.reliability}, keep last {opts.depth}")
                awaited = publishers
                if opts.clock_hz is not None:
                    self._bag_clock = BagClock(node, opts.clock_hz, bag_start, opts.rate)
                    # nodes on sim time subscribe to /clock: wait for them as for the topics
                    awaited = {**publishers, CLOCK_TOPIC: self._bag_clock.publisher}
                    self.out(
                        f"  {CLOCK_TOPIC}  [rosgraph_msgs/msg/Clock]  the bag time being played, {opts.clock_hz:g} Hz"
                    )
                try:
                    waited = self._wait_for_subscribers(executor, awaited) if opts.wait else 0.0
                except KeyboardInterrupt:
                    self.out("stopped while waiting for subscribers; nothing published")
                    raise
                return self._play(
                    reader, selected, reports, by_conn, publishers, node, headers, bag_start, span_ns, waited
                )
            finally:

                def close() -> None:
                    if node is not None:
                        node.destroy_node()
                    context.try_shutdown()

                shut_down_removing_ports(close)  # and the Fast DDS ports nobody uses now

    def _play(
        self, reader, selected, reports, by_conn, publishers, node, headers, bag_start: int, span_ns: int, waited: float
    ) -> PlayReport:
        opts = self.options
        clock = node.get_clock()
        lateness = _Lateness()
        published = 0
        passes = 0
        first_wall = last_wall = None
        first_bag = last_bag = 0
        warned_restamp: set[str] = set()
        interrupted = False
        broken: BagError | None = None  # the bag turned out unreadable part-way: said after the summary
        scale = 1e-9 / opts.rate
        t0 = time.monotonic()
        next_progress = t0 + opts.progress_every if opts.progress_every > 0 else math.inf
        try:
            for pass_index in itertools.count():
                passes += 1
                offset = pass_index * span_ns
                if self._bag_clock is not None:
                    self._bag_clock.start_pass(t0 + offset * scale)
                for conn, ts, data in bag_messages(reader, self.bag, selected):
                    bag_t = ts - bag_start + offset
                    target = t0 + bag_t * scale
                    if opts.stop_after is not None and target - t0 > opts.stop_after:
                        raise _StopAfter
                    now = time.monotonic()
                    if target > now:
                        # sleeps until the scheduled time; wakes early only to stop (and for /clock)
                        if self._sleep_until(target):
                            raise KeyboardInterrupt
                        now = time.monotonic()
                    elif self._stop.is_set():
                        raise KeyboardInterrupt
                    if self._bag_clock is not None:
                        self._bag_clock.tick(now)
                    lateness.add(max(0.0, now - target))
                    topic = by_conn[conn.id]
                    payload = data if isinstance(data, bytes) else bytes(data)
                    if headers.get(conn.id):
                        sec, nsec = divmod(clock.now().nanoseconds, 10**9)
                        stamped = _restamp(payload, sec, nsec)
                        if stamped is None and topic not in warned_restamp:
                            warned_restamp.add(topic)
                            self.out(f"note: {topic}: not plain CDR, header.stamp left as recorded")
                        payload = stamped or payload
                    publishers[topic].publish(payload)
                    reports[topic].published += 1
                    published += 1
                    last_wall, last_bag = time.monotonic(), bag_t
                    if first_wall is None:
                        first_wall, first_bag = last_wall, bag_t
                    if last_wall >= next_progress:
                        next_progress += opts.progress_every
                        self._progress(last_wall - t0, bag_t, span_ns, pass_index, published, lateness)
                if not opts.loop:
                    break
        except _StopAfter:
            pass
        except KeyboardInterrupt:
            interrupted = True
        except BagError as exc:
            broken, interrupted = exc, True
        for topic, rep in reports.items():
            rep.subscribers = publishers[topic].get_subscription_count()
        wall = (last_wall - first_wall) if first_wall is not None else 0.0
        bag_s = (last_bag - first_bag) / 1e9
        report = PlayReport(
            messages=published,
            topics=list(reports.values()),
            passes=passes,
            wall_s=wall,
            bag_s=bag_s,
            achieved_rate=(bag_s / wall) if wall > 0 else 0.0,
            lateness_ms=lateness.summary(),
            waited_s=waited,
            interrupted=interrupted,
        )
        self.out(format_report(report, opts.rate))
        if broken is not None:
            raise broken
        return report

    def _sleep_until(self, target: float) -> bool:
        """Sleeps until monotonic time ``target``, publishing /clock when due; True when stopped."""
        while (left := target - time.monotonic()) > 0:
            if self._bag_clock is not None:
                left = min(left, self._bag_clock.tick(time.monotonic()))
            if self._stop.wait(max(0.0, left)):
                return True
        return False

    def _progress(
        self, wall: float, bag_t: int, span_ns: int, pass_index: int, published: int, lateness: _Lateness
    ) -> None:
        lat = lateness.summary()
        in_pass = (bag_t - pass_index * span_ns) / 1e9
        loop = f"pass {pass_index + 1}  " if self.options.loop else ""
        self.out(
            f"[{wall:7.1f} s] {loop}bag {in_pass:6.2f}/{span_ns / 1e9:.2f} s  {published} msgs "
            f"({published / wall if wall > 0 else 0:.1f}/s)  late p50 {lat['p50']:.2f} ms max {lat['max']:.1f} ms"
        )


def format_report(r: PlayReport, rate: float) -> str:
    lat = r.lateness_ms
    head = "stopped" if r.interrupted else "done"
    lines = [
        f"{head}: published {r.messages} messages on {len(r.topics)} topics in {r.wall_s:.2f} s "
        f"({r.passes} pass{'es' if r.passes != 1 else ''}): {r.bag_s:.2f} s of bag time, "
        f"achieved rate {r.achieved_rate:.3f} (asked {rate:g})",
        f"publish lateness vs schedule: p50 {lat['p50']:.2f} ms, p95 {lat['p95']:.2f} ms, max {lat['max']:.1f} ms",
    ]
    width = max((len(t.topic) for t in r.topics), default=0)
    for t in r.topics:
        hz = t.published / r.wall_s if r.wall_s > 0 else 0.0
        lines.append(f"  {t.topic:<{width}}  {t.published:>6} msgs  {hz:6.1f}/s  {t.subscribers} subscriber(s)")
    return "\n".join(lines)


def play(bag: str | Path, options: PlayOptions | None = None, out: Callable[[str], None] | None = None) -> PlayReport:
    """Plays ``bag``; SIGTERM and Ctrl-C stop it with a summary (main thread only). Ctrl-C works even where
    the player was started with SIGINT ignored (a background job of a script: Python then installs no
    handler of its own), as the node sets' rclpy handlers do."""
    player = BagPlayer(bag, options, out)
    restore = None
    if threading.current_thread() is threading.main_thread():
        restore = (
            signal.signal(signal.SIGTERM, lambda *_: player.stop()),
            signal.signal(signal.SIGINT, signal.default_int_handler),
        )
    try:
        return player.run()
    finally:
        if restore is not None:
            signal.signal(signal.SIGTERM, restore[0])
            signal.signal(signal.SIGINT, restore[1])


__all__ = [
    "BagPlayer",
    "NoSubscribersError",
    "PlayOptions",
    "PlayReport",
    "format_report",
    "parse_remaps",
    "play",
    "remap_topic",
    "select_topics",
]
