"""A worker with DelayMiddleware that receives a delayed message from the broker (sent by plain Dramatiq, or
before delay_broker was turned on) parks it and acknowledges it instead of holding it in memory.

A StubBroker and an in-process ``dramatiq.Worker`` against the session's redis-server; the plain sends go through
``StubBroker.enqueue`` itself, as a producer without the middleware sends them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.stub import StubBroker
from redis.backoff import NoBackoff
from redis.retry import Retry as RedisRetry

from delay_broker.dramatiq import DelayMiddleware
from delay_broker.embedded import free_port

from .helpers import running_worker, wait_for
from .test_dramatiq_stub import App, make_app, now_ms


def send_plain(app: App, token: str, delay: int) -> dramatiq.Message[Any]:
    """What a producer without delay_broker sends: Dramatiq's own delay, the message in ``<queue>.DQ``."""
    message = app.actors["record"].message(token)
    sent: dramatiq.Message[Any] = StubBroker.enqueue(app.broker, message, delay=delay)
    return sent


def held_in_memory(worker: dramatiq.Worker, queue: str) -> int:
    """Messages the worker's consumer of ``<queue>.DQ`` holds in its in-memory delay queue."""
    return int(worker.consumers[f"{queue}.DQ"].delay_queue.qsize())


@pytest.fixture
def app(client: redis.Redis, namespace: str) -> App:
    return make_app(client, namespace)


@pytest.fixture
def worker(app: App) -> Iterator[dramatiq.Worker]:
    with running_worker(app.broker) as worker:
        yield worker


def test_a_received_message_due_later_than_the_threshold_is_parked_not_held(app: App) -> None:
    sent = [send_plain(app, f"plain-{n}", delay=2500) for n in range(20)]
    assert app.middleware.store.stats().parked == 0 and app.queued() == 20
    worker = dramatiq.Worker(app.broker, worker_timeout=100, worker_threads=2)
    worker.start()
    try:
        wait_for(lambda: app.middleware.store.stats().parked == 20, timeout=10)
        wait_for(lambda: app.queued() == 0 and held_in_memory(worker, app.queue) == 0, timeout=5)
        for message in sent:
            info = app.middleware.get(message.message_id)
            assert info is not None and info.due_ms == message.options["eta"]  # same id, same due time
            parked = app.middleware.parked_message(message.message_id)
            # As it will be enqueued when due: the canonical queue, no eta.
            assert parked is not None and parked.queue_name == app.queue and "eta" not in parked.options
            assert parked.args == message.args
        wait_for(lambda: all(app.ran(f"plain-{n}") for n in range(20)), timeout=15)
        time.sleep(0.5)
        for message in sent:
            runs = app.ran(message.args[0])
            assert len(runs) == 1 and runs[0] >= message.options["eta"]
    finally:
        worker.stop(timeout=5000)


def test_a_received_message_due_within_the_threshold_is_held_as_dramatiq_holds_it(
    app: App, worker: dramatiq.Worker
) -> None:
    message = send_plain(app, "short", delay=600)
    wait_for(lambda: app.ran("short"), timeout=10)
    assert app.middleware.get(message.message_id) is None
    assert app.middleware.store.stats().counters.get("parked", 0) == 0
    assert len(app.ran("short")) == 1 and app.ran("short")[0] >= message.options["eta"]


def test_a_redelivery_of_a_message_already_parked_parks_nothing_twice(app: App) -> None:
    """A worker killed between the park and the acknowledgement: the broker delivers the message again, and the
    park keeps what the store holds."""
    message = send_plain(app, "again", delay=2000)
    parked = app.middleware.park(app.actors["record"].message_with_options(args=("again",)), delay=2000)
    # The earlier worker's park, under the received message's id.
    app.middleware.store.cancel(parked.message_id)
    app.middleware.park(_with_id(parked, message.message_id), delay=2000)
    due_before = app.middleware.get(message.message_id)
    assert due_before is not None
    worker = dramatiq.Worker(app.broker, worker_timeout=100, worker_threads=2)
    worker.start()
    try:
        wait_for(lambda: app.queued() == 0 and held_in_memory(worker, app.queue) == 0, timeout=10)
        info = app.middleware.get(message.message_id)
        assert info is not None and info.due_ms == due_before.due_ms  # kept, not replaced
        assert app.middleware.store.stats().parked == 1
        wait_for(lambda: app.ran("again"), timeout=10)
        time.sleep(0.5)
        assert len(app.ran("again")) == 1
    finally:
        worker.stop(timeout=5000)


def _with_id(message: dramatiq.Message[Any], message_id: str) -> dramatiq.Message[Any]:
    import dataclasses

    return dataclasses.replace(message, message_id=message_id)


def test_a_store_that_cannot_be_reached_leaves_the_message_to_dramatiq(caplog: pytest.LogCaptureFixture) -> None:
    no_retry = RedisRetry(NoBackoff(), 0)
    down = redis.Redis(port=free_port(), socket_connect_timeout=0.2, socket_timeout=0.2, retry=no_retry)
    broker = StubBroker()
    broker.emit_after("process_boot")
    broker.add_middleware(DelayMiddleware(client=down, threshold=1, promote_in_workers=False))
    runs: list[int] = []
    actor = dramatiq.actor(broker=broker, queue_name="outage", actor_name="outage")(lambda: runs.append(now_ms()))
    message = StubBroker.enqueue(broker, actor.message(), delay=1500)
    worker = dramatiq.Worker(broker, worker_timeout=100, worker_threads=1)
    with caplog.at_level(logging.WARNING, logger="delay_broker.dramatiq"):
        worker.start()
        try:
            wait_for(lambda: runs, timeout=10)
        finally:
            worker.stop(timeout=5000)
    assert "the worker holds it until due" in caplog.text
    assert len(runs) == 1 and runs[0] >= message.options["eta"]
