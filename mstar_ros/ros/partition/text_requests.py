"""A partition node's requests from text (a part of PartitionNode).

``text`` (std_msgs/String) carries the text itself, or a JSON object with ``text`` and optionally
``id``, ``seed`` and the model's own fields; the model's request factory builds the request. The
seed is fixed here, so the next partition draws the same noise.
"""

from __future__ import annotations

import asyncio
import json
import secrets

from mstar.conductor import Request
from mstar_ros.ros.partition.stream_msgs import check_stream_id

MAX_TEXT_BYTES = 64 * 1024


class TextRequests:
    """PartitionNode's ``text`` callback."""

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
