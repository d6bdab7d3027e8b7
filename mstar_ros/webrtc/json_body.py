"""A request body's JSON, decoded into a msgspec type: any body a client can send gives a ``BadJSON``
(the routes answer 400 with its message), never an exception the server did not expect."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

T = TypeVar("T")


class BadJSON(ValueError):
    pass


def decode_json(raw: bytes | str, type: type[T] = Any, what: str = "the body") -> T:
    try:
        return msgspec.json.decode(raw, type=type)
    except msgspec.ValidationError as exc:
        raise BadJSON(f"{what}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise BadJSON(f"{what} is not valid JSON: {exc}") from None
    except RecursionError:  # msgspec nests as deep as the input does
        raise BadJSON(f"{what} is nested too deeply") from None
