"""OpenAI's error JSON on /v1/ paths, whatever raised the error; other paths left as they are."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import ClientSession, web

from mstar_ros.webrtc.openai_errors import APIError, check_range, openai_error_middleware, param_of


def test_param_of_names_the_field_msgspec_complains_about():
    assert param_of("Expected `str`, got `int` - at `$.input`") == "input"
    assert param_of("Object contains unknown field `mood` - at `$`") == "mood"
    assert param_of("Object missing required field `voice` - at `$.audio`") == "audio.voice"
    assert param_of("Expected `int`, got `str` - at `$.messages[0].content`") == "messages[0].content"
    assert param_of("not valid JSON") is None


def test_check_range_words_and_codes_as_openai():
    with pytest.raises(APIError) as caught:
        check_range("temperature", 2.5, 0, 2)
    assert (caught.value.status, caught.value.param, caught.value.code) == (
        400,
        "temperature",
        "decimal_above_max_value",
    )
    assert "Expected a value <= 2, but got 2.5 instead" in caught.value.message
    with pytest.raises(APIError) as caught:
        check_range("n", 0, 1)
    assert caught.value.code == "integer_below_min_value"
    check_range("top_p", 1.0, 0, 1)  # the bounds themselves pass


def test_errors_from_routes_middlewares_and_bugs_come_in_the_shape_and_the_server_serves_on():
    @web.middleware
    async def guard(request, handler):  # as the gateway's auth and body guard raise before a route runs
        if request.headers.get("X-Deny"):
            raise web.HTTPUnauthorized(text="a Bearer token is required", headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    async def refuse(_request):
        raise APIError(400, "no", param="field", code="invalid_value")

    async def bug(_request):
        raise KeyError("oops")

    async def fine(_request):
        return web.json_response({"ok": True})

    async def main():
        app = web.Application(middlewares=[openai_error_middleware, guard])
        app.router.add_post("/v1/refuse", refuse)
        app.router.add_get("/v1/bug", bug)
        app.router.add_get("/v1/fine", fine)
        app.router.add_get("/page", fine)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        got = {}
        try:
            async with ClientSession() as http:
                for name, method, path, headers in (
                    ("refuse", "POST", "/v1/refuse", {}),
                    ("bug", "GET", "/v1/bug", {}),
                    ("denied", "GET", "/v1/fine", {"X-Deny": "1"}),
                    ("missing", "GET", "/v1/nothing", {}),
                    ("method", "DELETE", "/v1/fine", {}),
                    ("fine", "GET", "/v1/fine", {}),
                ):
                    async with http.request(method, url + path, headers=headers) as r:
                        got[name] = (r.status, await r.json(), dict(r.headers))
                async with http.get(url + "/nothing") as r:  # not /v1/: aiohttp's own answer
                    got["other"] = (r.status, r.content_type)
        finally:
            await runner.cleanup()
        return got

    got = asyncio.run(main())
    keys = {"message", "type", "param", "code"}
    for name in ("refuse", "bug", "denied", "missing", "method"):
        assert set(got[name][1]["error"]) == keys, got[name]
    assert got["refuse"][:2] == (
        400,
        {"error": {"message": "no", "type": "invalid_request_error", "param": "field", "code": "invalid_value"}},
    )
    status, body, _ = got["bug"]
    assert status == 500 and body["error"]["type"] == "server_error" and "KeyError" in body["error"]["message"]
    status, body, headers = got["denied"]
    assert status == 401 and body["error"]["code"] == "invalid_api_key" and headers["WWW-Authenticate"] == "Bearer"
    assert got["missing"][0] == 404 and "GET /v1/nothing" in got["missing"][1]["error"]["message"]
    status, body, headers = got["method"]
    assert status == 405 and "allowed: GET" in body["error"]["message"] and "GET" in headers["Allow"]
    assert got["fine"][:2] == (200, {"ok": True}) and got["other"] == (404, "text/plain")
