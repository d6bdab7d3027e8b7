"""The voice page's files (``static/``): ``/`` is its HTML, ``/static/NAME`` its script modules and style.

They are served as they are, with no build step, and without the token: they hold no secret (the page reads
the token from the URL fragment, ``#token=...``, and sends it with its own requests). Only the files found in
``static/`` are served, by exact name.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

STATIC = Path(__file__).with_name("static")
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
FILES: dict[str, str] = {p.name: _TYPES[p.suffix] for p in STATIC.iterdir() if p.suffix in _TYPES}
# what a request may fetch without the token: exact paths, so no spelling of another route matches
PUBLIC_PATHS: frozenset[str] = frozenset({"/", *(f"/static/{name}" for name in FILES)})


def _file(name: str) -> web.Response:
    # no-cache: a browser revalidates, so a page and its modules never come from two versions of the server
    return web.Response(
        text=(STATIC / name).read_text(), content_type=FILES[name], headers={"Cache-Control": "no-cache"}
    )


async def page(_request: web.Request) -> web.Response:
    return _file("index.html")


async def page_file(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in FILES:
        raise web.HTTPNotFound(text=f"no page file {name!r}")
    return _file(name)


def add_page_routes(app: web.Application) -> None:
    app.router.add_get("/", page)
    app.router.add_get("/static/{name}", page_file)
