"""The page's files over real HTTP: its modules and style are served by exact name, as JavaScript and CSS, and
without the token (they hold no secret), while every other route still wants it."""

from __future__ import annotations

import asyncio

from aiohttp import ClientSession

from mstar_ros.webrtc.page_files import FILES
from support.webrtc_gateway import gateway_for


def test_the_page_and_its_files_load_without_the_token_and_nothing_else_does(orpheus):
    async def main():
        async with gateway_for(orpheus, token="s3cret") as (_, _gateway, url):
            auth = {"Authorization": "Bearer s3cret"}
            async with ClientSession() as http:

                async def get(path: str, **kw):
                    async with http.get(url + path, **kw) as r:
                        return r.status, r.content_type, await r.text()

                page = await get("/")
                files = {name: await get(f"/static/{name}") for name in FILES if name != "index.html"}
                unknown = await get("/static/server.py"), await get("/static/server.py", headers=auth)
                # a spelling that leaves /static/ after the router's normalisation is no public path
                dotted = await get("/static/%2E%2E/v1/models")
                models = await get("/v1/models")
                with_token = await get("/v1/models", headers=auth)
                return page, files, unknown, dotted, models, with_token

    page, files, unknown, dotted, models, with_token = asyncio.run(main())
    assert page[:2] == (200, "text/html") and 'src="static/page.js"' in page[2]
    assert {"page.js", "page.css"} <= set(files)
    for name, (status, content_type, _) in files.items():
        assert status == 200 and content_type == ("text/css" if name.endswith(".css") else "text/javascript"), name
    assert (unknown[0][0], unknown[1][0]) == (401, 404)  # any other file is no page file, and not public
    assert dotted[0] in (401, 404)
    assert models[0] == 401 and with_token[0] == 200
