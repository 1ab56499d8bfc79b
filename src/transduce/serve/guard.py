"""The translation server's guards below the request handlers: repeated slashes in a path
merged (``MergeSlashes``), the bearer-token check (``ApiKey``, ``RequireApiKey``), the deadline
on a request's headers (``guarded_h11``: uvicorn has none), and the process's open-file limit
(``raise_open_file_limit``, ``open_files_for``).

Imports uvicorn: import it only when serving.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import resource
from pathlib import Path
from typing import Any

import h11
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from transduce.errors import UserError

__all__ = [
    "ApiKey",
    "MergeSlashes",
    "RequireApiKey",
    "guarded_h11",
    "open_files_for",
    "raise_open_file_limit",
]

_SLASHES = re.compile(r"/{2,}")
_RAW_SLASHES = re.compile(rb"/{2,}")


class MergeSlashes:
    """ASGI middleware: a path's repeated slashes merged into one before anything routes it, as
    Werkzeug (LibreTranslate's server) merges them: clients that join a base URL ending in ``/``
    to ``/translate`` send ``//translate``. Outermost, so the key check sees the merged path."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and "//" in scope["path"]:
            scope = dict(scope)
            scope["path"] = _SLASHES.sub("/", scope["path"])
            if scope.get("raw_path"):
                scope["raw_path"] = _RAW_SLASHES.sub(b"/", scope["raw_path"])
        await self.app(scope, receive, send)


class ApiKey:
    """The one bearer token a server accepts, compared in constant time."""

    def __init__(self, token: str) -> None:
        if not token or not all(33 <= ord(c) <= 126 for c in token):
            raise ValueError("an API key must be non-empty printable ASCII without spaces")
        self._token = token.encode("ascii")

    @classmethod
    def from_file(cls, path: str | Path) -> ApiKey:
        """The token in ``path`` (surrounding whitespace stripped); UserError if the file cannot
        be read, is empty, or holds something that cannot be a token."""
        try:
            text = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise UserError(f"cannot read the API key file {path}: {reason}") from None
        if not text:
            raise UserError(f"the API key file {path} is empty")
        try:
            return cls(text)
        except ValueError as e:
            raise UserError(f"the API key file {path}: {e}") from None

    def accepts(self, authorization: bytes | None) -> bool:
        """Whether an ``Authorization`` header value is ``Bearer <the token>``."""
        if authorization is None:
            return False
        scheme, _, given = authorization.strip().partition(b" ")
        # the scheme is case-insensitive (RFC 7235); the token is compared in constant time
        return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self._token)

    def matches(self, token: str) -> bool:
        """Whether ``token`` (as a request body carries it) is the key, in constant time."""
        try:
            given = token.encode("ascii")
        except UnicodeEncodeError:
            return False
        return hmac.compare_digest(given, self._token)


def authorization_header(scope: Scope) -> bytes | None:
    """The raw value of a request's ``Authorization`` header, if any."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            return bytes(value)
    return None


class RequireApiKey:
    """ASGI middleware: a request to any path but ``open_paths`` (and those under
    ``open_prefixes``, which check a key of their own) without the bearer token gets 401 JSON
    with ``WWW-Authenticate: Bearer``, before its body is read (and the connection is closed, as
    the client may still be sending)."""

    def __init__(
        self,
        app: ASGIApp,
        key: ApiKey,
        open_paths: tuple[str, ...] = ("/health",),
        open_prefixes: tuple[str, ...] = (),
    ):
        self.app = app
        self.key = key
        self.open_paths = open_paths
        self.open_prefixes = open_prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] in self.open_paths
            or scope["path"].startswith(self.open_prefixes)
            or self.key.accepts(authorization_header(scope))
        ):
            await self.app(scope, receive, send)
            return
        response = JSONResponse(
            {"error": "missing or wrong API key (Authorization: Bearer TOKEN)", "status": 401},
            status_code=401,
            headers={"WWW-Authenticate": 'Bearer realm="transduce"', "Connection": "close"},
        )
        await response(scope, receive, send)


def guarded_h11(header_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with two more guards (pass it as ``uvicorn.Config(http=...)``):

    * a connection must send a request's headers within ``header_timeout_s`` of connecting, or
      of the previous answer, else it is closed: uvicorn's keep-alive timer restarts on every
      byte, so a client trickling its headers (or idling before its first request) would hold
      the connection forever;
    * at shutdown, a request still sending its body is dropped at once rather than waited for:
      the requests received are answered, an upload in progress is not."""

    class GuardedH11Protocol(H11Protocol):
        _header_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_header_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_header_deadline()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
            super().connection_lost(exc)

        def shutdown(self) -> None:
            uploading = self.cycle is not None and not self.cycle.response_complete
            if uploading and self.conn.their_state is h11.SEND_BODY:
                self.transport.close()
                return
            super().shutdown()

        def _arm_header_deadline(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
            self._header_deadline = self.loop.call_later(header_timeout_s, self._header_timeout)

        def _header_timeout(self) -> None:
            self._header_deadline = None
            # only between requests: a request being answered has the handler's own deadlines
            idle = self.cycle is None or self.cycle.response_complete
            if idle and not self.transport.is_closing():
                self.transport.close()

    return GuardedH11Protocol


def raise_open_file_limit(wanted: int) -> int:
    """Raise this process's soft limit on open files (sockets included) to ``wanted``, or as far
    as the hard limit allows; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def open_files_for(connections: int) -> None:
    """Raise the open-file limit so that ``connections`` sockets fit besides the model's files;
    warn (uvicorn's log) when the hard limit is lower."""
    wanted = connections + 256
    soft = raise_open_file_limit(wanted)
    if soft < wanted:
        logging.getLogger("uvicorn.error").warning(
            "the open-file limit is %d (hard limit), under the %d that max_connections %d "
            "needs: connections beyond it wait to be accepted",
            soft,
            wanted,
            connections,
        )
