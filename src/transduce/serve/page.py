"""``GET /``: a page to try a model in a browser (``page.html``, shipped with the package). One
static HTML file with plain JavaScript over the JSON API (``/health``, ``/translate`` with
``nbest`` and ``scores``, ``/attention``); no external assets, since the server may have no
internet. With ``--api-key-file`` the page itself is open (it holds no secret) and has a field
for the key, sent as ``Authorization: Bearer``; the page keeps it in the tab's session storage.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

__all__ = ["add_page", "page_html"]


@cache
def page_html() -> str:
    """The page's HTML, read once from the package."""
    return files("transduce.serve").joinpath("page.html").read_text(encoding="utf-8")


def add_page(app: FastAPI) -> None:
    """``GET /`` on ``app``: the page (not in the OpenAPI description: it is no API)."""

    @app.get("/", include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(page_html(), headers={"Cache-Control": "no-cache"})
