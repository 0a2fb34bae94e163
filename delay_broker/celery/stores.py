"""The delay store of a Celery app: which Redis, which namespace, and the small records the adapter adds.

The store lives in ``redis_url`` when given (any URL :func:`delay_broker.connect.client_from_url` takes),
else in the broker's own Redis: on the Redis transport the server, database and credentials kombu parsed from
``broker_url``; on the Sentinel transport the master kombu asks the same Sentinels for (``master_name``,
``sentinel_kwargs``, credentials, database and TLS as kombu uses them), followed across failovers. Stores are
shared per process: a worker creates half a dozen kombu connections, and all of them park through one client.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import redis
from kombu.utils.url import url_to_parts
from redis.sentinel import Sentinel

from ..connect import CLIENT_DEFAULTS, CLUSTER_SCHEMES, SENTINEL_SCHEMES, AnyRedis, client_from_url, parse_sentinel_url
from ..errors import ConfigurationError
from ..store import DelayStore
from .config import CeleryOptions, Kind

SENTINEL_PORT = 26379
"""kombu's default port of a ``sentinel://`` URL (``SentinelTransport.default_port``)."""

REDIS_KINDS: tuple[Kind, ...] = ("redis", "sentinel")
"""Transports whose broker is a Redis, so the store can live in it and promote exactly once."""


@dataclass(frozen=True)
class RedisAddress:
    """Where a Redis is: enough to tell whether two URLs name the same server and database."""

    host: str
    port: int
    db: int
    path: str | None = None


@dataclass(frozen=True)
class SentinelAddress:
    """A master behind Sentinel: the same Sentinels, service and database name the same Redis."""

    sentinels: frozenset[tuple[str, int]]
    service: str
    db: int


Address = RedisAddress | SentinelAddress


def address_of_url(url: str) -> Address | None:
    """Where a store URL points; None for a Redis Cluster (never the broker's Redis)."""
    scheme = url.split("://", 1)[0].lower()
    if scheme in CLUSTER_SCHEMES:
        return None
    if scheme in SENTINEL_SCHEMES:
        target = parse_sentinel_url(url)
        return SentinelAddress(frozenset(target.sentinels), target.service, target.db)
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return RedisAddress("", 0, int(dict(parse_qsl(parts.query)).get("db", "0")), parts.path)
    database = parts.path.strip("/") or dict(parse_qsl(parts.query)).get("db", "0")
    return RedisAddress(parts.hostname or "localhost", parts.port or 6379, int(database))


def _db_of_vhost(vhost: object) -> int:
    """kombu's reading of the virtual host as the Redis database (``Channel._prepare_virtual_host``)."""
    if vhost in (None, "", "/"):
        return 0
    text = str(vhost).strip("/")
    if not text.isdigit():
        raise ConfigurationError(f"the Redis database in broker_url must be a number, got {vhost!r}")
    return int(text)


def broker_address(conninfo: Any) -> RedisAddress:
    """The broker Redis of a kombu Connection on the Redis transport (URL already parsed by kombu)."""
    host = conninfo.hostname or "127.0.0.1"
    if "://" in host:  # socket:// URLs keep the whole URL as the host
        parts = urlsplit(host)
        return RedisAddress("", 0, _db_of_vhost(conninfo.virtual_host), parts.path)
    return RedisAddress(host, int(conninfo.port or 6379), _db_of_vhost(conninfo.virtual_host))


def _transport_options(conninfo: Any) -> Mapping[str, Any]:
    return getattr(conninfo, "transport_options", None) or {}


def master_name(conninfo: Any) -> str:
    """The ``master_name`` transport option of a Sentinel broker, or a ConfigurationError."""
    name = _transport_options(conninfo).get("master_name")
    if not isinstance(name, str) or not name:
        raise ConfigurationError(
            "the sentinel:// broker needs the 'master_name' transport option (broker_transport_options="
            "{'master_name': 'mymaster', ...}), the name the Sentinels monitor the master under"
        )
    return name


def sentinels_of(conninfo: Any) -> list[tuple[str, int]]:
    """The Sentinels of a kombu Connection, as kombu's ``SentinelChannel._sentinel_managed_pool`` finds them:
    every ``sentinel://`` URL of a ``;``-separated ``broker_url``, else the connection's own host and port."""
    sentinels = []
    for url in getattr(conninfo, "alt", None) or ():
        parts = url_to_parts(url)
        if parts.scheme == "sentinel":
            sentinels.append((parts.hostname, parts.port or SENTINEL_PORT))
    if not sentinels:
        sentinels.append((conninfo.hostname or "127.0.0.1", int(conninfo.port or SENTINEL_PORT)))
    return sentinels


