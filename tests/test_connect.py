"""Pure units: store URLs of every form become the client they name (no server is contacted here)."""

from __future__ import annotations

import pytest
import redis

from delay_broker import ConfigurationError, DelayStore, Envelope
from delay_broker.connect import client_from_url, describe
from delay_broker.embedded import EmbeddedRedis


def test_a_sentinel_url_names_the_master_its_database_and_credentials() -> None:
    client = client_from_url(
        "redis+sentinel://app:s%40cret@10.0.0.1:26379,[::1]:26380,sentinel-c/orders/3"
        "?sentinel_password=sp&socket_timeout=4&client_name=a%2Bb"
    )
    pool = client.connection_pool
    assert isinstance(client, redis.Redis) and describe(client) == "Sentinel service 'orders'"
    assert pool.service_name == "orders"  # type: ignore[attr-defined]
    kwargs = pool.connection_kwargs
    assert (kwargs["db"], kwargs["username"], kwargs["password"]) == (3, "app", "s@cret")
    assert kwargs["socket_timeout"] == 4.0 and kwargs["client_name"] == "a+b"
    sentinels = pool.sentinel_manager.sentinels  # type: ignore[attr-defined]
    addresses = [
        (s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"]) for s in sentinels
    ]
    assert addresses == [("10.0.0.1", 26379), ("::1", 26380), ("sentinel-c", 26379)]
    assert sentinels[0].connection_pool.connection_kwargs["password"] == "sp"
    # Sentinels are asked without health checks: a refused check PING is retried with backoff, for minutes.
    assert sentinels[0].connection_pool.connection_kwargs.get("health_check_interval", 0) == 0


def test_a_sentinel_url_takes_its_database_as_a_redis_url_does() -> None:
    assert client_from_url("redis+sentinel://h:26379/m?db=3").connection_pool.connection_kwargs["db"] == 3
    assert client_from_url("redis+sentinel://h:26379/m/3?db=3").connection_pool.connection_kwargs["db"] == 3
    with pytest.raises(ConfigurationError, match="two databases"):
        client_from_url("redis+sentinel://h:26379/m/2?db=3")


def test_no_master_found_names_each_sentinel_by_its_address_and_asks_for_its_password() -> None:
    from redis.sentinel import MasterNotFoundError

    from delay_broker.redis_errors import translate

    sentinel = redis.Redis(host="10.0.0.7", port=26380, health_check_interval=30)
    error = MasterNotFoundError(f"No master found for 'm' : {sentinel} - AuthenticationError('auth')")
    text = str(translate(error, "parking"))
    assert "Sentinel 10.0.0.7:26380 - AuthenticationError" in text and "sentinel_password" in text
    assert len(text) < 300


def test_tls_sentinel_urls_use_tls_for_the_data_nodes() -> None:
    client = client_from_url("rediss+sentinel://h:26379/mymaster?ssl_cert_reqs=none")
    assert client.connection_pool.connection_kwargs.get("ssl_cert_reqs") == "none"
    assert client.connection_pool.connection_kwargs["db"] == 0


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+sentinel://h:26379", "names the master as its path"),
        ("redis+sentinel://h:26379/a/1/2", "names the master as its path"),
        ("redis+cluster://h:7000/2", "database 0 only"),
        ("redis+cluster://h:7000?db=3", "database 0 only"),
        ("redis+sentinel://h:port/m", "bad port"),
        ("memcached://h:11211", "unsupported Redis URL"),
        ("redis+sentinel://u:secret@h:x/m", "bad port"),
        ("redis+sentinel://h:26379/m?db=x", "must be a number"),
    ],
)
def test_bad_urls_are_refused_with_a_reason_and_no_password(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as raised:
        DelayStore.from_url(url)
    assert "secret" not in str(raised.value)


def test_store_options_configure_the_store_and_the_rest_the_client() -> None:
    store = DelayStore.from_url("redis://localhost:1/0", namespace="n", shards=4, replicas=1, socket_timeout=2)
    assert store.keys.namespace == "n" and store.replicas == 1
    assert store.client.connection_pool.connection_kwargs["socket_timeout"] == 2
    with pytest.raises(ConfigurationError, match=r"shards must be 1\.\.1024"):
        DelayStore.from_url("redis://localhost:1/0", shards=0)
    with pytest.raises(ConfigurationError, match="replicas"):
        DelayStore.from_url("redis://localhost:1/0", replicas=-1)


def test_a_unix_socket_url_reaches_the_store(tmp_path) -> None:
    socket_path = tmp_path / "redis.sock"
    with EmbeddedRedis(["--unixsocket", str(socket_path), "--unixsocketperm", "700"]) as server:
        store = DelayStore.from_url(f"unix://{socket_path}?db=0", namespace="over-a-socket")
        store.park("job", Envelope(route="ready", payload=b"x"), delay=60)
        assert store.get("job") is not None and store.stats().parked == 1
        assert server.client().exists(store.keys.due)


def test_a_server_that_wants_a_password_the_url_lacks_says_where_it_goes() -> None:
    from delay_broker import DelayStore, StoreUnavailable
    from delay_broker.embedded import EmbeddedRedis
    from delay_broker.redis_errors import translate

    with EmbeddedRedis() as server:
        server.client().config_set("requirepass", "secret")
        with pytest.raises(StoreUnavailable, match=r"wants a password: put it in the URL, redis://:PASSWORD@"):
            DelayStore.from_url(server.url, namespace="pw").stats()
        assert DelayStore.from_url(f"redis://:secret@127.0.0.1:{server.port}/0", namespace="pw").stats().parked == 0
    # Through Sentinel, redis-py 5+ reports only that HELLO needs an authenticated client.
    hello = redis.AuthenticationError("HELLO must be called with the client already authenticated, otherwise ...")
    assert "redis+sentinel://:PASSWORD@" in str(translate(hello, "parking"))
