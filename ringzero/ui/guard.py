"""Who may use ``ringzero ui``, checked before any page or action runs.

- **A token.** The server prints ``http://HOST:PORT/?token=...`` at start. A request whose
  ``token`` query parameter is right gets an ``HttpOnly``, ``SameSite=Strict`` cookie and is sent
  on to the same address without it; every other request needs that cookie or ``Authorization:
  Bearer <token>``, or is answered 401. Compared in constant time.
- **Host.** The ``Host`` header must name the address the server listens on (or, on loopback,
  ``localhost``/``127.0.0.1``/``[::1]`` with its port): a DNS-rebinding page gets 421. Bound to
  every address (``--host 0.0.0.0``), any name is taken: the token is then the only guard.
- **Actions** are POSTs. One authorized by the cookie (a browser's) must come from the page's own
  origin (``Origin``, else ``Referer``) and carry the CSRF token its form holds; a cross-origin
  POST is refused with 403 before it is read. One authorized by the ``Authorization`` header (a
  script's: a browser never sends it by itself) needs neither.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlsplit

from starlette.datastructures import URL
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["BEARER", "COOKIE", "Guard", "csrf_token"]

COOKIE = "ringzero_ui"
BEARER = "ringzero_bearer"
"""The request state's key that says its token came in ``Authorization`` (no CSRF token asked)."""
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def csrf_token(token: str) -> str:
    """The CSRF token the pages' forms carry: derived from the server's token, never the token."""
    return hmac.new(token.encode(), b"ringzero-ui-csrf", hashlib.sha256).hexdigest()


class Guard:
    """ASGI middleware: the checks of the module's docstring, in that order."""

    def __init__(self, app: ASGIApp, *, token: str, host: str, port: int) -> None:
        self.app = app
        self.token = token
        self.csrf = csrf_token(token)
        names = LOOPBACK_NAMES if host in ("127.0.0.1", "::1", "localhost") else (host,)
        self.hosts: set[str] | None = {f"{name}:{port}" for name in names} | ({*names} if port == 80 else set())
        if host in ("0.0.0.0", "::"):  # every address of the machine: its names are the network's to give
            self.hosts = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        refused = self._refusal(request)
        if refused is not None:
            await refused(scope, receive, send)
            return
        scope.setdefault("state", {})[BEARER] = self._by_header(request)
        given = request.query_params.get("token")
        if given is not None:  # the printed address: a cookie, and the same page without the token
            clean = URL(scope=scope).remove_query_params("token")
            here = "/" + clean.path.lstrip("/") + (f"?{clean.query}" if clean.query else "")  # never //elsewhere
            response: Response = RedirectResponse(here, status_code=303)
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict", path="/")
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, request: Request) -> Response | None:
        if self.hosts is not None and request.headers.get("host", "") not in self.hosts:
            return PlainTextResponse("this server answers only at the address it listens on", status_code=421)
        by_header = self._by_header(request)
        given = request.query_params.get("token")
        if not (by_header or _same(request.cookies.get(COOKIE, ""), self.token)
                or (given is not None and _same(given, self.token) and request.method == "GET")):
            return PlainTextResponse("a token is needed: open the address `ringzero ui` printed", status_code=401,
                                     headers={"WWW-Authenticate": "Bearer"})
        if request.method not in ("GET", "HEAD") and not by_header:
            origin = request.headers.get("origin") or _origin_of(request.headers.get("referer", ""))
            if origin != f"{request.url.scheme}://{request.headers['host']}":
                return PlainTextResponse("an action must come from this server's own pages", status_code=403)
        return None


    def _by_header(self, request: Request) -> bool:
        """Whether ``Authorization: Bearer`` carries the token (a script's request, never a
        browser's by itself)."""
        bearer = request.headers.get("authorization", "")
        return bearer.startswith("Bearer ") and _same(bearer[len("Bearer "):], self.token)


def _same(given: str, token: str) -> bool:
    return hmac.compare_digest(given.encode(), token.encode())


def _origin_of(url: str) -> str | None:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else None
