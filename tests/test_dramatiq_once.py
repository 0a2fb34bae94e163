"""OnceMiddleware on a StubBroker (at-least-once promotion through the broker's ``enqueue``) with an in-process
dramatiq.Worker, against the session's real redis-server.

A promoter killed between its publish and its acknowledgement is played by hand: the test claims the due
messages under a short lease and delivers them without acknowledging; once the lease has run out a real promoter
delivers them again. The real workers on RabbitMQ and SQS are in integration/test_once.py.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import CurrentMessage

from delay_broker import ConfigurationError, DelayStore
from delay_broker.dramatiq import DelayMiddleware, OnceMiddleware
from delay_broker.once import DROPPED_COUNTER, PROMOTION_MARK

from .helpers import running_worker, wait_for


@dataclass
class App:
    broker: StubBroker
    delays: DelayMiddleware
    runs: list[dict[str, Any]] = field(default_factory=list)
    actors: dict[str, dramatiq.Actor[Any, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def store(self) -> DelayStore:
        return self.delays.store

    def ran(self, token: str) -> list[dict[str, Any]]:
        with self.lock:
            return [run for run in self.runs if run["token"] == token]

    def dropped(self) -> int:
        return self.store.stats().counters.get(DROPPED_COUNTER, 0)


def make_app(client: redis.Redis, namespace: str, *, once: bool) -> App:
    broker = StubBroker()
    broker.emit_after("process_boot")
    delays = DelayMiddleware(client=client, namespace=namespace, threshold=1, promote_in_workers=False)
    broker.add_middleware(CurrentMessage())
    broker.add_middleware(delays)
    if once:
        broker.add_middleware(OnceMiddleware(window=60))
    app = App(broker, delays)
    queue = f"q{uuid.uuid4().hex[:8]}"

    def record(token: str) -> int:
        message = CurrentMessage.get_current_message()
        assert message is not None
        retries = int(message.options.get("retries", 0))
        run = {"token": token, "retries": retries, "promotion": message.options.get(PROMOTION_MARK)}
        with app.lock:
            app.runs.append(run)
        return retries

    @dramatiq.actor(broker=broker, queue_name=queue, actor_name=f"record_{queue}")
    def plain(token: str) -> None:
        record(token)

    @dramatiq.actor(broker=broker, queue_name=queue, actor_name=f"short_{queue}", max_retries=1, min_backoff=50)
    def fails_then_retries_at_once(token: str) -> None:
        if record(token) == 0:
            raise RuntimeError("first attempt fails")

    # A first retry's backoff is 2.1-4.2 s on current Dramatiq (exponent 1, jitter halves) and 1.05-2.1 s on 1.15
    # (exponent 0): above the 1 s threshold on both.
    @dramatiq.actor(
        broker=broker, queue_name=queue, actor_name=f"long_{queue}", max_retries=1, min_backoff=2100, max_backoff=5000
    )
    def fails_then_retries_parked(token: str) -> None:
        if record(token) == 0:
            raise RuntimeError("first attempt fails")

    app.actors.update(plain=plain, short=fails_then_retries_at_once, long=fails_then_retries_parked)
    return app


@pytest.fixture(params=[True, False], ids=["once", "without"])
def app(request: pytest.FixtureRequest, client: redis.Redis, namespace: str) -> Iterator[App]:
    app = make_app(client, namespace, once=request.param)
    with running_worker(app.broker):
        yield app


def deliver_without_acknowledging(app: App, count: int) -> None:
    """A promoter that delivers the due messages and is killed before it acknowledges them."""
    deliverer = app.delays.deliverer()
    claimed = 0
    deadline = time.monotonic() + 10
    while claimed < count and time.monotonic() < deadline:
        for message in app.store.claim(100, 0.3, "killed-promoter").messages:
            deliverer.deliver(message)  # type: ignore[union-attr]
            claimed += 1
        time.sleep(0.05)
    assert claimed == count


def promote_the_rest(app: App) -> None:
    """A live promoter: the killed one's lease runs out and it delivers those messages again."""
    promoter = app.delays.build_promoter(max_idle=0.1, lease=5).start()
    try:
        wait_for(lambda: app.store.stats().parked + app.store.stats().inflight == 0, 15, "every message promoted")
    finally:
        promoter.stop()


def test_a_promotion_delivered_twice_runs_once_with_the_middleware_and_twice_without(app: App) -> None:
    once = any(isinstance(m, OnceMiddleware) for m in app.broker.middleware)
    tokens = [f"dup-{n}" for n in range(5)]
    for token in tokens:
        app.actors["plain"].send_with_options(args=(token,), delay=1100)
    time.sleep(1.2)
    deliver_without_acknowledging(app, len(tokens))
    promote_the_rest(app)
    expected = 1 if once else 2
    wait_for(lambda: all(len(app.ran(token)) == expected for token in tokens), 15, f"each ran {expected}x")
    if once:
        wait_for(lambda: app.dropped() == len(tokens), 10, "the second copies dropped")
    time.sleep(0.5)
    assert [len(app.ran(token)) for token in tokens] == [expected] * len(tokens)
    assert app.dropped() == (len(tokens) if once else 0)
    promotions = {run["promotion"] for token in tokens for run in app.ran(token)}
    if once:
        assert None not in promotions  # promoters of a broker with the middleware mark what they promote
    else:
        assert promotions == {None}  # without the middleware, promoted messages are not marked


def test_a_framework_retry_of_a_promoted_message_runs_again(app: App) -> None:
    """Retries re-enqueues the same message id: below the threshold with the same promotion token and the next
    retry count, above it parked again (a new token). Neither is dropped."""
    promoter = app.delays.build_promoter(max_idle=0.1, lease=5).start()
    try:
        app.actors["short"].send_with_options(args=("short",), delay=1100)
        app.actors["long"].send_with_options(args=("long",), delay=1100)
        wait_for(lambda: len(app.ran("short")) == 2 and len(app.ran("long")) == 2, 20, "both retries ran")
    finally:
        promoter.stop()
    short, long = app.ran("short"), app.ran("long")
    assert [run["retries"] for run in short] == [0, 1] and [run["retries"] for run in long] == [0, 1]
    if any(isinstance(m, OnceMiddleware) for m in app.broker.middleware):
        assert short[0]["promotion"] is not None and short[0]["promotion"] == short[1]["promotion"]
        assert None not in (long[0]["promotion"], long[1]["promotion"]) and long[0]["promotion"] != long[1]["promotion"]
    assert app.dropped() == 0


def test_messages_the_store_did_not_promote_are_not_checked(app: App) -> None:
    app.actors["plain"].send("plain")
    app.actors["plain"].send_with_options(args=("native",), delay=200)  # below the threshold: not parked
    wait_for(lambda: app.ran("plain") and app.ran("native"), 10, "both ran")
    assert app.ran("plain")[0]["promotion"] is None and app.ran("native")[0]["promotion"] is None
    assert list(app.store.client.scan_iter(app.store.keys.key("once:*"))) == []


def test_the_middleware_needs_a_store(client: redis.Redis, namespace: str) -> None:
    with pytest.raises(ConfigurationError, match="window"):
        OnceMiddleware(window=0)
    broker = StubBroker()
    middleware = OnceMiddleware()
    broker.add_middleware(middleware)
    with pytest.raises(ConfigurationError, match="DelayMiddleware"):
        middleware.executions(broker)
    store = DelayStore(client, namespace=namespace)
    assert OnceMiddleware(store=store).executions(broker).store is store
