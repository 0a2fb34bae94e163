"""Effectively-once execution with real workers: Dramatiq on RabbitMQ and SQS (``OnceMiddleware``), Celery on
RabbitMQ and SQS (the ``once`` option).

The workers run no promoter: this process promotes, so it can play the promoter that is killed between its
publish and its acknowledgement. It claims the due messages under a 1 s lease and publishes each through the
app's own deliverer without acknowledging it; once the lease has run out, a live promoter claims them again and
publishes them a second time. Each message then sits in the broker twice, with the same id and promotion token.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from delay_broker import DelayStore, Promoter
from delay_broker.celery import build_promoter
from delay_broker.embedded import EmbeddedRedis
from delay_broker.once import DROPPED_COUNTER

from .celery_apps.brokers import env_for
from .celery_apps.harness import CeleryEnv
from .test_dramatiq_brokers import Deployment, running, wait_for

pytestmark = pytest.mark.slow

COPIES = 10


def dropped(store: DelayStore) -> int:
    return store.stats().counters.get(DROPPED_COUNTER, 0)


def promote_twice(store: DelayStore, make_promoter: Callable[..., Promoter], count: int) -> None:
    """Every one of ``count`` due messages is published twice: by a promoter killed before it acknowledged them,
    then by a live one once the first's lease has run out."""
    dying = make_promoter()
    claimed = 0
    deadline = time.monotonic() + 30
    while claimed < count:
        assert time.monotonic() < deadline, f"claimed {claimed} of {count}"
        for message in store.claim(100, 1.0, "killed-promoter").messages:
            dying.deliverer.deliver(message)  # type: ignore[union-attr]
            claimed += 1
        time.sleep(0.1)
    live = make_promoter(max_idle=0.2, lease=10).start()
    try:
        wait_for(lambda: store.stats().parked + store.stats().inflight == 0, 60, "the second publishes")
    finally:
        live.stop()
    assert store.stats().counters.get("promoted", 0) >= count


# -- Dramatiq -------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[("rabbitmq", True), ("rabbitmq", False), ("sqs", True)], ids=str)
def dramatiq_app(request: pytest.FixtureRequest, redis_server: EmbeddedRedis) -> Iterator[Deployment]:
    kind, once = request.param
    unique = uuid.uuid4().hex[:10]
    env = {
        "DB_BROKER": kind,
        "DB_REDIS_URL": redis_server.url,
        "DB_BROKER_NS": f"once{unique}",
        "DB_STORE_NS": f"once-{kind}-{unique}",
        "DB_THRESHOLD": "1",
        "DB_RECORD_KEY": f"records:once:{unique}",
        "DB_QUEUES": f"once_{unique}",
        "DB_PROMOTE": "0",
    }
    if once:
        env["DB_ONCE"] = "1"
    if kind == "rabbitmq":
        env["DB_RABBIT_URL"] = request.getfixturevalue("rabbitmq").pika_url
    if kind == "sqs":
        env["DB_SQS_ENDPOINT"] = request.getfixturevalue("sqs").endpoint_url
    yield from running(kind, env, redis_server.url)


def dramatiq_runs(app: Deployment, prefix: str) -> list[dict[str, Any]]:
    return [event for event in app.events() if event["event"] == "run" and event["token"].startswith(prefix)]


def test_dramatiq_a_promotion_delivered_twice_runs_once(dramatiq_app: Deployment) -> None:
    app, once = dramatiq_app, "DB_ONCE" in dramatiq_app.env
    store = app.app.middleware.store
    before = dropped(store)
    actor = app.app.actors[app.env["DB_QUEUES"]]["record"]
    ids = {actor.send_with_options(args=(f"dup-{n}",), delay=1100).message_id for n in range(COPIES)}
    time.sleep(1.2)
    promote_twice(store, app.app.middleware.build_promoter, COPIES)
    expected = 1 if once else 2
    wait_for(lambda: len(dramatiq_runs(app, "dup-")) >= COPIES * expected, 60, "the runs")
    if once:
        wait_for(lambda: dropped(store) - before == COPIES, 60, f"{COPIES} second copies dropped")
    time.sleep(2.0)  # a late copy would run now
    runs = dramatiq_runs(app, "dup-")
    assert Counter(run["id"] for run in runs) == dict.fromkeys(ids, expected)
    assert dropped(store) - before == (COPIES if once else 0)
    # Marked only when the broker has an OnceMiddleware: without it a promoted message is as it always was.
    assert all((run["promotion"] is not None) == once for run in runs)
    if once:
        log = app.log.read_text(errors="replace")
        assert sum(f"Dropped a second delivery of message {id} " in log for id in ids) == COPIES, app.tail()


