"""``resilient-flows dashboard``: the page served live from a run directory, read only.

Starlette answers three kinds of request: the page and its assets, the run's document
(``/api/run``) and one member's details (``/api/member/NAME``). The page polls ``/api/run`` every
two seconds with the generation it holds; the model is looked at again only when a poll comes and
at most once per :data:`LOOK_S` whoever polls, so a server nobody watches reads nothing, and many
open tabs cost one look.

Every request needs the token printed at start, on localhost too: a login node is shared, and
any of its users can reach its loopback address. The token comes as ``?token=`` in the printed URL,
which sets a cookie for the page's later requests (``HttpOnly``, ``SameSite=Strict``). A browser
sends a host's cookies to every port of it, whatever server listens there: so each server has a
random name, serves under ``/<name>/`` only and names its cookie ``rf_dashboard_<name>`` with that
path. Two dashboards on one host do not overwrite each other's cookie, and other servers there
are not sent it (unless asked for that path). Every response, errors included, carries the
security headers (:data:`SECURITY_HEADERS`).

What the pages show is read from the run directory through
:func:`~resilient_flows.capped.open_regular`: a symbolic link there, to a file outside the run or
inside it, is never followed, and so nothing outside the run is ever served.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from resilient_flows.errors import ResilientFlowsError
from resilient_flows.strictjson import strict
from resilient_flows.workflow.dashboard import DEFAULT_PORT
from resilient_flows.workflow.dashboard._model import RunModel
from resilient_flows.workflow.dashboard._page import asset_path, page_html

#: Seconds between two looks at the run directory, however many pages poll.
LOOK_S = 1.0
#: The start of the name of the cookie that carries the token after the first request; each
#: server adds its own name.
COOKIE_PREFIX = "rf_dashboard_"
#: What the page may load and run: its own scripts and data only; Plotly styles its elements inline.
CONTENT_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
#: Headers every response carries, a refusal or an error too: what the page may load, no sniffing
#: of types (a text answer is never run as a script), no referrer (the URL holds the token).
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


def _caching(path: str) -> str:
    """Plotly's bundle (megabytes, the same for a given plotly) is kept by the browser for a day;
    the page's own assets are checked again at each load; the data never kept."""
    if path == "/assets/plotly.min.js":
        return "private, max-age=86400"
    return "no-cache" if path.startswith("/assets/") else "no-store"


class _Looker:
    """Looks at the model at most once per :data:`LOOK_S`; one look at a time. The first look is
    the one made before the server listens, with the document built, so that a page's first
    request is answered at once."""

    def __init__(self, model: RunModel) -> None:
        self.model = model
        self._lock = threading.Lock()
        self._last = time.monotonic()

    def look(self) -> None:
        with self._lock:
            if time.monotonic() - self._last >= LOOK_S:
                self.model.update()
                self._last = time.monotonic()


class _Headed:
    """Adds :data:`SECURITY_HEADERS` and the caching rule to every response of ``app``: outside
    Starlette's own middleware, so that the 500 its outermost layer makes of an exception has
    them too, as have the 403 of a missing token and the 404 of an unknown path."""

    def __init__(self, app: ASGIApp, prefix: str) -> None:
        self.app = app
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        caching = _caching(scope["path"].removeprefix(self.prefix))

        async def headed(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.update({**SECURITY_HEADERS, "Cache-Control": caching})
            await send(message)

        await self.app(scope, receive, headed)


def server_name() -> str:
    """A new server's name: the path it serves under, and its cookie's name."""
    return secrets.token_hex(8)


def dashboard_app(model: RunModel, token: str, name: str) -> ASGIApp:
    """The application serving ``model``'s run under ``/<name>/`` to requests that carry ``token``."""
    looker = _Looker(model)
    prefix, cookie = f"/{name}", COOKIE_PREFIX + name

    async def page(request: Request) -> Response:
        response = Response(page_html(), media_type="text/html; charset=utf-8")
        if request.query_params.get("token"):
            response.set_cookie(cookie, token, path=prefix + "/", httponly=True, samesite="strict")
        return response

    async def asset(request: Request) -> Response:
        path = asset_path(request.path_params["name"])
        if path is None:
            return PlainTextResponse("no such asset", status_code=404)
        return FileResponse(path)

    async def run(request: Request) -> Response:
        await asyncio.to_thread(looker.look)
        since = request.query_params.get("since")
        if since is not None and since == str(model.generation):
            return JSONResponse({"version": 1, "generation": model.generation, "unchanged": True})
        document = await asyncio.to_thread(model.document)
        return JSONResponse(strict(document))

    async def member(request: Request) -> Response:
        details = await asyncio.to_thread(model.member, request.path_params["name"])
        if details is None:
            return JSONResponse({"error": "no such member"}, status_code=404)
        return JSONResponse(strict(details))

    class TokenCheck(BaseHTTPMiddleware):
        async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
            given = (
                request.query_params.get("token")
                or request.headers.get("x-rf-token")
                or request.cookies.get(cookie)
                or ""
            )
            if not hmac.compare_digest(given.encode(), token.encode()):
                return PlainTextResponse(
                    "this dashboard needs its token: open the URL that `resilient-flows dashboard` printed",
                    status_code=403,
                )
            return await call_next(request)

    routes = [
        Route("/", page),
        Route("/assets/{name}", asset),
        Route("/api/run", run),
        Route("/api/member/{name:path}", member),
    ]
    return _Headed(Starlette(routes=[Mount(prefix, routes=routes)], middleware=[Middleware(TokenCheck)]), prefix)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port`` (0: a free port); a port in use is one clear error."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise ResilientFlowsError(f"--host {host}: not an address of this machine ({exc.strerror})") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ResilientFlowsError(
            f"cannot listen on {host}:{port}: {exc.strerror} (choose another with --port; --port 0 takes a free one)"
        ) from None
    sock.listen(64)
    return sock


def serve_dashboard(
    run_dir: str | Path,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    token: str | None = None,
    ready: Callable[[str, int, str], None] | None = None,
) -> None:
    """Serve the dashboard of ``run_dir`` until interrupted. ``ready`` is told the host, the port
    (the one chosen for port 0) and the page's path with the token (``/<name>/?token=...``) once
    the socket listens; the token is a new random one unless given."""
    import uvicorn

    model = RunModel(run_dir)
    model.update()
    model.document()
    token = token or secrets.token_urlsafe(24)
    sock = bind(host, port)
    name = server_name()
    if ready is not None:
        ready(host, sock.getsockname()[1], f"/{name}/?token={token}")
    app = dashboard_app(model, token, name)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
