"""What a rosbag2 holds (``mstar-ros bag info``), read with ``rosbags``; no ROS install needed.
A broken bag is one :class:`~mstar_ros.bag.open_bag.BagError` naming the file (see open_bag)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from mstar_ros.bag.open_bag import open_bag, read_metadata


@dataclass(frozen=True)
class TopicSummary:
    topic: str
    msgtype: str
    count: int
    qos: str  # offered QoS as recorded, in words ("" when not recorded)


@dataclass(frozen=True)
class BagInfo:
    path: Path
    storage: str
    version: int | None
    start_ns: int
    end_ns: int  # the latest message's timestamp
    messages: int
    topics: list[TopicSummary]
    compression: str
    custom_data: dict[str, str]
    size_bytes: int

    @property
    def duration_s(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9


def bag_custom_data(path: str | Path) -> dict[str, str]:
    """The ``custom_data`` of a bag directory's metadata.yaml (empty when there is none)."""
    return dict(read_metadata(path).get("custom_data") or {})


def _qos_words(conn) -> str:
    profiles = getattr(conn.ext, "offered_qos_profiles", None) or []
    if not profiles:
        return ""
    q = profiles[0]
    return f"{q.reliability.name.lower()}, {q.history.name.lower()} {q.depth}, {q.durability.name.lower()}"


def read_info(path: str | Path) -> BagInfo:
    path = Path(path)
    with open_bag(path) as reader:
        meta = read_metadata(path)
        counts: dict[str, int] = {}
        types: dict[str, str] = {}
        qos: dict[str, str] = {}
        for c in reader.connections:
            counts[c.topic] = counts.get(c.topic, 0) + c.msgcount
            types[c.topic] = c.msgtype
            qos.setdefault(c.topic, _qos_words(c))
        topics = [TopicSummary(t, types[t], counts[t], qos[t]) for t in sorted(counts)]
        storage = meta.get("storage_identifier") or ("mcap" if path.suffix == ".mcap" else "sqlite3")
        compression = meta.get("compression_format") or ""
        if not compression and storage == "mcap":
            compression = "per MCAP chunk" if _mcap_compressed(path) else ""
        size = sum(f.stat().st_size for f in path.iterdir() if f.is_file()) if path.is_dir() else path.stat().st_size
        return BagInfo(
            path=path,
            storage=storage,
            version=meta.get("version"),
            start_ns=reader.start_time if reader.message_count else 0,
            end_ns=(reader.end_time - 1) if reader.message_count else 0,
            messages=reader.message_count,
            topics=topics,
            compression=compression,
            custom_data=dict(meta.get("custom_data") or {}),
            size_bytes=size,
        )


def _mcap_compressed(path: Path) -> bool:
    files = [path] if path.is_file() else sorted(path.glob("*.mcap"))
    for f in files:
        with f.open("rb") as fh:
            head = fh.read(1 << 16)
        if b"zstd" in head or b"lz4" in head:
            return True
    return False


def format_info(info: BagInfo) -> str:
    start = datetime.fromtimestamp(info.start_ns / 1e9, tz=timezone.utc).isoformat(timespec="milliseconds")
    lines = [
        f"bag:         {info.path}",
        f"storage:     {info.storage}"
        + (f" (rosbag2 metadata version {info.version})" if info.version else "")
        + (f", compressed {info.compression}" if info.compression else ""),
        f"size:        {info.size_bytes / 2**20:.1f} MiB",
        f"start:       {start} ({info.start_ns} ns)",
        f"duration:    {info.duration_s:.3f} s",
        f"messages:    {info.messages}",
        f"topics:      {len(info.topics)}",
    ]
    width = max((len(t.topic) for t in info.topics), default=0)
    twidth = max((len(t.msgtype) for t in info.topics), default=0)
    for t in info.topics:
        hz = (t.count - 1) / info.duration_s if info.duration_s > 0 and t.count > 1 else 0.0
        qos = f"  offered QoS: {t.qos}" if t.qos else ""
        lines.append(f"  {t.topic:<{width}}  {t.msgtype:<{twidth}}  {t.count:>6} msgs  ~{hz:5.1f} Hz{qos}")
    for key, value in info.custom_data.items():
        lines.append(f"custom data: {key} = {value}")
    return "\n".join(lines)
