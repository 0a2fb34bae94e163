"""Guard rails (issue 12) on a real redis-server: bounded dead-letter retention, a maximum delay, and the
threshold checked against what the broker tolerates (visibility timeout, RabbitMQ's consumer_timeout)."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import dramatiq
import pytest
import redis
from celery import Celery
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.stub import StubBroker
from prometheus_client import CollectorRegistry

from delay_broker import ConfigurationError, DelayStore, InvalidDelay, ListTarget, ParkRequest, Promoter
from delay_broker.celery import install, parse_options
from delay_broker.celery.config import check_threshold
from delay_broker.deliverers import DirectLists
from delay_broker.dramatiq import DelayMiddleware
from delay_broker.embedded import EmbeddedRedis
from delay_broker.metrics import StoreCollector

from .helpers import envelope, wait_for

# -- dead letters: bounded retention ---------------------------------------------------------------------------


def kill(store: DelayStore, ids: list[str]) -> None:
    """Dead-letter ``ids`` the way promoters do: an envelope naming a route nobody declared."""
    store.park_many([ParkRequest(id, envelope(route="nowhere"), delay=0) for id in ids])
    routes = DirectLists({"ready": ListTarget(f"{store.keys.namespace}:ready")}).direct_routes()
    for shard in range(len(store.shards)):
        while store.promote_direct(routes, 1000, "test", shard=shard).dead_lettered:
            pass
    assert store.stats().dead >= len(ids)


def dead_ids(store: DelayStore) -> list[str]:
    return [info.id for info in store.iter_all("dead")]


def test_trim_by_count_drops_the_oldest_with_their_fields_and_counts_them(client: redis.Redis, namespace: str) -> None:
    store = DelayStore(client, namespace=namespace, dead_max_count=2)
    kill(store, ["a", "b", "c", "d", "e"])
    for n, id in enumerate("abcde"):  # make the order of death explicit
        client.zadd(store.keys.dead, {id: 1_000 + n})
    assert store.trim_dead() == 3
    assert dead_ids(store) == ["d", "e"]
    for key in (store.keys.msg, store.keys.errors, store.keys.attempts):
        assert not client.hexists(key, "a") and not client.hexists(key, "c"), key
    assert client.hexists(store.keys.msg, "d") and client.hexists(store.keys.errors, "d")
    assert store.stats().counters["dead_dropped"] == 3
    assert store.trim_dead() == 0, "nothing left past the bound"


def test_trim_by_age_uses_the_redis_clock(client: redis.Redis, namespace: str) -> None:
    store = DelayStore(client, namespace=namespace, dead_max_age=timedelta(minutes=1))
    kill(store, ["old", "older", "fresh"])
    now = store.now_ms()
    client.zadd(store.keys.dead, {"older": now - 3_600_000, "old": now - 61_000})
    assert store.trim_dead() == 2
    assert dead_ids(store) == ["fresh"]
    assert store.stats().counters["dead_dropped"] == 2


def test_trim_with_both_bounds_and_in_pages(client: redis.Redis, namespace: str) -> None:
    store = DelayStore(client, namespace=namespace, dead_max_count=1500, dead_max_age=3600)
    ids = [f"m{n:05d}" for n in range(2600)]
    kill(store, ids)
    now = store.now_ms()
    client.zadd(store.keys.dead, {ids[0]: now - 7_200_000})
    # 1100 past the count (more than one script call's limit of 1000), the aged one among them.
    assert store.trim_dead() == 1100
    assert store.stats().dead == 1500
    assert dead_ids(store)[0] == "m01100"


def test_no_bound_means_no_trim(store: DelayStore) -> None:
    kill(store, ["x"])
    assert not store.trims_dead
    assert store.trim_dead() == 0
    assert dead_ids(store) == ["x"]


def test_trim_applies_per_shard(client: redis.Redis, namespace: str) -> None:
    store = DelayStore(client, namespace=namespace, shards=3, dead_max_count=2)
    ids = [f"s{n}" for n in range(30)]
    kill(store, ids)
    before = [int(client.zcard(space.dead)) for space in store.shards]
    assert store.trim_dead() == 30 - sum(min(count, 2) for count in before)
    assert [int(client.zcard(space.dead)) for space in store.shards] == [min(count, 2) for count in before]
    assert store.stats().counters["dead_dropped"] == 30 - sum(min(count, 2) for count in before)
    assert store.trim_dead(shard=0) == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dead_max_count": -1}, "dead_max_count"),
        ({"dead_max_count": 1.5}, "dead_max_count"),
        ({"dead_max_age": 0}, "dead_max_age must be positive"),
        ({"dead_max_age": "1h"}, "dead_max_age"),
        ({"max_delay": -5}, "max_delay"),
        ({"max_delay": 0}, "max_delay must be positive"),
    ],
)
def test_bad_limits_are_refused(client: redis.Redis, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        DelayStore(client, **options)


def test_promoters_enforce_the_retention(client: redis.Redis, namespace: str) -> None:
    store = DelayStore(client, namespace=namespace, dead_max_count=1)
    store.park_many([ParkRequest(f"p{n}", envelope(route="nowhere"), delay=0) for n in range(4)])
    promoter = Promoter(store, DirectLists({"ready": ListTarget(f"{namespace}:ready")}), max_idle=0.2).start()
    try:
        wait_for(lambda: store.stats().counters.get("dead_dropped") == 3, what="3 dead letters dropped")
        assert store.stats().dead == 1
        # Right after dead-lettering more, not a minute later.
        store.park_many([ParkRequest(f"q{n}", envelope(route="nowhere"), delay=0) for n in range(2)])
        wait_for(lambda: store.stats().counters.get("dead_dropped") == 5, timeout=5, what="2 more dropped")
        assert store.stats().dead == 1
    finally:
        promoter.stop()


def test_the_dropped_counter_is_exported_to_prometheus(client: redis.Redis, namespace: str) -> None:
    store = DelayStore(client, namespace=namespace, dead_max_count=0)
    kill(store, ["gone"])
    store.trim_dead()
    registry = CollectorRegistry()
    registry.register(StoreCollector(store))
    labels = {"namespace": namespace, "event": "dead_dropped"}
    assert registry.get_sample_value("delay_broker_store_events_total", labels) == 1
    assert registry.get_sample_value("delay_broker_dead_messages", {"namespace": namespace}) == 0


# -- max_delay ------------------------------------------------------------------------------------------------


def test_max_delay_refuses_parks_further_than_the_limit(client: redis.Redis, namespace: str) -> None:
    store = DelayStore(client, namespace=namespace, max_delay=timedelta(hours=1))
    assert store.max_delay_ms == 3_600_000
    store.park("ok", envelope(), delay=3600)
    with pytest.raises(InvalidDelay, match=r"too-far.*7200 s from now, beyond max_delay \(3600 s\)"):
        store.park("too-far", envelope(), delay=7200)
    later = datetime.now(timezone.utc) + timedelta(hours=2)
    with pytest.raises(InvalidDelay, match="beyond max_delay"):
        store.park("eta", envelope(), due=later)
    # All or nothing: one refused request leaves the others of its batch unparked too.
    with pytest.raises(InvalidDelay, match="beyond max_delay"):
        store.park_many([ParkRequest("fine", envelope(), delay=60), ParkRequest("bad", envelope(), delay=3601)])
    assert [store.get(id) for id in ("too-far", "eta", "fine", "bad")] == [None] * 4
    assert store.stats().parked == 1


def test_max_delay_is_measured_from_the_redis_clock(client: redis.Redis, namespace: str) -> None:
    store = DelayStore(client, namespace=namespace, max_delay=10)
    redis_now = datetime.fromtimestamp(store.now_ms() / 1000, timezone.utc)
    store.park("due-at-redis-now-plus-9", envelope(), due=redis_now + timedelta(seconds=9))
    with pytest.raises(InvalidDelay, match=r"beyond max_delay \(10 s\)"):
        store.park("plus-20", envelope(), due=redis_now + timedelta(seconds=20))


def test_max_delay_refuses_reschedules_and_leaves_the_message(client: redis.Redis, namespace: str) -> None:
    store = DelayStore(client, namespace=namespace, max_delay=60.5)
    due = store.park("job", envelope(), delay=30).due_ms
    with pytest.raises(InvalidDelay, match=r"beyond max_delay \(60\.500 s\)"):
        store.reschedule("job", delay=120)
    info = store.get("job")
    assert info is not None and info.due_ms == due
    assert store.reschedule("job", delay=0) is not None


def test_recurring_occurrences_are_exempt(client: redis.Redis, namespace: str) -> None:
    store = DelayStore(client, namespace=namespace, max_delay=60)
    later = datetime.now(timezone.utc) + timedelta(days=30)
    assert store.park_occurrence("monthly", "occurrence-1", envelope(), later).outcome == "new"


def test_from_url_takes_the_new_options(redis_server: EmbeddedRedis, namespace: str) -> None:
    store = DelayStore.from_url(redis_server.url, namespace=namespace, max_delay=5, dead_max_count=3, dead_max_age=9)
    assert (store.max_delay_ms, store.dead_max_count, store.dead_max_age_ms) == (5000, 3, 9000)


def test_dramatiq_store_options_carry_max_delay(client: redis.Redis, namespace: str) -> None:
    broker = StubBroker()
    middleware = DelayMiddleware(client=client, namespace=namespace, threshold=1, store_options={"max_delay": 3600})
    broker.add_middleware(middleware)
    queue = f"q{uuid.uuid4().hex[:8]}"

    @dramatiq.actor(broker=broker, queue_name=queue, actor_name=f"a_{queue}")
    def act() -> None: ...

    act.send_with_options(delay=timedelta(minutes=30))
    with pytest.raises(InvalidDelay, match=r"beyond max_delay \(3600 s\)"):
        act.send_with_options(delay=timedelta(days=2))
    assert middleware.store.stats().parked == 1


# -- Celery: options and the threshold against the broker ------------------------------------------------------


def test_celery_options_reach_the_store() -> None:
    options = parse_options({"max_delay": 86400, "dead_max_count": 1000, "dead_max_age": 604800})
    store_options = options.store_options()
    assert (store_options["max_delay"], store_options["dead_max_count"], store_options["dead_max_age"]) == (
        86400,
        1000,
        604800,
    )
    assert parse_options({}).store_options()["max_delay"] is None


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"max_delay": 0}, "'max_delay' must be finite and > 0"),
        ({"max_delay": "1d"}, "'max_delay' must be a number"),
        ({"dead_max_count": -1}, "'dead_max_count' must be an integer"),
        ({"dead_max_age": True}, "'dead_max_age' must be a number"),
        ({"consumer_timeout": 0}, "'consumer_timeout' must be finite and > 0"),
        ({"consumer_timeout": True}, "'consumer_timeout' must be a number"),
    ],
)
def test_celery_bad_limits_are_refused(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_options(raw)


def test_celery_max_delay_refuses_apply_async(redis_server: EmbeddedRedis) -> None:
    unique = uuid.uuid4().hex[:10]
    app = Celery(f"t{unique}", broker=redis_server.url, set_as_current=False)
    app.conf.task_default_queue = f"q-{unique}"
    install(app, threshold=1.0, namespace=f"n-{unique}", max_delay=3600)

    @app.task(name="t.guard", shared=False)  # type: ignore[untyped-decorator]
    def guard() -> None: ...

    try:
        guard.apply_async(countdown=600)
        with pytest.raises(InvalidDelay, match=r"beyond max_delay \(3600 s\)"):
            guard.apply_async(countdown=7200)
        store = DelayStore(redis_server.client(), namespace=f"n-{unique}")
        assert store.stats().parked == 1
    finally:
        app.close()


@pytest.mark.parametrize(
    ("kind", "transport_options", "threshold", "refused"),
    [
        ("redis", {}, 3600, True),  # kombu's default visibility_timeout: 3600 s
        ("redis", {}, 3599, False),
        ("redis", {"visibility_timeout": 30}, None, True),  # the default threshold of 60 s
        ("sentinel", {"visibility_timeout": "120"}, 120, True),
        ("redis", {"visibility_timeout": 43200}, 7200, False),
        ("sqs", {}, None, False),  # 900 s, below the 1800 s kombu gives the queues it creates
        ("sqs", {"visibility_timeout": 600}, None, True),
        ("sqs", {"visibility_timeout": 600}, 300, False),
    ],
)
def test_a_threshold_at_or_above_the_visibility_timeout_is_refused(
    kind: Any, transport_options: dict[str, Any], threshold: float | None, refused: bool
) -> None:
    options = parse_options({} if threshold is None else {"threshold": threshold})
    if refused:
        with pytest.raises(ConfigurationError, match="visibility_timeout") as caught:
            check_threshold(options, kind, transport_options)
        assert f"{options.threshold_for(kind):g} s" in str(caught.value)
    else:
        check_threshold(options, kind, transport_options)
    check_threshold(parse_options({"enabled": False, "threshold": 10**6}), kind, transport_options)


def test_install_refuses_a_threshold_past_the_visibility_timeout(redis_server: EmbeddedRedis) -> None:
    app = Celery("vis", broker=redis_server.url, set_as_current=False)
    app.conf.broker_transport_options = {"visibility_timeout": 600}
    before = (app.conf.broker_transport, app.conf.broker_transport_options)
    with pytest.raises(ConfigurationError, match=r"threshold of 900 s is not below .* visibility_timeout of 600 s"):
        install(app, threshold=900)
    assert (app.conf.broker_transport, app.conf.broker_transport_options) == before


def test_rabbitmq_threshold_past_consumer_timeout_warns_once(
    redis_server: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="delay_broker")
    app = Celery("rmq", broker="amqp://guest@127.0.0.1:1//", set_as_current=False)
    install(app, redis_url=redis_server.url, threshold=1800.5)  # RabbitMQ's default: 1800 s
    warnings = [r.getMessage() for r in caplog.records if "consumer_timeout" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "1800.5 s" in warnings[0] and "1800 s" in warnings[0] and "Lower 'threshold'" in warnings[0]
    check_threshold(parse_options({"threshold": 1800.5}), "amqp", {})
    assert len([r for r in caplog.records if "consumer_timeout" in r.getMessage()]) == 1, "once per process"
    caplog.clear()
    check_threshold(parse_options({"threshold": 3000, "consumer_timeout": 7200}), "amqp", {})
    check_threshold(parse_options({"threshold": 10**6, "consumer_timeout": False}), "amqp", {})
    check_threshold(parse_options({"threshold": 60}), "amqp", {})
    assert not [r for r in caplog.records if "consumer_timeout" in r.getMessage()]


# -- Dramatiq: RabbitMQ's consumer_timeout ---------------------------------------------------------------------


def test_dramatiq_rabbitmq_threshold_past_consumer_timeout_warns(
    client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="delay_broker")
    broker = RabbitmqBroker(url="amqp://guest:guest@127.0.0.1:1/%2F", confirm_delivery=True)
    DelayMiddleware(client=client, threshold=timedelta(hours=1)).install(broker)  # connects to nothing
    warnings = [r.getMessage() for r in caplog.records if "consumer_timeout" in r.getMessage()]
    assert len(warnings) == 1 and "3600 s" in warnings[0] and "1800 s" in warnings[0], warnings
    caplog.clear()
    stated = RabbitmqBroker(url="amqp://guest:guest@127.0.0.1:1/%2F", confirm_delivery=True)
    DelayMiddleware(client=client, threshold=3600, consumer_timeout=7200).install(stated)
    turned_off = RabbitmqBroker(url="amqp://guest:guest@127.0.0.1:1/%2F", confirm_delivery=True)
    DelayMiddleware(client=client, threshold=3600, consumer_timeout=False).install(turned_off)
    DelayMiddleware(client=client, threshold=3600).install(StubBroker())  # no such limit
    assert not [r for r in caplog.records if "consumer_timeout" in r.getMessage()]
    with pytest.raises(ConfigurationError, match="consumer_timeout must be positive"):
        DelayMiddleware(client=client, consumer_timeout=0)
