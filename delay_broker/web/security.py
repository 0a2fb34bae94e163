"""What every dashboard response and request goes through: security headers, the Host allow-list (against DNS
rebinding) and the same-origin check of every POST (against cross-site and same-site forged forms)."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import ConfigurationError

CONTENT_POLICY = (
    "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'"
)
"""No script at all, nothing from another origin, never in a frame: the pages need none of it."""

HEADERS = {
    "content-security-policy": CONTENT_POLICY,
    "x-frame-options": "DENY",  # frame-ancestors for browsers that predate it
    "referrer-policy": "no-referrer",  # message ids and filters in URLs stay on the dashboard
    "x-content-type-options": "nosniff",
    "cross-origin-resource-policy": "same-origin",  # no other origin may load a page or file of it
}


class SecurityHeaders:
    """ASGI middleware: :data:`HEADERS` on every response (pages, files, errors, refusals), unless the response
    already sets one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, with_headers)


class AllowedHosts:
    """The ``Host`` header values a server answers to.

    Parameters:
      entries: ``name:port`` (that port only), ``name`` (any port: behind a proxy, the port the browser used is
        the proxy's), IPv6 addresses in brackets (``[::1]:8471``), or ``*`` for any host at all (which gives up
        the protection against DNS rebinding). ConfigurationError for a malformed entry.
    """

    def __init__(self, entries: Iterable[str]) -> None:
        self.entries = tuple(dict.fromkeys(entry.strip().lower() for entry in entries if entry.strip()))
        self.any = "*" in self.entries
        self._names: set[str] = set()
        self._pairs: set[tuple[str, int]] = set()
        for entry in self.entries:
            if entry == "*":
                continue
            try:
                name, port = split_host(entry)
            except ValueError:
                raise ConfigurationError(f"not a host name, host:port or [IPv6]:port: {entry!r}") from None
            if port is None:
                self._names.add(name)
            else:
                self._pairs.add((name, port))

    def allows(self, host: str) -> bool:
        """Whether a request's ``Host`` header is one of the entries."""
        if self.any:
            return True
        try:
            name, port = split_host(host)
        except ValueError:
            return False
        return name in self._names or (port is not None and (name, port) in self._pairs)

    def __str__(self) -> str:
        return ", ".join(self.entries)


def split_host(value: str) -> tuple[str, int | None]:
    """``(name, port)`` of ``name``, ``name:port``, ``[v6]`` or ``[v6]:port``, lower-cased (IPv6 without
    brackets); ValueError when it is none of them. A bare IPv6 address is taken whole, without a port."""
    value = value.strip().lower()
    if value.count(":") > 1 and not value.startswith("["):
        value = f"[{value}]"
    parts = urlsplit(f"//{value}")
    if not parts.hostname or parts.netloc != value or parts.username is not None or parts.password is not None:
        raise ValueError(value)
    return parts.hostname, parts.port  # .port raises ValueError for a port that is not 0-65535


class HostCheck:
    """ASGI middleware: a request whose ``Host`` is not allowed gets 421 (none at all: 400), before anything
    else runs. A page fetched through a name that was made to resolve to this server (DNS rebinding) so shows
    nothing, and no form token."""

    def __init__(self, app: ASGIApp, allowed: AllowedHosts) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = Headers(scope=scope).get("host")
            if host is None:
                await PlainTextResponse("A request without a Host header.", 400)(scope, receive, send)
                return
            if not self.allowed.allows(host):
                text = (
                    f"This dashboard does not answer to the host {host!r}. If that is its address, start it with "
                    "--allowed-host NAME (or DELAY_BROKER_WEB_ALLOWED_HOSTS)."
                )
                await PlainTextResponse(text, 421)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def trusted_origins(origins: Iterable[str]) -> frozenset[str]:
    """Origins (``https://name[:port]``) from which a POST is accepted besides the request's own, as given to
    :func:`delay_broker.web.create_app`; ConfigurationError for anything but an origin."""
    found = set()
    for origin in origins:
        try:
            parts = urlsplit(origin.strip().lower().rstrip("/"))
            if parts.scheme not in ("http", "https") or parts.path or parts.query or parts.fragment:
                raise ValueError(origin)
            found.add(_origin(parts.scheme, parts.netloc))
        except ValueError:
            raise ConfigurationError(f"not an origin (scheme://host[:port], nothing after): {origin!r}") from None
    return frozenset(found)


def origin_refusal(request: Request, trusted: frozenset[str] = frozenset()) -> str | None:
    """Why a POST is not from the dashboard's own pages, or None when it is (or when no browser says).

    Browsers say where a request comes from. ``Sec-Fetch-Site`` (every current browser) must be
    ``same-origin``: a page on another port of the same host is ``same-site``, another site ``cross-site``.
    A browser without it is judged by ``Origin``, which must be the request's own (its Host; https is taken for
    an http request, for a proxy that terminates TLS) or one of ``trusted``. ``Origin: null`` says nothing (the
    pages' own ``Referrer-Policy: no-referrer`` makes browsers send it for their forms), and a request with
    neither header comes from no browser, so cannot be forged by a page: both are left to the form token."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return None if site == "same-origin" else f"the browser says the form was sent from a {site} page"
    origin = request.headers.get("origin")
    if origin is None or origin.strip().lower() == "null":
        return None
    try:
        parts = urlsplit(origin.strip().lower())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return f"the form was sent from the origin {origin!r}"
        if _origin(parts.scheme, parts.netloc) in trusted:
            return None
        own = split_host(request.headers.get("host", ""))
        sender = split_host(parts.netloc)
    except ValueError:
        return f"the form was sent from the origin {origin!r}"
    scheme_fits = parts.scheme == request.url.scheme or parts.scheme == "https"
    if not scheme_fits or _explicit(own) != _explicit(sender):
        return f"the form was sent from {origin}, not from this dashboard's own pages"
    return None


def _explicit(host: tuple[str, int | None]) -> tuple[str, int | None]:
    # The port as browsers write an origin: none when it is the default one (also 80/443 after a TLS proxy).
    name, port = host
    return (name, None if port in (80, 443) else port)


def _origin(scheme: str, netloc: str) -> str:
    name, port = split_host(netloc)
    shown = f"[{name}]" if ":" in name else name
    default = 443 if scheme == "https" else 80
    return f"{scheme}://{shown}" + ("" if port in (None, default) else f":{port}")