@pytest.mark.parametrize("actor_name", ["flaky", "flaky_short"])
def test_dramatiq_a_retry_of_a_failing_promoted_message_runs_again(dramatiq_app: Deployment, actor_name: str) -> None:
    """``flaky`` backs off above the threshold (the retry is parked again: a new promotion); ``flaky_short`` below
    it (the retry goes to the broker with the same promotion token and the next retry count). Neither is dropped."""
    app = dramatiq_app
    store = app.app.middleware.store
    before = dropped(store)
    token = f"{actor_name}-{uuid.uuid4().hex[:6]}"
    app.app.actors[app.env["DB_QUEUES"]][actor_name].send_with_options(args=(token,), delay=1100)
    promoter = app.app.middleware.build_promoter(max_idle=0.2, lease=10).start()
    try:
        runs = wait_for(lambda: len(dramatiq_runs(app, token)) >= 2 and dramatiq_runs(app, token), 60, "the retry")
    finally:
        promoter.stop()
    assert [run["retries"] for run in runs] == [0, 1]
    if "DB_ONCE" in app.env:
        same = runs[0]["promotion"] == runs[1]["promotion"]
        assert same == (actor_name == "flaky_short") and None not in (runs[0]["promotion"], runs[1]["promotion"])
    assert dropped(store) == before


# -- Celery ---------------------------------------------------------------------------------------------------------


@pytest.fixture(params=[("amqp", True), ("amqp", False), ("sqs", True)], ids=str)
def celery_env(request: pytest.FixtureRequest, unique: str) -> Iterator[CeleryEnv]:
    kind, once = request.param
    env = env_for(kind, request, unique, options={"once": once, "promoter": False, "lease": 10})
    try:
        # prefork: the tasks are wrapped in the worker before its pool processes are forked.
        env.start_worker(concurrency=2, extra=["--pool", "prefork"])
        yield env
    finally:
        env.close()


def celery_promoter(env: CeleryEnv) -> Callable[..., Promoter]:
    return lambda **overrides: build_promoter(env.app, **overrides)


def test_celery_a_promotion_delivered_twice_runs_once(celery_env: CeleryEnv) -> None:
    env = celery_env
    once = json.loads(env.env["DBT_OPTIONS"])["delay_broker"]["once"]
    # 2 s, not just above the 1 s threshold: a producer's first publish on SQS waits for the queue's creation,
    # and what is left of the countdown when the transport sees the task is what counts.
    # Bound and unbound tasks alike (the check reads the request from the task object).
    tasks = [env.task("record" if n % 2 else "record_plain") for n in range(COPIES)]
    ids = [task.apply_async(args=(f"dup-{n}",), countdown=2.0).id for n, task in enumerate(tasks)]
    assert env.store.stats().parked == COPIES
    time.sleep(2.1)
    promote_twice(env.store, celery_promoter(env), COPIES)
    expected = 1 if once else 2
    wait_for(lambda: sum(env.run_counts()[id] for id in ids) >= COPIES * expected, 60, "the runs")
    if once:
        wait_for(lambda: dropped(env.store) == COPIES, 60, f"{COPIES} second copies dropped")
    time.sleep(2.0)
    assert {id: env.run_counts()[id] for id in ids} == dict.fromkeys(ids, expected)
    assert dropped(env.store) == (COPIES if once else 0)
    assert env.queue_depth() == 0  # the dropped copies were acknowledged, not left in the queue
    if once:
        log = "".join(worker.text() for worker in env.workers)
        assert sum(f"Dropped a second delivery of message {id} " in log for id in ids) == COPIES, log[-3000:]
    assert all((run["promotion"] is not None) == once for id in ids for run in env.runs(id))


def test_celery_a_retry_of_a_promoted_task_runs_again(celery_env: CeleryEnv) -> None:
    """``self.retry()`` sends the same task id again, with the next retry count: not a duplicate."""
    env = celery_env
    result = env.task("retry_once").apply_async(args=("retry", 0.2), countdown=2.0)
    assert env.store.get(result.id) is not None  # parked
    promoter = build_promoter(env.app, max_idle=0.2, lease=10).start()
    try:
        wait_for(lambda: len(env.runs(result.id)) >= 2, 60, "the retry ran")
    finally:
        promoter.stop()
    time.sleep(1.0)
    runs = env.runs(result.id)
    assert [run["retries"] for run in runs] == [0, 1]
    if json.loads(env.env["DBT_OPTIONS"])["delay_broker"]["once"]:
        # Celery's retry carries the task's headers, the promotion token too: the retry count tells them apart.
        assert runs[0]["promotion"] is not None and runs[1]["promotion"] == runs[0]["promotion"]
    else:
        assert [run["promotion"] for run in runs] == [None, None]
    assert dropped(env.store) == 0