def sentinel_broker_address(conninfo: Any) -> SentinelAddress:
    """The master of a kombu Connection on the Sentinel transport."""
    return SentinelAddress(
        frozenset(sentinels_of(conninfo)), master_name(conninfo), _db_of_vhost(conninfo.virtual_host)
    )


def broker_address_of(kind: Kind, conninfo: Any) -> Address:
    return sentinel_broker_address(conninfo) if kind == "sentinel" else broker_address(conninfo)


def _ssl_options(conninfo: Any) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if conninfo.ssl:
        options["ssl"] = True
        if isinstance(conninfo.ssl, Mapping):
            options.update(conninfo.ssl)
    return options


def broker_client(conninfo: Any) -> redis.Redis:
    """A client of the broker's Redis with the credentials and TLS settings kombu would use."""
    address = broker_address(conninfo)
    if address.path is not None:
        return redis.Redis(unix_socket_path=address.path, db=address.db, password=conninfo.password)
    return redis.Redis(
        host=address.host,
        port=address.port,
        db=address.db,
        username=conninfo.userid or None,
        password=conninfo.password or None,
        **CLIENT_DEFAULTS,
        **_ssl_options(conninfo),
    )


def sentinel_broker_client(conninfo: Any) -> redis.Redis:
    """A client of the master kombu's Sentinel transport uses: the same Sentinels, ``master_name``,
    ``sentinel_kwargs``, ``min_other_sentinels``, credentials, database and TLS. It asks the Sentinels for
    the master when it connects, so it follows failovers as kombu's own connections do."""
    options = _transport_options(conninfo)
    name = master_name(conninfo)
    node_options: dict[str, Any] = {
        "db": _db_of_vhost(conninfo.virtual_host),
        "username": conninfo.userid or None,
        "password": conninfo.password or None,
        **CLIENT_DEFAULTS,
        **_ssl_options(conninfo),
    }
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        sentinels_of(conninfo),
        min_other_sentinels=int(options.get("min_other_sentinels") or 0),
        sentinel_kwargs=options.get("sentinel_kwargs"),
        **node_options,
    )
    client: redis.Redis = sentinel.master_for(name, redis_class=redis.Redis)  # type: ignore[no-untyped-call]
    return client


def check_store(options: CeleryOptions, kind: Kind, conninfo: Any) -> None:
    """Raise ConfigurationError if this configuration has no Redis for the store (connects to nothing)."""
    if kind == "sentinel":
        master_name(conninfo)  # kombu needs it too, and would only say so on the first connection
    if options.redis_url is None and kind not in REDIS_KINDS:
        raise ConfigurationError(
            f"delay_broker needs a 'redis_url' option with the {kind} transport: the delay store lives in Redis"
        )


def store_client(options: CeleryOptions, kind: Kind, conninfo: Any) -> AnyRedis:
    """The client of the store's Redis; ConfigurationError if there is none."""
    check_store(options, kind, conninfo)
    if options.redis_url is not None:
        return client_from_url(options.redis_url)
    if kind == "sentinel":
        return sentinel_broker_client(conninfo)
    return broker_client(conninfo)


def same_redis(options: CeleryOptions, kind: Kind, conninfo: Any) -> bool:
    """Whether the store shares the broker's Redis (then promotion can be one atomic script).

    With a ``redis_url`` that is so when it names the broker's server and database (Redis transport) or the
    same Sentinels, service and database (Sentinel transport, ``redis+sentinel://`` URL). A Redis Cluster
    store is never the broker's Redis.
    """
    if kind not in REDIS_KINDS:
        return False
    if options.redis_url is None:
        return True
    return address_of_url(options.redis_url) == broker_address_of(kind, conninfo)


_shared: dict[tuple[Any, ...], DelayStore] = {}
_shared_lock = threading.Lock()


def shared_store(options: CeleryOptions, kind: Kind, conninfo: Any) -> DelayStore:
    """One store (and client) per Redis, namespace and credentials in this process."""
    if options.redis_url is not None:
        identity: tuple[Any, ...] = ("url", options.redis_url)
    else:
        check_store(options, kind, conninfo)
        identity = (kind, broker_address_of(kind, conninfo), conninfo.userid, conninfo.password, repr(conninfo.ssl))
        if kind == "sentinel":
            transport_options = _transport_options(conninfo)
            identity += (
                repr(transport_options.get("sentinel_kwargs")),
                transport_options.get("min_other_sentinels"),
            )
    key = (*identity, *options.store_options().values())
    with _shared_lock:
        store = _shared.get(key)
        if store is None:
            client = store_client(options, kind, conninfo)
            store = _shared[key] = DelayStore(client, **options.store_options())
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
