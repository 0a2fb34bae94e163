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
import re
from dataclasses import dataclass
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
    check_url(url)
    scheme = url.split("://", 1)[0].lower()
    settings = {**CLIENT_DEFAULTS, **options}
    if scheme in SENTINEL_SCHEMES:
        return _sentinel_client(url, settings)
    if scheme in CLUSTER_SCHEMES:
        return _cluster_client(url, settings)
    if scheme == "unix":
        # A Unix socket has no TCP keepalive: redis-py's socket connection refuses the option.
        settings.pop("socket_keepalive", None)
        settings.pop("socket_keepalive_options", None)
    return redis.Redis.from_url(url, **settings)


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


@dataclass(frozen=True)
class SentinelTarget:
    """What a ``redis+sentinel://`` URL names: its Sentinels, the master's service name and database."""

    sentinels: list[tuple[str, int]]
    service: str
    db: int


def _credentials(netloc: str) -> tuple[str | None, str | None]:
    credentials = netloc.rpartition("@")[0]
    if not credentials:
        return None, None
    user, has_password, secret = credentials.partition(":")
    return unquote(user) or None, unquote(secret) if has_password else None


def parse_hosts(url: str, default_port: int) -> list[tuple[str, int]]:
    """The ``host[:port]`` items of a multi-host URL (``[user:password@]h1:p1,[::1]:p2,h3``)."""
    found = []
    for item in urlsplit(url).netloc.rpartition("@")[2].split(","):
        item = item.strip()
        if item.startswith("["):  # an IPv6 address: [::1] or [::1]:26379
            host, _, rest = item[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            host, _, port = item.rpartition(":") if ":" in item else (item, "", "")
        if not host:
            raise ConfigurationError(f"no host in Redis URL {redacted(url)!r}")
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise ConfigurationError(f"bad port {port!r} in Redis URL {redacted(url)!r}")
        found.append((host, int(port) if port else default_port))
    return found


def parse_sentinel_url(url: str) -> SentinelTarget:
    """The parts of a ``redis+sentinel://`` URL, or a ConfigurationError saying what is wrong. The database is
    the path's second part or, as in a ``redis://`` URL, ``?db=N``."""
    path = [unquote(piece) for piece in urlsplit(url).path.split("/") if piece]
    if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ConfigurationError(
            f"a Sentinel URL names the master as its path, e.g. redis+sentinel://host:26379/mymaster/0; got "
            f"{redacted(url)!r}"
        )
    databases = {int(path[1])} if len(path) == 2 else set()
    in_query = dict(parse_qsl(urlsplit(url).query)).get("db")
    if in_query is not None:
        if not in_query.isdigit():
            raise ConfigurationError(f"the database must be a number, got {in_query!r} in {redacted(url)!r}")
        databases.add(int(in_query))
    if len(databases) > 1:
        raise ConfigurationError(f"two databases in {redacted(url)!r}: give one, in the path or as ?db=")
    return SentinelTarget(parse_hosts(url, 26379), path[0], databases.pop() if databases else 0)


def check_url(url: str) -> str:
    """A store URL of a form :func:`client_from_url` takes, checked without connecting; else ConfigurationError."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in SENTINEL_SCHEMES:
        parse_sentinel_url(url)
    elif scheme in CLUSTER_SCHEMES:
        parse_hosts(url, 6379)
        parts = urlsplit(url)
        databases = {parts.path.strip("/"), *(value for key, value in parse_qsl(parts.query) if key == "db")}
        if databases - {"", "0"}:
            raise ConfigurationError(f"a Redis Cluster has database 0 only, got {redacted(url)!r}")
    elif scheme in ("redis", "rediss", "unix"):
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 (raises ValueError for a bad port)
        except ValueError as error:
            raise ConfigurationError(f"not a valid Redis URL ({error}): {redacted(url)!r}") from None
        if scheme != "unix" and not parts.hostname:
            raise ConfigurationError(f"no host in Redis URL {redacted(url)!r}")
        database = parts.path.strip("/")
        if scheme != "unix" and database and not database.isdigit():
            raise ConfigurationError(f"the database must be a number, got {database!r} in {redacted(url)!r}")
    else:
        raise ConfigurationError(
            f"unsupported Redis URL {redacted(url)!r}: use redis://, rediss://, unix://, redis+sentinel:// or "
            "redis+cluster://"
        )
    return url


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


def _node_options(url: str, settings: dict[str, Any]) -> dict[str, Any]:
    """Options of the data nodes of a multi-host URL: defaults and ``settings``, its query, its credentials."""
    parts = urlsplit(url)
    options = {**settings, **_query_options(parts.query, parts.scheme.lower().startswith("rediss"))}
    username, password = _credentials(parts.netloc)
    if username is not None:
        options["username"] = username
    if password is not None:
        options["password"] = password
    return options


def _sentinel_client(url: str, settings: dict[str, Any]) -> redis.Redis:
    target = parse_sentinel_url(url)
    query = dict(parse_qsl(urlsplit(url).query))
    node_options = {**_node_options(url, settings), "db": target.db}
    # Not health_check_interval: a Sentinel that refuses a health-check PING (a password missing) is asked
    # again with backoff, which made one failed discovery take a minute and a half instead of seconds.
    sentinel_options = {
        key: value
        for key, value in node_options.items()
        if key.startswith(("socket_", "ssl")) or key == "retry_on_timeout"
    }
    if "sentinel_username" in query:
        sentinel_options["username"] = query["sentinel_username"]
    if "sentinel_password" in query:
        sentinel_options["password"] = query["sentinel_password"]
    sentinel = Sentinel(target.sentinels, sentinel_kwargs=sentinel_options, **node_options)  # type: ignore[no-untyped-call]
    return cast(redis.Redis, sentinel.master_for(target.service, redis_class=redis.Redis))  # type: ignore[no-untyped-call]


def _cluster_client(url: str, settings: dict[str, Any]) -> RedisCluster:
    options = _node_options(url, settings)
    options.pop("db", None)
    startup = [ClusterNode(host, port) for host, port in parse_hosts(url, 6379)]  # type: ignore[no-untyped-call]
    try:
        # redis-py reads the cluster's slot map here, so an unreachable cluster fails now, not at first use.
        return RedisCluster(startup_nodes=startup, **options)
    except (redis.RedisError, RedisClusterException) as error:
        raise StoreUnavailable(f"Redis Cluster unreachable at {redacted(url)}: {error}") from error


def redacted(url: str) -> str:
    """``url`` with its passwords (``user:PASSWORD@``, ``?password=``, ``?sentinel_password=``) as ``***``, for
    messages and logs."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # a malformed port: still mask what looks like a password
        password = None
    if password is not None:
        url = url.replace(f":{password}@", ":***@", 1)
    return _PASSWORD_QUERY.sub(r"\1***", url)


_PASSWORD_QUERY = re.compile(r"([?&](?:sentinel_)?password=)[^&#]*")
_redacted = redacted  # its earlier, private name (delay_broker.cli.web imports it)
