"""Redis clients from URLs: one server, a Sentinel-managed master, or a Redis Cluster.

Store URLs are redis-py's (``redis://``, ``rediss://``, ``unix://``) plus two forms of ours, so every place a
store URL is given (``DelayStore.from_url``, ``DelayMiddleware(redis_url=...)``, the Celery ``redis_url``
option, ``delay-broker --redis-url``) reaches Sentinel and Cluster too:

- ``redis+sentinel://[user:password@]host:26379[,host2:26379...]/service_name[/db][?options]``: the master
  that the Sentinels name ``service_name``, followed across failovers. ``user``/``password`` are the data
  nodes'; Sentinels that need their own give ``sentinel_username=`` / ``sentinel_password=``.
  ``rediss+sentinel://`` uses TLS for both.
- ``redis+cluster://[user:password@]host:port[,host2:port...][?options]``: a Redis Cluster, found from any
  of the nodes given. ``rediss+cluster://`` uses TLS.

Query options are redis-py's own (``socket_timeout``, ``ssl_ca_certs``, ``health_check_interval`` ...),
parsed by redis-py.
"""

from __future__ import annotations

import logging
from typing import Any, cast
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import parse_url
from redis.exceptions import RedisClusterException
from redis.sentinel import Sentinel

from .errors import ConfigurationError, StoreUnavailable

logger = logging.getLogger("delay_broker.connect")

AnyRedis = redis.Redis | RedisCluster
"""A client the store works with: one server (or a Sentinel-managed master) or a Redis Cluster."""

CLIENT_DEFAULTS: dict[str, Any] = {
    "socket_connect_timeout": 5.0,
    "socket_timeout": 30.0,
    "socket_keepalive": True,
    "health_check_interval": 30,
}
"""Client settings for stores made from a URL: fail fast when Redis is unreachable, notice dead peers."""

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password")


def client_from_url(url: str, **options: Any) -> AnyRedis:
    """A client for a store URL; ``options`` go to the client (what the URL says wins, as in redis-py)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    settings = {**CLIENT_DEFAULTS, **options}
    if scheme in SENTINEL_SCHEMES:
        return _sentinel_client(url, settings)
    if scheme in CLUSTER_SCHEMES:
        return _cluster_client(url, settings)
    if scheme in ("redis", "rediss", "unix"):
        return redis.Redis.from_url(url, **settings)
    raise ConfigurationError(
        f"unsupported Redis URL {_redacted(url)!r}: use redis://, rediss://, unix://, redis+sentinel:// or "
        "redis+cluster://"
    )


def is_cluster(client: object) -> bool:
    return isinstance(client, RedisCluster)


def describe(client: AnyRedis) -> str:
    """Where a client points, for log lines (no credentials)."""
    if isinstance(client, RedisCluster):
        nodes = client.get_primaries()  # type: ignore[no-untyped-call]
        return "Redis Cluster (" + ", ".join(f"{node.host}:{node.port}" for node in nodes) + ")"
    pool = client.connection_pool
    service = getattr(pool, "service_name", None)
    if service is not None:
        return f"Sentinel service {service!r}"
    kwargs = pool.connection_kwargs
    if "path" in kwargs:
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def master_address(client: AnyRedis) -> tuple[str, int] | None:
    """The current master of a Sentinel-managed client (asked of the Sentinels), else None."""
    pool = getattr(client, "connection_pool", None)
    if pool is None or not hasattr(pool, "get_master_address"):
        return None
    address: tuple[str, int] = pool.get_master_address()
    return address


def _hosts(netloc: str, url: str, default_port: int) -> tuple[str | None, str | None, list[tuple[str, int]]]:
    credentials, _, hosts = netloc.rpartition("@")
    username = password = None
    if credentials:
        user, has_password, secret = credentials.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if has_password else None
    found = []
    for item in hosts.split(","):
        item = item.strip()
        if item.startswith("["):  # an IPv6 address: [::1] or [::1]:26379
            host, _, rest = item[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            host, _, port = item.rpartition(":") if ":" in item else (item, "", "")
        if not host:
            raise ConfigurationError(f"no host in Redis URL {_redacted(url)!r}")
        try:
            found.append((host, int(port) if port else default_port))
        except ValueError:
            raise ConfigurationError(f"bad port {port!r} in Redis URL {_redacted(url)!r}") from None
    return username, password, found


def _query_options(query: str, tls: bool) -> dict[str, Any]:
    """redis-py's own parsing of URL query options (types, ``ssl_cert_reqs`` ...)."""
    pairs = [(key, value) for key, value in parse_qsl(query) if key not in SENTINEL_OPTIONS]
    encoded = urlencode(pairs)
    parsed = cast(dict[str, Any], parse_url(("rediss" if tls else "redis") + "://localhost/?" + encoded))  # type: ignore[no-untyped-call]
    for key in ("host", "port", "db", "connection_class"):
        parsed.pop(key, None)
    if tls:
        parsed["ssl"] = True
    return parsed


def _sentinel_client(url: str, settings: dict[str, Any]) -> redis.Redis:
    parts = urlsplit(url)
    tls = parts.scheme.lower().startswith("rediss")
    username, password, sentinels = _hosts(parts.netloc, url, 26379)
    path = [piece for piece in parts.path.split("/") if piece]
    if not path or len(path) > 2:
        raise ConfigurationError(
            f"a Sentinel URL names the master as its path, e.g. redis+sentinel://host:26379/mymaster/0; got "
            f"{_redacted(url)!r}"
        )
    service, db = unquote(path[0]), int(path[1]) if len(path) == 2 else 0
    query = dict(parse_qsl(parts.query))
    node_options = {**settings, **_query_options(parts.query, tls), "db": db}
    if username is not None:
        node_options["username"] = username
    if password is not None:
        node_options["password"] = password
    sentinel_options = {
        key: value
        for key, value in node_options.items()
        if key.startswith(("socket_", "ssl")) or key in ("health_check_interval", "retry_on_timeout")
    }
    if "sentinel_username" in query:
        sentinel_options["username"] = query["sentinel_username"]
    if "sentinel_password" in query:
        sentinel_options["password"] = query["sentinel_password"]
    sentinel = Sentinel(sentinels, sentinel_kwargs=sentinel_options, **node_options)  # type: ignore[no-untyped-call]
    return cast(redis.Redis, sentinel.master_for(service, redis_class=redis.Redis))  # type: ignore[no-untyped-call]


def _cluster_client(url: str, settings: dict[str, Any]) -> RedisCluster:
    parts = urlsplit(url)
    tls = parts.scheme.lower().startswith("rediss")
    username, password, nodes = _hosts(parts.netloc, url, 6379)
    if parts.path.strip("/") not in ("", "0"):
        raise ConfigurationError(f"a Redis Cluster has database 0 only, got {_redacted(url)!r}")
    options = {**settings, **_query_options(parts.query, tls)}
    options.pop("db", None)
    if username is not None:
        options["username"] = username
    if password is not None:
        options["password"] = password
    startup = [ClusterNode(host, port) for host, port in nodes]  # type: ignore[no-untyped-call]
    try:
        # redis-py reads the cluster's slot map here, so an unreachable cluster fails now, not at first use.
        return RedisCluster(startup_nodes=startup, **options)
    except (redis.RedisError, RedisClusterException) as error:
        raise StoreUnavailable(f"Redis Cluster unreachable at {_redacted(url)}: {error}") from error


def _redacted(url: str) -> str:
    """A URL without its password, for error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return url.replace(f":{parts.password}@", ":***@", 1)
