"""What ``delay-broker web`` serves: the dashboard behind a Host allow-list and, when credentials are given,
authentication; on a socket bound before the URL is printed. The policy on what may be exposed lives here too."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Iterable

from starlette.types import ASGIApp

from ..store import DelayStore
from .app import create_app
from .auth import Credentials, require_auth
from .secret import Secret
from .security import AllowedHosts, HostCheck, SecurityHeaders


def standalone_app(
    store: DelayStore,
    *,
    read_only: bool,
    secret: Secret,
    credentials: Credentials,
    allowed_hosts: AllowedHosts,
    trusted_origins: Iterable[str] = (),
) -> ASGIApp:
    """The dashboard as ``delay-broker web`` serves it. The Host check comes first (a rebound name gets nothing,
    not even a login prompt), then authentication, then the dashboard; every answer carries the security
    headers, refusals included."""
    app: ASGIApp = create_app(store, read_only=read_only, secret=secret, trusted_origins=trusted_origins)
    if credentials.required:
        app = require_auth(app, credentials)
    return SecurityHeaders(HostCheck(app, allowed_hosts))


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return None


def is_wildcard(host: str) -> bool:
    """Whether binding ``host`` listens on every interface (0.0.0.0, ::)."""
    address = _address(host)
    return address is not None and address.is_unspecified


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is reachable from this machine alone: a loopback address, or a
    name all of whose addresses are loopback ones."""
    name = host.strip().lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    address = _address(name)
    if address is not None:
        return address.is_loopback
    try:
        found = {info[4][0] for info in socket.getaddrinfo(name, None)}
    except OSError:
        return False
    addresses = [_address(str(each)) for each in found]
    return bool(addresses) and all(address is not None and address.is_loopback for address in addresses)


def default_hosts(host: str, port: int) -> list[str]:
    """The Host values a server bound to ``host:port`` answers to unless told more: the bound address and port;
    for a loopback or wildcard bind also 127.0.0.1, localhost and [::1]; for a wildcard bind also this machine's
    name and its addresses."""
    names = [host]
    if is_loopback(host) or is_wildcard(host):
        names += ["127.0.0.1", "localhost", "::1"]
    if is_wildcard(host):
        names += [socket.gethostname(), socket.getfqdn()]
        # A machine whose own name does not resolve: its addresses are added with --allowed-host.
        with contextlib.suppress(OSError):
            names += [str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None)]
    chosen = [name for name in names if name and not is_wildcard(name)]
    return list(dict.fromkeys(f"{_bracketed(name.lower())}:{port}" for name in chosen))


def display_host(host: str) -> str:
    """The host part of the URL to print for a server bound to ``host``."""
    if is_wildcard(host):
        return "[::1]" if ":" in host else "127.0.0.1"
    return _bracketed(host)


def _bracketed(name: str) -> str:
    return f"[{name.strip('[]')}]" if ":" in name else name


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one); OSError when it cannot be had."""
    family, kind, protocol, _, address = socket.getaddrinfo(
        host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    listener = socket.socket(family, kind, protocol)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(2048)
    except OSError:
        listener.close()
        raise
    return listener
