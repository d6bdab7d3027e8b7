"""A ``multipart/form-data`` (or url-encoded) body (``/v1/images/edits`` as OpenAI's clients send it) into its text fields
and its files, read with aiohttp's multipart reader from the body the guard already read under the
route's byte limit (mstar_ros.webrtc.http_guard): nothing here reads from the connection. Bounded
in parts and in each text field's size; any body a client can send gives a ``BadForm``, never an
exception the server did not expect.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

from aiohttp import MultipartReader, StreamReader
from aiohttp.base_protocol import BaseProtocol

MAX_PARTS = 64
MAX_FIELD_BYTES = 256 * 1024  # a text field (the prompt: 32000 characters of up to 4 bytes each)


class BadForm(ValueError):
    pass


@dataclass
class Form:
    fields: dict[str, str | list[str]] = field(default_factory=dict)  # a name ending in [] keeps every value
    files: list[tuple[str, bytes]] = field(default_factory=list)  # (field name, the file's bytes), in order


def _stream_of(body: bytes) -> StreamReader:
    """``body`` as an aiohttp stream; its buffer limit above the body, so the stream never asks a
    connection to pause (it has none)."""
    loop = asyncio.get_running_loop()
    stream = StreamReader(BaseProtocol(loop), limit=max(2**16, len(body) + 1), loop=loop)
    stream.feed_data(body)
    stream.feed_eof()
    return stream


async def read_form(
    body: bytes, content_type: str, *, max_parts: int = MAX_PARTS, max_field_bytes: int = MAX_FIELD_BYTES
) -> Form:
    """The form's text fields (a repeated name: the last one; a name ending in ``[]``: a list of them all) and files (a part with a filename, or a
    part with a binary content type). A ``BadForm`` names what is wrong. An
    ``application/x-www-form-urlencoded`` body (a form without files) gives its fields."""
    if content_type.split(";")[0].strip().lower() == "application/x-www-form-urlencoded":
        try:
            pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, max_num_fields=max_parts)
        except (UnicodeDecodeError, ValueError) as exc:
            raise BadForm(f"the body is not a readable url-encoded form: {exc}") from None
        form = Form()
        for name, value in pairs:
            _add_field(form, name, value)
        return form
    try:
        reader = MultipartReader({"Content-Type": content_type}, _stream_of(body))
    except (ValueError, AssertionError) as exc:
        raise BadForm(f"the body is not multipart/form-data with a boundary: {exc}") from None
    form, parts = Form(), 0
    try:
        while True:
            part = await reader.next()
            if part is None:
                break
            parts += 1
            if parts > max_parts:
                raise BadForm(f"the form has over {max_parts} parts")
            if isinstance(part, MultipartReader):
                raise BadForm("a nested multipart part: each field is one part")
            name = part.name
            if not name:
                raise BadForm("a form part has no name (Content-Disposition: form-data; name=...)")
            kind = part.headers.get("Content-Type", "text/plain")
            if part.filename is not None or not kind.startswith("text/"):
                form.files.append((name, bytes(await part.read(decode=True))))
                continue
            data = bytes(await part.read(decode=True))  # in memory already: the body was read whole
            if len(data) > max_field_bytes:
                raise BadForm(f"form field {name!r} is over {max_field_bytes} bytes")
            try:
                _add_field(form, name, data.decode(part.get_charset("utf-8")))
            except (UnicodeDecodeError, LookupError):
                raise BadForm(f"form field {name!r} is not valid text") from None
    except BadForm:
        raise
    except Exception as exc:  # aiohttp raises ValueError, AssertionError, RuntimeError on a broken body
        raise BadForm(f"the body is not readable multipart/form-data: {type(exc).__name__}: {exc}") from None
    return form


def _add_field(form: Form, name: str, value: str) -> None:
    if name.endswith("[]"):
        values = form.fields.setdefault(name, [])
        if isinstance(values, list):
            values.append(value)
    else:
        form.fields[name] = value
