"""DelayMiddleware with real ``dramatiq`` worker processes on an HA store: a sharded store on a 3-master Redis
Cluster (RabbitmqBroker, at-least-once), and a RedisBroker behind Sentinel with the store in the same master
(exactly-once) through a failover."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from delay_broker.embedded import EmbeddedRedis

from .test_dramatiq_brokers import Deployment, now_ms, running, wait_for

if TYPE_CHECKING:
    from .ha_servers import RedisClusterServers, SentinelSet

pytestmark = pytest.mark.slow

THRESHOLD = 1.0


def deploy(kind: str, env: dict[str, str], records_url: str) -> Iterator[Deployment]:
    unique = uuid.uuid4().hex[:10]
    env = {
        "DB_BROKER": kind,
        "DB_REDIS_URL": records_url,
        "DB_BROKER_NS": f"ha{unique}",
        "DB_STORE_NS": f"dramatiq-ha-{unique}",
        "DB_THRESHOLD": str(THRESHOLD),
        "DB_RECORD_KEY": f"records:ha:{unique}",
        "DB_QUEUES": f"ha_{unique}",
        **env,
    }
    yield from running(kind, env, records_url)


def send_and_check(deployment: Deployment, count: int, between: Any = None, lead_ms: int = 3000) -> None:
    actor = deployment.app.actors[deployment.env["DB_QUEUES"]]["record"]
    sent = {}
    for n in range(count):
        token = f"t{n}"
        message = actor.send_with_options(args=(token,), delay=lead_ms + 20 * n)
        sent[token] = (message.message_id, now_ms() + lead_ms + 20 * n)
    assert deployment.app.middleware.store.stats().parked >= count
    if between is not None:
        between()

    def all_ran() -> bool:
        return len({event["token"] for event in deployment.events() if event["event"] == "run"}) >= count

    try:
        wait_for(all_ran, 90, f"all {count} messages ran")
    except AssertionError:
        raise AssertionError(deployment.tail()) from None
    time.sleep(1.5)
    runs = [event for event in deployment.events() if event["event"] == "run"]
    assert Counter(event["token"] for event in runs) == Counter({token: 1 for token in sent}), "each ran once"
    for event in runs:
        message_id, due_at = sent[event["token"]]
        assert event["id"] == message_id and event["t"] >= due_at - 50, "never before its due time"


@pytest.fixture
def cluster_deployment(
    redis_cluster: RedisClusterServers, redis_server: EmbeddedRedis, request: pytest.FixtureRequest
) -> Iterator[Deployment]:
    rabbit = request.getfixturevalue("rabbitmq")
    env = {"DB_RABBIT_URL": rabbit.pika_url, "DB_STORE_URL": redis_cluster.url, "DB_STORE_SHARDS": "4"}
    yield from deploy("rabbitmq", env, redis_server.url)


def test_rabbitmq_workers_with_a_sharded_store_on_a_cluster_run_each_message_once(
    cluster_deployment: Deployment,
) -> None:
    store = cluster_deployment.app.middleware.store
    assert store.cluster and len(store.shards) == 4
    send_and_check(cluster_deployment, 40)
    assert store.stats().counters["promoted"] == 40


@pytest.fixture
def sentinel_deployment(redis_sentinel: SentinelSet, redis_server: EmbeddedRedis) -> Iterator[Deployment]:
    env = {"DB_SENTINEL_URL": redis_sentinel.url, "DB_STORE_REPLICAS": "1"}
    yield from deploy("redis-sentinel", env, redis_server.url)


def test_redis_broker_behind_sentinel_promotes_exactly_once_through_a_failover(
    sentinel_deployment: Deployment, redis_sentinel: SentinelSet
) -> None:
    middleware = sentinel_deployment.app.middleware
    assert middleware.is_direct, "the store is in the broker's master: exactly-once promotion"

    def fail_over() -> None:
        assert int(redis_sentinel.master_client().wait(1, 5000)) == 1  # the parks are on the replica
        redis_sentinel.failover()

    # Parked before the failover, due after it: what durable parks promise. (A promotion made by the old master
    # in the instant the replica is promoted can run twice; docs/scaling.md measures that window.)
    send_and_check(sentinel_deployment, 30, between=fail_over, lead_ms=8000)
