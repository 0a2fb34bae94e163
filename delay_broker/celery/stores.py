"""The delay store of a Celery app: which Redis, which namespace, and the small records the adapter adds.

The store lives in ``redis_url`` when given, else (Redis transport only) in the broker's own Redis, reached
with the host, port, database and credentials kombu parsed from ``broker_url``. Stores are shared per
process: a worker creates half a dozen kombu connections, and all of them park through one client.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import redis

from ..errors import ConfigurationError
from ..store import CLIENT_DEFAULTS, DelayStore
from .config import CeleryOptions, Kind


@dataclass(frozen=True)
class RedisAddress:
    """Where a Redis is: enough to tell whether two URLs name the same server and database."""

    host: str
    port: int
    db: int
    path: str | None = None


def address_of_url(url: str) -> RedisAddress:
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return RedisAddress("", 0, int(dict(_query(parts.query)).get("db", "0")), parts.path)
    db = parts.path.strip("/") or dict(_query(parts.query)).get("db", "0")
    return RedisAddress(parts.hostname or "localhost", parts.port or 6379, int(db))


def _query(query: str) -> list[tuple[str, str]]:
    from urllib.parse import parse_qsl

    return parse_qsl(query)


def _db_of_vhost(vhost: object) -> int:
    """kombu's reading of the virtual host as the Redis database (``Channel._prepare_virtual_host``)."""
    if vhost in (None, "", "/"):
        return 0
    text = str(vhost).strip("/")
    if not text.isdigit():
        raise ConfigurationError(f"the Redis database in broker_url must be a number, got {vhost!r}")
    return int(text)


def broker_address(conninfo: Any) -> RedisAddress:
    """The broker Redis of a kombu Connection (URL already parsed by kombu)."""
    host = conninfo.hostname or "127.0.0.1"
    if "://" in host:  # socket:// URLs keep the whole URL as the host
        parts = urlsplit(host)
        return RedisAddress("", 0, _db_of_vhost(conninfo.virtual_host), parts.path)
    return RedisAddress(host, int(conninfo.port or 6379), _db_of_vhost(conninfo.virtual_host))


def broker_client(conninfo: Any) -> redis.Redis:
    """A client of the broker's Redis with the credentials and TLS settings kombu would use."""
    address = broker_address(conninfo)
    if address.path is not None:
        return redis.Redis(unix_socket_path=address.path, db=address.db, password=conninfo.password)
    ssl_options: dict[str, Any] = {}
    if conninfo.ssl:
        ssl_options["ssl"] = True
        if isinstance(conninfo.ssl, Mapping):
            ssl_options.update(conninfo.ssl)
    return redis.Redis(
        host=address.host,
        port=address.port,
        db=address.db,
        username=conninfo.userid or None,
        password=conninfo.password or None,
        **CLIENT_DEFAULTS,
        **ssl_options,
    )


def store_client(options: CeleryOptions, kind: Kind, conninfo: Any) -> redis.Redis:
    """The client of the store's Redis; ConfigurationError if there is none."""
    if options.redis_url is not None:
        return redis.Redis.from_url(options.redis_url, **CLIENT_DEFAULTS)
    if kind != "redis":
        raise ConfigurationError(
            f"delay_broker needs a 'redis_url' option with the {kind} transport: the delay store lives in Redis"
        )
    return broker_client(conninfo)


def same_redis(options: CeleryOptions, kind: Kind, conninfo: Any) -> bool:
    """Whether the store shares the broker's Redis (then promotion can be one atomic script)."""
    if kind != "redis":
        return False
    if options.redis_url is None:
        return True
    return address_of_url(options.redis_url) == broker_address(conninfo)


_shared: dict[tuple[Any, ...], DelayStore] = {}
_shared_lock = threading.Lock()


def shared_store(options: CeleryOptions, kind: Kind, conninfo: Any) -> DelayStore:
    """One store (and client) per Redis, namespace and credentials in this process."""
    if options.redis_url is not None:
        identity: tuple[Any, ...] = ("url", options.redis_url)
    else:
        identity = ("broker", broker_address(conninfo), conninfo.userid, conninfo.password, repr(conninfo.ssl))
    key = (*identity, options.namespace, options.max_attempts)
    with _shared_lock:
        store = _shared.get(key)
        if store is None:
            client = store_client(options, kind, conninfo)
            store = _shared[key] = DelayStore(client, namespace=options.namespace, max_attempts=options.max_attempts)
        return store


class RouteBook:
    """The routes (queues) producers of this app parked for, kept by the store.

    A promoter delivers only to routes the app declared in its configuration or recorded here by a
    producer when it parked, so a stored envelope alone cannot send a message anywhere else.
    """

    def __init__(self, store: DelayStore) -> None:
        self.store = store
        self._recorded: set[str] = set()

    def record(self, route: str) -> None:
        if route not in self._recorded:
            self.store.record_routes([route])
            self._recorded.add(route)

    def routes(self) -> set[str]:
        return self.store.recorded_routes()
