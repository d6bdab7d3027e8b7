"""A multipart or url-encoded body into fields and files; anything else a ``BadForm`` naming the problem."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from mstar_ros.webrtc.multipart_form import BadForm, read_form


class Sink:
    def __init__(self) -> None:
        self.data = b""

    async def write(self, data: bytes) -> None:
        self.data += data


def multipart(*parts: tuple[str, bytes | str, str | None]) -> tuple[bytes, str]:
    async def build():
        writer = aiohttp.MultipartWriter("form-data")
        for name, value, filename in parts:
            part = writer.append(value, {"Content-Type": "image/png"} if filename else None)
            part.set_content_disposition("form-data", name=name, **({"filename": filename} if filename else {}))
        sink = Sink()
        await writer.write(sink)
        return sink.data, writer.content_type

    return asyncio.run(build())


def read(body: bytes, kind: str, **limits):
    return asyncio.run(read_form(body, kind, **limits))


def test_fields_and_files_in_order():
    body, kind = multipart(
        ("prompt", "a fox", None), ("image[]", b"\x89PNG one", "a.png"), ("image[]", b"two", "b.png")
    )
    form = read(body, kind)
    assert form.fields == {"prompt": "a fox"}
    assert form.files == [("image[]", b"\x89PNG one"), ("image[]", b"two")]
    assert read(b"prompt=a+fox&n=2", "application/x-www-form-urlencoded").fields == {"prompt": "a fox", "n": "2"}


def test_bad_bodies_are_bad_forms():
    body, kind = multipart(*[(f"f{i}", "x", None) for i in range(5)])
    with pytest.raises(BadForm, match="over 4 parts"):
        read(body, kind, max_parts=4)
    body, kind = multipart(("prompt", "x" * 100, None))
    with pytest.raises(BadForm, match="'prompt' is over 10 bytes"):
        read(body, kind, max_field_bytes=10)
    with pytest.raises(BadForm, match="not readable"):
        read(b"garbage", kind)
    with pytest.raises(BadForm, match="boundary"):
        read(body, "multipart/form-data")
