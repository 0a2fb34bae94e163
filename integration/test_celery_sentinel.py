"""Celery on ``sentinel://`` end to end: a real ``celery worker`` process, a real master + replica + Sentinel.

The delay store lives in the master the Sentinel names ``mymaster`` (no ``redis_url``), so the worker's promoter
moves due tasks into kombu's lists in that master with one script (exactly once), and keeps doing so after a
failover. One worker serves both tests (each uses task ids of its own); the threshold is 1 s.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
import redis

from delay_broker import DelayStore
from delay_broker.celery import TRANSPORT_SENTINEL, build_promoter
from delay_broker.celery.delivery import RedisDirect
from delay_broker.connect import client_from_url
from delay_broker.embedded import EmbeddedRedis

from .celery_apps.harness import CeleryEnv, wait_for

if TYPE_CHECKING:
    from .ha_servers import SentinelSet

pytestmark = pytest.mark.timeout(120)


def sentinel_env(sentinel: SentinelSet, recorder: EmbeddedRedis, unique: str) -> CeleryEnv:
    """A CeleryEnv whose broker is the Sentinel set (executions are recorded in the session's plain Redis)."""
    transport_options: dict[str, Any] = {
        "master_name": sentinel.service,
        "global_keyprefix": f"t{unique}:",  # kombu's global keys (unacked, bindings) of our own
        "delay_broker": {"threshold": 1.0, "namespace": f"celery-{unique}", "max_idle": 1.0},
    }
    env = {
        "DBT_BROKER_URL": f"sentinel://127.0.0.1:{sentinel.sentinel_port}",
        "DBT_TRANSPORT": TRANSPORT_SENTINEL,
        "DBT_OPTIONS": json.dumps(transport_options),
        "DBT_QUEUE": f"q-{unique}",
        "DBT_RECORD_URL": recorder.url,
        "DBT_RECORD_KEY": f"dbtest:{unique}:runs",
    }
    store_client = client_from_url(sentinel.url)  # follows failovers: close() cleans up wherever the master is
    assert isinstance(store_client, redis.Redis)
    return CeleryEnv("sentinel", env, redis.Redis.from_url(recorder.url), store_client)


@pytest.fixture(scope="module")
def env(redis_sentinel: SentinelSet, redis_server: EmbeddedRedis) -> Iterator[CeleryEnv]:
    celery_env = sentinel_env(redis_sentinel, redis_server, uuid.uuid4().hex[:10])
    try:
        celery_env.start_worker("w1", concurrency=2)
        yield celery_env
    finally:
        celery_env.close()


def master_store(sentinel: SentinelSet, env: CeleryEnv) -> DelayStore:
    """The store read through a plain client of the node that is master now."""
    return DelayStore(sentinel.master_client(), namespace=env.store.keys.namespace)


def queue_depth(sentinel: SentinelSet, env: CeleryEnv) -> int:
    prefix = json.loads(env.env["DBT_OPTIONS"])["global_keyprefix"]
    client = sentinel.master_client()
    keys = [f"{prefix}{env.queue}"] + [f"{prefix}{env.queue}\x06\x16{step}" for step in (3, 6, 9)]
    return sum(int(client.llen(key)) for key in keys)


def assert_promoted_exactly_once(env: CeleryEnv, task_id: str) -> None:
    """The promoter this configuration builds (the worker's too) is the one-script path into kombu's lists, and
    nothing of the task is left behind: no lease to acknowledge, no retry, no dead letter."""
    promoter = build_promoter(env.app)
    try:
        assert isinstance(promoter.deliverer, RedisDirect), type(promoter.deliverer)
    finally:
        promoter.store.client.close()
    assert env.store.get(task_id) is None, "the exactly-once path leaves nothing to acknowledge"
    stats = env.store.stats()
    assert (stats.inflight, stats.dead, stats.counters.get("retried", 0)) == (0, 0, 0), stats
    assert "(exactly-once)" in env.workers[0].text(), "the worker's promoter runs the exactly-once path"


def test_countdown_on_sentinel_is_parked_in_the_master_and_runs_once(
    redis_sentinel: SentinelSet, env: CeleryEnv
) -> None:
    sent_at = time.time()
    result = env.task("record").apply_async(("parked",), countdown=5)
    info = master_store(redis_sentinel, env).get(result.id)
    assert info is not None and info.state == "due" and info.due_ms is not None
    assert abs(info.due_ms / 1000 - (sent_at + 5)) < 1.5
    assert master_store(redis_sentinel, env).stats().parked >= 1
    assert queue_depth(redis_sentinel, env) == 0, "a parked task must not be in the broker queue"
    time.sleep(1.5)
    assert env.runs(result.id) == [], "ran long before its due time"
    wait_for(lambda: env.runs(result.id), 30, what="parked task ran")
    assert env.runs(result.id)[0]["t"] >= info.due_ms / 1000 - 0.05, "ran before its due time"
    assert_promoted_exactly_once(env, result.id)
    time.sleep(2)
    assert len(env.runs(result.id)) == 1


def test_a_failover_between_parking_and_due_time_still_runs_the_task_once(
    redis_sentinel: SentinelSet, env: CeleryEnv
) -> None:
    old_master = redis_sentinel.master_address()
    result = env.task("record").apply_async(("failover",), countdown=8)
    client = redis_sentinel.master_client()
    assert client.execute_command("WAIT", 1, 5000) == 1, "the parked task reached the replica"
    info = master_store(redis_sentinel, env).get(result.id)
    assert info is not None and info.state == "due" and info.due_ms is not None
    took = redis_sentinel.failover()
    assert redis_sentinel.master_address() != old_master
    print(f"\nfailover took {took:.1f} s; task due in {info.due_ms / 1000 - time.time():.1f} s")
    if time.time() < info.due_ms / 1000 - 0.5:
        after = master_store(redis_sentinel, env).get(result.id)
        assert after is not None and after.state == "due", "the parked task is in the new master"
    wait_for(lambda: env.runs(result.id), 40, what="parked task ran after the failover")
    assert env.runs(result.id)[0]["t"] >= info.due_ms / 1000 - 0.05, "ran before its due time"
    assert_promoted_exactly_once(env, result.id)
    time.sleep(2)
    assert len(env.runs(result.id)) == 1


# -- configuration, in process (no worker) ---------------------------------------------------------------------------


def test_store_urls_of_every_kind_are_accepted_and_checked() -> None:
    from delay_broker import ConfigurationError
    from delay_broker.celery import parse_options

    for url in ("redis+sentinel://h1:26379,h2/mymaster/2", "rediss+sentinel://u:p@h1/m", "redis+cluster://h1:7000,h2"):
        assert parse_options({"redis_url": url}).redis_url == url
    for url, message in [
        ("redis+sentinel://h1:26379", "names the master as its path"),
        ("redis+sentinel://h1:26379/m/x", "names the master as its path"),
        ("redis+sentinel://h1:99999/m", "bad port"),
        ("redis+cluster://h1:7000/3", "database 0 only"),
        ("redis+cluster://,h2/", "no host"),
    ]:
        with pytest.raises(ConfigurationError, match=message):
            parse_options({"redis_url": url})


def test_which_store_urls_count_as_the_sentinel_brokers_redis(redis_sentinel: SentinelSet) -> None:
    from celery import Celery

    from delay_broker.celery import install
    from delay_broker.celery.stores import same_redis

    port = redis_sentinel.sentinel_port
    app = Celery("same", broker=f"sentinel://127.0.0.1:{port};sentinel://127.0.0.1:1", set_as_current=False)
    app.conf.broker_transport_options = {"master_name": "mymaster"}
    options = install(app, namespace=f"same-{uuid.uuid4().hex[:10]}")
    same = {
        None: True,
        f"redis+sentinel://127.0.0.1:1,127.0.0.1:{port}/mymaster/0": True,  # the same Sentinels, in any order
        f"redis+sentinel://127.0.0.1:{port}/mymaster/0": False,  # not the same Sentinels
        f"redis+sentinel://127.0.0.1:1,127.0.0.1:{port}/mymaster/1": False,
        f"redis+sentinel://127.0.0.1:1,127.0.0.1:{port}/other/0": False,
        f"redis://127.0.0.1:{redis_sentinel.master_address()[1]}/0": False,  # the master of now, not of later
        "redis+cluster://127.0.0.1:7000": False,
    }
    try:
        with app.connection_for_write() as connection:
            for url, expected in same.items():
                assert same_redis(options.__class__(redis_url=url), "sentinel", connection) is expected, url
    finally:
        app.close()


def test_several_sentinel_urls_keep_our_transport_when_kombu_fails_over(
    redis_sentinel: SentinelSet, redis_server: EmbeddedRedis
) -> None:
    """kombu switches to the next URL on a connection error, re-parsing it: with a ``sentinel://`` scheme that
    would put its stock transport (which does not park) in place of ours."""
    from celery import Celery

    from delay_broker.celery import install
    from delay_broker.celery.transport import SentinelTransport

    unique = uuid.uuid4().hex[:10]
    port = redis_sentinel.sentinel_port
    # The second Sentinel is down (listed first, redis-py would retry it for seconds before asking the next one).
    app = Celery("multi", broker=f"sentinel://127.0.0.1:{port};sentinel://127.0.0.1:1", set_as_current=False)
    app.conf.broker_transport_options = {"master_name": "mymaster"}
    app.conf.task_default_queue = f"q-{unique}"
    install(app, threshold=1.0, namespace=f"multi-{unique}")

    @app.task(name="t.add", shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    store = DelayStore(client_from_url(redis_sentinel.url), namespace=f"multi-{unique}")
    try:
        with app.connection_for_write() as connection:
            assert isinstance(connection.transport, SentinelTransport)
            connection.maybe_switch_next()  # what kombu does on a connection error
            assert isinstance(connection.transport, SentinelTransport)
        result = add.apply_async((1, 2), countdown=60)
        info = store.get(result.id)
        assert info is not None and info.state == "due"
    finally:
        store.client.delete(*store.keys.all())
        app.close()


def test_a_store_outside_the_sentinel_master_promotes_through_kombus_stock_transport(
    redis_sentinel: SentinelSet, redis_server: EmbeddedRedis
) -> None:
    """With ``redis_url`` elsewhere, promotion republishes through kombu's own Sentinel transport (at least once)."""
    from celery import Celery

    from delay_broker.celery import install
    from delay_broker.celery.delivery import VirtualRepublisher

    unique = uuid.uuid4().hex[:10]
    app = Celery("apart", broker=f"sentinel://127.0.0.1:{redis_sentinel.sentinel_port}", set_as_current=False)
    app.conf.broker_transport_options = {"master_name": "mymaster", "global_keyprefix": f"a{unique}:"}
    app.conf.task_default_queue = f"q-{unique}"
    install(app, threshold=1.0, namespace=f"apart-{unique}", redis_url=redis_server.url)

    @app.task(name="t.add", shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    store = DelayStore(redis_server.client(), namespace=f"apart-{unique}")
    master = client_from_url(redis_sentinel.url)
    promoter = build_promoter(app)
    deliverer = promoter.deliverer
    assert isinstance(deliverer, VirtualRepublisher)
    try:
        result = add.apply_async((1, 2), countdown=60)
        assert store.get(result.id) is not None
        assert store.reschedule(result.id, delay=0) is not None
        promoter.step()
        queued = master.lrange(f"a{unique}:q-{unique}", 0, -1)
        assert len(queued) == 1 and json.loads(queued[0])["headers"]["id"] == result.id
        assert store.get(result.id) is None
    finally:
        deliverer.close()
        for key in master.keys(f"a{unique}:*"):
            master.delete(key)
        store.client.delete(*store.keys.all())
        app.close()
