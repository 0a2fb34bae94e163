"""The delay store behind Redis Sentinel (1 master, 1 replica, 1 sentinel, real processes): producers and
promoters follow a failover by themselves, durable writes wait for the replica, and refusals say what they are."""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from delay_broker import DelayStore, Envelope, ParkRequest
from delay_broker.deliverers import DirectLists
from delay_broker.errors import NotEnoughReplicas, NotReplicated, StoreError
from delay_broker.promoter import Promoter
from delay_broker.targets import ListTarget
from tests.helpers import wait_for

if TYPE_CHECKING:
    from .ha_servers import SentinelSet

wait = functools.partial(wait_for, timeout=30.0, interval=0.05)


@pytest.fixture
def namespace() -> str:
    return f"st-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def store(redis_sentinel: SentinelSet, namespace: str) -> Iterator[DelayStore]:
    store = DelayStore.from_url(redis_sentinel.url, namespace=namespace, retry_backoff=(0.05, 0.2))
    yield store
    master = redis_sentinel.master_client()
    master.delete(*store.keys.all(), f"{namespace}:ready")
    master.close()
    store.client.close()


def envelope(payload: bytes = b"job") -> Envelope:
    return Envelope(route="ready", payload=payload)


def retrying(call: functools.partial[object], seconds: float = 15.0) -> object:
    """What an application does after a failover: try again while the store says it is unavailable."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return call()
        except StoreError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_producers_and_exactly_once_promoters_follow_a_failover(
    redis_sentinel: SentinelSet, store: DelayStore, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    target = f"{namespace}:ready"
    ids = [f"f-{n}" for n in range(200)]
    store.park_many([ParkRequest(id, envelope(id.encode()), delay=4.0) for id in ids[:100]])
    # Wait until the replica has them: this test is about following the failover, not the replication window.
    assert int(redis_sentinel.master_client().wait(1, 5000)) == 1
    promoter = Promoter(store, DirectLists({"ready": ListTarget(target)}), max_idle=1.0).start()
    try:
        with caplog.at_level(logging.WARNING, logger="delay_broker"):
            old = redis_sentinel.master_address()
            redis_sentinel.failover()
            assert redis_sentinel.master_address() != old
            for id in ids[100:]:
                retrying(functools.partial(store.park, id, envelope(id.encode()), delay=1.0))
            master = redis_sentinel.master_client()
            wait(lambda: master.llen(target) >= 200, what="every message promoted after the failover")
            payloads = [item.decode() for item in master.lrange(target, 0, -1)]
        assert sorted(payloads) == sorted(ids), "each exactly once, on the new master"
        moved = [record for record in caplog.records if "master moved" in record.getMessage()]
        assert len(moved) <= 1, "the failover is logged once"
    finally:
        promoter.stop()


def test_durable_writes_wait_for_the_replica(redis_sentinel: SentinelSet, namespace: str) -> None:
    durable = DelayStore.from_url(redis_sentinel.url, namespace=namespace, replicas=1, replica_timeout=2.0)
    try:
        result = durable.park("d-1", envelope(), delay=3600)
        assert result.outcome == "new"
        replica = redis_sentinel.replica_client()
        assert replica.zscore(durable.keys.due, "d-1") is not None, "on the replica when park returns"
        # Two replicas are asked for and there is one: the write is not reported as done.
        stricter = DelayStore.from_url(redis_sentinel.url, namespace=namespace, replicas=2, replica_timeout=0.2)
        with pytest.raises(NotReplicated, match="confirmed by 1 of 2"):
            stricter.park("d-2", envelope(), delay=3600)
        with pytest.raises(NotReplicated, match="1 of 2 in-sync"):
            stricter.promote_direct({"ready": ListTarget(f"{namespace}:ready")}, 10, "p")
        with pytest.raises(NotReplicated, match="not claiming"):
            stricter.claim(10, 30, "p")
        durable.record_routes(["celery-queue"])  # the routes a Celery producer records are durable too
        with pytest.raises(NotReplicated, match="recording routes"):
            stricter.record_routes(["other-queue"])
        stricter.client.close()
    finally:
        redis_sentinel.master_client().delete(*durable.keys.all())
        durable.client.close()


def test_a_refusing_master_is_an_outage_for_promoters_not_the_messages_fault(
    redis_sentinel: SentinelSet, store: DelayStore, namespace: str
) -> None:
    master = redis_sentinel.master_client()
    store.park("r-1", envelope(), delay=0.3)
    target = f"{namespace}:ready"
    master.config_set("min-replicas-to-write", 2)  # one replica: every write is refused with NOREPLICAS
    try:
        with pytest.raises(NotEnoughReplicas, match="min-replicas-to-write"):
            store.park("r-2", envelope(), delay=1)
        promoter = Promoter(store, DirectLists({"ready": ListTarget(target)}), max_idle=0.5).start()
        wait(lambda: promoter.counters.errors >= 3, what="the promoter backing off")
        assert promoter.running and promoter.counters.dead_lettered == 0
        assert master.llen(target) == 0
    finally:
        master.config_set("min-replicas-to-write", 0)
    try:
        wait(lambda: master.llen(target) == 1, what="promoted once the master accepts writes")
        assert store.stats().dead == 0 and store.get("r-1") is None
    finally:
        promoter.stop()


def test_parking_during_a_failover_with_durable_writes_loses_nothing_acknowledged(
    redis_sentinel: SentinelSet, namespace: str
) -> None:
    durable = DelayStore.from_url(redis_sentinel.url, namespace=namespace, replicas=1, replica_timeout=0.5)
    acknowledged: list[str] = []
    stop = threading.Event()

    def produce() -> None:
        n = 0
        while not stop.is_set():
            id = f"p-{n}"
            try:
                durable.park(id, envelope(), delay=3600)
            except StoreError:
                time.sleep(0.05)
                continue  # not acknowledged: the producer tries the same id again
            acknowledged.append(id)
            n += 1
            time.sleep(0.004)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        wait(lambda: len(acknowledged) > 100, what="parks under way")
        redis_sentinel.failover()
        count = len(acknowledged)
        wait(lambda: len(acknowledged) > count + 100, what="parks resumed on the new master")
    finally:
        stop.set()
        producer.join(20)
    master = redis_sentinel.master_client()
    stored = {member.decode() for member in master.zrange(durable.keys.due, 0, -1)}
    lost = [id for id in acknowledged if id not in stored]
    try:
        assert lost == [], f"{len(lost)} acknowledged parks lost"
    finally:
        master.delete(*durable.keys.all())
        durable.client.close()


def test_a_retry_whose_park_is_not_replicated_is_kept_once(redis_sentinel: SentinelSet, namespace: str) -> None:
    """NotReplicated means the park is on the master. A retry is then handed to the broker (Dramatiq would
    swallow the error and lose it), and the master's copy taken back: one copy, not two."""
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    from delay_broker.dramatiq import DelayMiddleware

    client = redis_sentinel.master_client()
    broker = RedisBroker(client=client, namespace=namespace)
    stricter = {"replicas": 2, "replica_timeout": 0.2}  # one replica runs: never confirmed
    middleware = DelayMiddleware(threshold=1, namespace=namespace, store_options=stricter, promote_in_workers=False)
    broker.add_middleware(middleware)
    actor = dramatiq.actor(broker=broker, queue_name="q", actor_name="retried")(lambda: None)
    message = actor.message()
    try:
        broker.enqueue(dramatiq.MessageProxy(message), delay=60_000)  # type: ignore[arg-type]  # as Retries does
        assert middleware.store.get(message.message_id) is None, "not parked beside the broker's copy"
        assert client.hlen(f"{namespace}:q.DQ.msgs") == 1
    finally:
        client.delete(*middleware.store.keys.all(), *client.keys(f"{namespace}:*"))
