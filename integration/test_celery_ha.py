"""The Celery adapter with its store on a real 3-master Redis Cluster: a RabbitMQ broker, a sharded store given
as a ``redis+cluster://`` URL, real ``celery worker`` processes; every task runs once, after its due time."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from .celery_apps.harness import CeleryEnv, wait_for

if TYPE_CHECKING:
    from .ha_servers import RedisClusterServers

pytestmark = pytest.mark.slow


@pytest.fixture
def env(redis_cluster: RedisClusterServers, request: pytest.FixtureRequest) -> Iterator[CeleryEnv]:
    rabbitmq = request.getfixturevalue("rabbitmq")
    redis_server = request.getfixturevalue("redis_server")
    celery_env = CeleryEnv.create(
        "amqp",
        broker_url=rabbitmq.url,
        record_url=redis_server.url,
        unique=uuid.uuid4().hex[:10],
        store_url=redis_cluster.url,
        options={"shards": 4},
    )
    try:
        celery_env.start_worker("w1")
        yield celery_env
    finally:
        celery_env.close()


def test_tasks_parked_on_a_cluster_run_once_after_their_due_time(env: CeleryEnv) -> None:
    sent_at = time.time()
    results = [env.task("record").apply_async((f"c{n}",), countdown=3 + n * 0.05) for n in range(30)]
    store = env.store
    assert store.cluster and len(store.shards) == 4
    assert store.stats().parked == 30 and env.queue_depth() == 0
    assert len({store.shard_for(result.id) for result in results}) > 1, "spread over shards"
    wait_for(lambda: len(env.run_counts()) == 30, 60, what="every task ran")
    time.sleep(1.5)
    counts = env.run_counts()
    assert set(counts.values()) == {1}, counts
    for n, result in enumerate(results):
        assert env.runs(result.id)[0]["t"] >= sent_at + 3 + n * 0.05 - 0.1, "ran before its due time"
    wait_for(lambda: store.stats().counters.get("promoted") == 30, 20, what="promotions acknowledged")
