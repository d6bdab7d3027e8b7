"""Errors on the OpenAI-compatible routes (``/v1/...``) in OpenAI's shape:
``{"error": {"message", "type", "param", "code"}}``, every key present (``null`` where it does not apply).

OpenAI's clients read ``param`` and ``code`` off that object (the Python client's ``APIError.param``),
so a refused field is named there, not only in the message. ``openai_error_middleware`` puts every
error answered on a ``/v1/`` path in that shape, including the ones raised before a route runs:
401 from authentication, 413 / 408 / 503 from the body guard, aiohttp's own 404 and 405.
"""

from __future__ import annotations

import logging
import re

from aiohttp import web

log = logging.getLogger("mstar_ros.webrtc")

V1 = "/v1/"
# headers an error keeps when it is rewritten: the auth scheme (401) and the methods a route takes (405)
KEPT_HEADERS = ("WWW-Authenticate", "Allow", "Retry-After")


class APIError(Exception):
    """A refused request: answered as OpenAI's error object with this status."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None, type: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or error_type(status)


def error_type(status: int) -> str:
    """OpenAI's ``type`` for a status: a refused request (a bad key too) is ``invalid_request_error``."""
    return "server_error" if status >= 500 else "invalid_request_error"


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None, type: str | None = None
) -> dict:
    return {"error": {"message": message, "type": type or error_type(status), "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    return web.json_response(error_body(status, message, param=param, code=code), status=status, headers=headers)


def api_error_response(exc: APIError) -> web.Response:
    return web.json_response(
        error_body(exc.status, exc.message, param=exc.param, code=exc.code, type=exc.type), status=exc.status
    )


_AT = re.compile(r"at `\$\.([A-Za-z0-9_.\[\]]+)`")
_NAMED = re.compile(r"(?:unknown|missing required) field `([^`]+)`")


def param_of(message: str) -> str | None:
    """The field a msgspec validation message names (``... - at `$.input``` -> ``input``; ``Object
    contains unknown field `x``` -> ``x``), if any."""
    found = _AT.search(message)
    named = _NAMED.search(message)
    if named:
        return f"{found.group(1)}.{named.group(1)}" if found else named.group(1)
    return found.group(1) if found else None


def check_range(param: str, value: float, lo: float | None = None, hi: float | None = None) -> None:
    """An APIError (400) when ``value`` is outside [lo, hi], worded and coded as OpenAI's range errors."""
    kind = "integer" if isinstance(value, int) else "decimal"
    for bound, word, sign, code, bad in (
        (lo, "below minimum", ">=", "below_min", lo is not None and value < lo),
        (hi, "above maximum", "<=", "above_max", hi is not None and value > hi),
    ):
        if bad:
            raise APIError(
                400,
                f"Invalid '{param}': {kind} {word} value. Expected a value {sign} {bound:g}, but got "
                f"{value:g} instead.",
                param=param,
                code=f"{kind}_{code}_value",
            )


def _code_of(exc: web.HTTPException) -> str | None:
    return {401: "invalid_api_key", 404: "unknown_url", 405: "method_not_allowed", 413: "request_too_large"}.get(
        exc.status
    )


def _message_of(request: web.Request, exc: web.HTTPException) -> str:
    if exc.status == 404:
        return f"Invalid URL ({request.method} {request.path}): no such route"
    if exc.status == 405:
        allowed = ", ".join(sorted(getattr(exc, "allowed_methods", ()) or ()))
        return f"{request.method} is not allowed on {request.path} (allowed: {allowed or 'none'})"
    text = exc.text or exc.reason
    return text.removeprefix(f"{exc.status}: ")


@web.middleware
async def openai_error_middleware(request: web.Request, handler):
    """On ``/v1/`` paths: HTTP errors raised by any later middleware or route, and ``APIError``, as
    OpenAI's error JSON; an unexpected exception a logged 500 in that shape. Other paths: untouched."""
    if not request.path.startswith(V1):
        return await handler(request)
    try:
        return await handler(request)
    except APIError as exc:
        return api_error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:  # redirects and the like pass as they are
            raise
        headers = {k: exc.headers[k] for k in KEPT_HEADERS if k in exc.headers}
        return error_response(exc.status, _message_of(request, exc), code=_code_of(exc), headers=headers)
    except Exception as exc:  # a bug: the client still gets the shape it parses, the log gets the traceback
        log.exception("%s %s failed", request.method, request.path)
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")
