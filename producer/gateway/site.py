"""The viewer (``GET /``): static HTML, JavaScript and CSS shipped in the package
(``producer/gateway/web/``), with no build step and nothing fetched from elsewhere.

The viewer is a client of the gateway's own API: it signs in with a token the person types
(kept in the browser's session storage, sent as the ``Authorization`` header), so it shows
exactly what that token may see. The files themselves need no token (they hold no data); they
are served under a Content-Security-Policy that allows only this origin's scripts, styles and
requests (no inline script, no ``eval``, no frames), so a model's output shown in a page can
never run as code even if it were put into the page as markup (the viewer writes every value
as text).
"""

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import Response
from starlette.exceptions import HTTPException

__all__ = ["BODIES", "HEADERS", "router"]

router = APIRouter(include_in_schema=False)

WEB = Path(__file__).with_name("web")
SCRIPTS = ("viewer.js", "api.js", "dom.js", "pages.js", "analysis.js", "charts.js")
FILES = {
    **dict.fromkeys(SCRIPTS, "text/javascript; charset=utf-8"),
    "viewer.css": "text/css; charset=utf-8",
}
"""The viewer's files besides ``index.html``, and their types."""
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}


BODIES = {name: (WEB / name).read_bytes() for name in ("index.html", *FILES)}
"""The files, read once: they ship in the package and do not change while it serves."""


@router.get("/")
def index() -> Response:
    """The viewer's page."""
    return Response(BODIES["index.html"], media_type="text/html; charset=utf-8", headers=HEADERS)


@router.get("/viewer/{name}")
def asset(name: str) -> Response:
    """One of the viewer's scripts or its style sheet."""
    kind = FILES.get(name)
    if kind is None:
        raise HTTPException(404, "Not Found")
    return Response(BODIES[name], media_type=kind, headers=HEADERS)
