"""DelayMiddleware on a StubBroker with an in-process dramatiq.Worker, against the session's real redis-server.

Every test builds its own broker, queue and store namespace. The threshold is 1 s and delays are a few
seconds, so the promoter thread started by the worker boot hook does the promoting.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.stub import StubBroker
from dramatiq.errors import QueueNotFound, Retry
from redis.backoff import NoBackoff
from redis.retry import Retry as RedisRetry

from delay_broker import ConfigurationError, DelayStore, Envelope, InvalidDelay, PayloadTooLarge, StoreUnavailable
from delay_broker.cron import occurrence_id
from delay_broker.dramatiq import DEFAULT_THRESHOLD, DelayMiddleware, build_promoter, delay_ms
from delay_broker.embedded import free_port

from .helpers import running_worker, wait_for


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class App:
    """A StubBroker with the middleware and two actors on a queue of this test's own."""

    broker: StubBroker
    middleware: DelayMiddleware
    queue: str
    runs: list[tuple[str, int]] = field(default_factory=list)
    actors: dict[str, dramatiq.Actor[Any, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ran(self, token: str) -> list[int]:
        with self.lock:
            return [at for name, at in self.runs if name == token]

    def queued(self) -> int:
        """Messages sitting in the broker's queue and its delay queue."""
        return sum(self.broker.queues[name].qsize() for name in (self.queue, f"{self.queue}.DQ"))


def make_app(client: redis.Redis, namespace: str, **options: Any) -> App:
    broker = StubBroker()
    broker.emit_after("process_boot")
    options.setdefault("threshold", 1)
    middleware = DelayMiddleware(client=client, namespace=namespace, max_idle=0.5, lease=5, **options)
    broker.add_middleware(middleware)
    app = App(broker, middleware, f"q{uuid.uuid4().hex[:8]}")
    attempts: dict[str, int] = {}

    @dramatiq.actor(broker=broker, queue_name=app.queue, actor_name=f"record_{app.queue}")
    def record(token: str) -> None:
        with app.lock:
            app.runs.append((token, now_ms()))

    @dramatiq.actor(
        broker=broker,
        queue_name=app.queue,
        actor_name=f"flaky_{app.queue}",
        max_retries=1,
        min_backoff=2000,
        max_backoff=2500,
    )
    def flaky(token: str, retry_delay: int | None = None) -> None:
        attempts[token] = attempts.get(token, 0) + 1
        with app.lock:
            app.runs.append((token, now_ms()))
        if attempts[token] == 1:
            if retry_delay is not None:
                raise Retry(delay=retry_delay)
            raise RuntimeError("first attempt fails")

    app.actors.update(record=record, flaky=flaky)
    return app


@pytest.fixture
def app(client: redis.Redis, namespace: str) -> App:
    return make_app(client, namespace)


@pytest.fixture
def worker(app: App) -> Iterator[dramatiq.Worker]:
    with running_worker(app.broker) as worker:
        yield worker


def send(app: App, token: str, **options: Any) -> dramatiq.Message[Any]:
    return app.actors["record"].send_with_options(args=(token,), **options)


def test_long_delay_is_parked_and_runs_once_after_due(app: App, worker: dramatiq.Worker) -> None:
    before = now_ms()
    message = send(app, "long", delay=1500)
    info = app.middleware.get(message.message_id)
    assert info is not None and info.state == "due" and info.due_ms is not None
    assert before + 1500 <= info.due_ms <= now_ms() + 1500 + 5
    assert app.queued() == 0  # not in the queue, not in .DQ: no worker holds it
    assert message.queue_name == app.queue and "eta" not in message.options
    parked = app.middleware.parked_message(message.message_id)
    assert parked is not None and parked.args == ("long",) and parked.queue_name == app.queue

    wait_for(lambda: app.ran("long"), timeout=15)
    time.sleep(0.5)
    runs = app.ran("long")
    assert len(runs) == 1
    assert runs[0] >= info.due_ms - 1  # Redis TIME has ms resolution; the run is never early
    # StubBroker promotion is at-least-once: acknowledged after the enqueue, so possibly after the run.
    wait_for(lambda: app.middleware.get(message.message_id) is None, timeout=10)


def test_short_delay_takes_the_native_path(app: App, worker: dramatiq.Worker) -> None:
    message = send(app, "short", delay=300)
    assert app.middleware.get(message.message_id) is None
    assert message.queue_name == f"{app.queue}.DQ" and "eta" in message.options  # Dramatiq's own delay
    wait_for(lambda: app.ran("short"), timeout=10)
    assert app.middleware.store.stats().counters.get("parked", 0) == 0


def test_delay_none_and_zero_are_passed_through(app: App) -> None:
    assert send(app, "none").queue_name == app.queue
    assert send(app, "zero", delay=0).queue_name == f"{app.queue}.DQ"  # as without the middleware
    assert app.middleware.store.stats().parked == 0
    assert app.queued() == 2


def test_threshold_is_inclusive_and_zero_parks_everything(client: redis.Redis, namespace: str) -> None:
    app = make_app(client, namespace)
    assert app.middleware.get(send(app, "edge", delay=1000).message_id) is None
    assert app.middleware.get(send(app, "over", delay=1001).message_id) is not None
    eager = make_app(client, f"{namespace}-0", threshold=0)
    assert eager.middleware.get(send(eager, "one-ms", delay=1).message_id) is not None
    assert eager.middleware.get(send(eager, "zero", delay=0).message_id) is None


def test_cancel_before_due_never_runs(app: App, worker: dramatiq.Worker) -> None:
    message = send(app, "cancelled", delay=1500)
    assert app.middleware.cancel(message.message_id) is True
    assert app.middleware.cancel(message) is False
    send(app, "sentinel", delay=1500)  # parked later, due later: once it ran, the cancelled one was due
    wait_for(lambda: app.ran("sentinel"), timeout=15)
    time.sleep(0.3)
    assert app.ran("cancelled") == []


def test_thirty_days_rescheduled_to_now_runs_once(app: App, worker: dramatiq.Worker) -> None:
    before = now_ms()
    message = send(app, "month", delay=timedelta(days=30))
    info = app.middleware.get(message)
    month = 30 * 86_400_000
    assert info is not None and info.due_ms is not None
    assert before + month <= info.due_ms <= now_ms() + month + 5
    new_due = app.middleware.reschedule(message, delay=0)
    assert new_due is not None and abs(new_due.timestamp() * 1000 - now_ms()) < 2000
    wait_for(lambda: app.ran("month"), timeout=10)
    time.sleep(0.3)
    assert len(app.ran("month")) == 1
    assert app.middleware.reschedule(message, delay=0) is None  # promoted: nothing left to move


@pytest.mark.parametrize("retry_delay", [None, 1500], ids=["backoff", "Retry-delay"])
def test_retry_above_threshold_is_parked_and_runs(app: App, worker: dramatiq.Worker, retry_delay: int | None) -> None:
    message = app.actors["flaky"].send("flaky", retry_delay)
    wait_for(lambda: (info := app.middleware.get(message)) is not None and info.state == "due", timeout=15)
    info = app.middleware.get(message)
    assert info is not None and info.due_ms is not None
    assert app.queued() == 0  # the retry is not held in worker memory
    parked = app.middleware.parked_message(message)
    assert parked is not None and parked.options["retries"] == 1 and "eta" not in parked.options
    wait_for(lambda: len(app.ran("flaky")) == 2, timeout=15)
    _first, second = app.ran("flaky")
    assert second >= info.due_ms - 1
    assert app.broker.dead_letters == []


@pytest.mark.parametrize(
    "delay",
    [-1, -5000, "5000", float("nan"), float("inf"), True, b"1", [1], timedelta(seconds=-1), 10**20],
    ids=repr,
)
def test_invalid_delays_fail_at_the_call_site(app: App, delay: Any) -> None:
    with pytest.raises(InvalidDelay):
        send(app, "bad", delay=delay)
    assert app.middleware.store.stats().parked == 0
    assert app.queued() == 0


def test_unknown_queue_fails_at_the_call_site(app: App) -> None:
    message: dramatiq.Message[Any] = dramatiq.Message(
        queue_name="undeclared", actor_name="nobody", args=(), kwargs={}, options={}
    )
    with pytest.raises(QueueNotFound):
        app.broker.enqueue(message, delay=60_000)
    assert app.middleware.store.stats().parked == 0


def test_delay_units() -> None:
    assert delay_ms(1500) == 1500
    assert delay_ms(1500.2) == 1501
    assert delay_ms(Decimal("2.5")) == 3
    assert delay_ms(timedelta(seconds=1, microseconds=1)) == 1001
    assert delay_ms(timedelta(days=30)) == 30 * 86_400_000
    assert DelayMiddleware(threshold=timedelta(minutes=2)).threshold == timedelta(minutes=2)
    assert DelayMiddleware(threshold=1.5).threshold == timedelta(seconds=1.5)
    assert DelayMiddleware().threshold == DEFAULT_THRESHOLD == timedelta(seconds=60)


@pytest.mark.parametrize("threshold", [-1, "60", float("nan"), True])
def test_invalid_threshold_is_refused(threshold: Any) -> None:
    with pytest.raises(ConfigurationError):
        DelayMiddleware(threshold=threshold)


def test_configuration_errors(client: redis.Redis) -> None:
    with pytest.raises(ConfigurationError):
        DelayMiddleware(redis_url="redis://localhost", client=client)
    broker = StubBroker()
    broker.declare_queue("default")
    with pytest.raises(ConfigurationError):
        broker.add_middleware(DelayMiddleware(client=client, direct=True))
    storeless = StubBroker()
    storeless.add_middleware(DelayMiddleware())
    actor = dramatiq.actor(broker=storeless, queue_name="default")(lambda: None)
    with pytest.raises(ConfigurationError, match="redis_url"):
        actor.send_with_options(delay=120_000)


@pytest.mark.parametrize("add_first", [True, False], ids=["middleware-first", "actors-first"])
def test_producer_only_process_parks(client: redis.Redis, namespace: str, add_first: bool) -> None:
    """No worker in this process: the wrapper is installed by the declaration hooks alone."""
    broker = StubBroker()
    middleware = DelayMiddleware(client=client, namespace=namespace, threshold=1)
    if add_first:
        broker.add_middleware(middleware)
    actor = dramatiq.actor(broker=broker, queue_name="producer", actor_name="produce")(lambda n: None)
    if not add_first:
        broker.add_middleware(middleware)
    message = actor.send_with_options(args=(1,), delay=5000)
    info = middleware.get(message)
    assert info is not None and info.state == "due"
    assert broker.queues["producer"].qsize() == broker.queues["producer.DQ"].qsize() == 0

    # The standalone promoter (delay-broker promote --dramatiq) delivers through the broker's enqueue.
    middleware.reschedule(message, delay=0)
    promoter = build_promoter(broker, max_idle=0.1)
    promoter.step()
    assert broker.queues["producer"].qsize() == 1
    delivered = dramatiq.Message.decode(broker.queues["producer"].get_nowait())
    assert delivered.message_id == message.message_id and "eta" not in delivered.options
    assert middleware.get(message) is None


def test_unknown_route_and_foreign_envelopes_are_dead_lettered(app: App) -> None:
    store = app.middleware.store
    payload = dramatiq.Message(queue_name="evil", actor_name="x", args=(), kwargs={}, options={}).encode()
    store.park("crafted", Envelope(route="evil", payload=payload, framework="dramatiq"), delay=0)
    store.park("celery", Envelope(route=app.queue, payload=b"{}", framework="celery"), delay=0)
    store.park("garbage", Envelope(route=app.queue, payload=b"\x00not json", framework="dramatiq"), delay=0)
    build_promoter(app.broker).step()
    dead = {info.id: info.error for info in store.list_messages("dead")}
    assert set(dead) == {"crafted", "celery", "garbage"}
    assert "unknown queue" in (dead["crafted"] or "")
    assert app.queued() == 0


def test_store_outage_keeps_a_retry_and_reports_a_send() -> None:
    """Retries calls enqueue inside the worker, where an exception would lose the message: fall back."""
    no_retry = RedisRetry(NoBackoff(), 0)
    down = redis.Redis(port=free_port(), socket_connect_timeout=0.2, socket_timeout=0.2, retry=no_retry)
    broker = StubBroker()
    broker.add_middleware(DelayMiddleware(client=down, threshold=1))
    actor = dramatiq.actor(broker=broker, queue_name="outage", actor_name="outage")(lambda: None)
    with pytest.raises(StoreUnavailable):
        actor.send_with_options(delay=5000)
    message = actor.message()
    broker.enqueue(dramatiq.MessageProxy(message), delay=5000)  # type: ignore[arg-type]  # as Retries does
    assert broker.queues["outage.DQ"].qsize() == 1


def test_a_retry_the_store_refuses_for_any_reason_is_kept(client: redis.Redis, namespace: str) -> None:
    """Not only an outage: a full Redis, a read-only replica or a payload over the limit must not lose it."""
    broker = StubBroker()
    broker.add_middleware(
        DelayMiddleware(client=client, namespace=namespace, threshold=1, store_options={"max_payload_bytes": 10})
    )
    actor = dramatiq.actor(broker=broker, queue_name="refused", actor_name="refused")(lambda: None)
    with pytest.raises(PayloadTooLarge):
        actor.send_with_options(delay=5000)
    broker.enqueue(dramatiq.MessageProxy(actor.message()), delay=5000)  # type: ignore[arg-type]  # as Retries does
    assert broker.queues["refused.DQ"].qsize() == 1


def test_a_pipeline_stage_the_store_refuses_is_handed_to_the_broker(client: redis.Redis, namespace: str) -> None:
    """Pipelines enqueue the next stage inside the worker's after_process_message, where Dramatiq swallows any
    exception: a refused park must not lose the stage (here: beyond max_delay)."""
    app = make_app(client, namespace, store_options={"max_delay": 2})
    worker = dramatiq.Worker(app.broker, worker_timeout=100, worker_threads=2)
    worker.start()
    try:
        record = app.actors["record"]
        first = record.message("first")
        second = record.message_with_options(args=("second",), delay=3000, pipe_ignore=True)
        dramatiq.pipeline([first, second], broker=app.broker).run()
        wait_for(lambda: app.ran("second"), timeout=20)
    finally:
        worker.stop(timeout=5000)
    assert app.ran("second")[0] - app.ran("first")[0] >= 2900, "with its delay, held by the broker"
    assert app.middleware.store.stats().parked == 0


def test_a_retry_with_a_delay_already_past_runs_again(app: App, worker: dramatiq.Worker) -> None:
    """Retry(delay=-500), from a "retry at T" computed a moment too late: plain Dramatiq runs it at once; the
    store's refusal of a negative delay must not lose it inside Retries."""
    app.actors["flaky"].send("past", -500)
    wait_for(lambda: len(app.ran("past")) == 2, timeout=15)


def test_flushing_a_queue_drops_the_messages_parked_for_it(client: redis.Redis, namespace: str) -> None:
    """A test suite's teardown (``broker.flush_all()``) drops delayed messages: parked ones must go too, or
    they run in a later test."""
    app = make_app(client, namespace)
    other = dramatiq.actor(broker=app.broker, queue_name="elsewhere", actor_name=f"other_{app.queue}")(lambda: None)
    send(app, "parked", delay=60_000)
    kept = other.send_with_options(delay=60_000)
    app.broker.flush(f"{app.queue}.DQ")  # the delay queue's name: the same queue's delayed messages
    assert [info.id for info in app.middleware.store.list_messages()] == [kept.message_id]
    send(app, "again", delay=60_000)
    app.broker.flush_all()
    assert app.middleware.store.stats().parked == 0


def test_a_flush_never_fails_on_the_store(caplog: pytest.LogCaptureFixture) -> None:
    """Without a store nothing was parked; with its Redis down the broker's queues are flushed all the same."""
    no_retry = RedisRetry(NoBackoff(), 0)
    down = redis.Redis(port=free_port(), socket_connect_timeout=0.2, socket_timeout=0.2, retry=no_retry)
    for middleware in (DelayMiddleware(), DelayMiddleware(client=down, threshold=1)):
        broker = StubBroker()
        broker.add_middleware(middleware)
        actor = dramatiq.actor(broker=broker, queue_name="q", actor_name="a")(lambda: None)
        actor.send_with_options(delay=500)  # below the threshold: held by the broker
        actor.send()
        with caplog.at_level(logging.WARNING, logger="delay_broker.dramatiq"):
            broker.flush_all()
        assert broker.queues["q"].qsize() == broker.queues["q.DQ"].qsize() == 0
    warned = [record.getMessage() for record in caplog.records if "stay parked" in record.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("Flushing 'q': the messages parked for it stay parked")


def test_one_middleware_per_broker(client: redis.Redis, namespace: str) -> None:
    first, second = StubBroker(), StubBroker()
    middleware = DelayMiddleware(client=client, namespace=namespace)
    middleware.install(first)
    with pytest.raises(ConfigurationError):
        middleware.install(second)
    with pytest.raises(ConfigurationError):
        DelayMiddleware(client=client, namespace=namespace).install(first)


def test_promoter_thread_follows_the_worker(app: App) -> None:
    stats: Callable[[], int] = lambda: app.middleware.store.stats().live_promoters  # noqa: E731
    worker = dramatiq.Worker(app.broker, worker_timeout=100, worker_threads=1)
    worker.start()
    try:
        wait_for(lambda: stats() == 1, timeout=5)
    finally:
        worker.stop(timeout=5000)
    assert stats() == 0
    off = make_app(app.middleware.store.client, f"{app.middleware.namespace}-off", promote_in_workers=False)
    worker = dramatiq.Worker(off.broker, worker_timeout=100, worker_threads=1)
    worker.start()
    try:
        time.sleep(0.3)
        assert off.middleware.store.stats().live_promoters == 0
    finally:
        worker.stop(timeout=5000)


def test_worker_promoter_counts_in_prometheus_metrics(client: redis.Redis, namespace: str) -> None:
    from prometheus_client import REGISTRY

    app = make_app(client, namespace, metrics=True)
    worker = dramatiq.Worker(app.broker, worker_timeout=100, worker_threads=1)
    worker.start()
    try:
        send(app, "counted", delay=1500)
        wait_for(lambda: app.ran("counted"), timeout=10)
    finally:
        worker.stop(timeout=5000)
    assert REGISTRY.get_sample_value("delay_broker_promoted_total", {"namespace": namespace}) == 1
    assert REGISTRY.get_sample_value("delay_broker_promotion_lateness_seconds_count", {"namespace": namespace}) == 1


def test_redis_broker_direct_promotion(redis_server: Any, namespace: str) -> None:
    """RedisBroker sharing the store's Redis: exactly-once script into ``<ns>:<queue>`` + ``.msgs``."""
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(client=redis_server.client(), namespace=f"dq-{namespace}")  # type: ignore[no-untyped-call]
    middleware = DelayMiddleware(namespace=namespace, threshold=1, max_idle=0.5)
    broker.add_middleware(middleware)
    runs: list[str] = []

    # A function, not runs.append: dramatiq before 1.18 cannot take a builtin method as an actor.
    def record(value: str) -> None:
        runs.append(value)

    actor = dramatiq.actor(broker=broker, queue_name="direct", actor_name="direct")(record)
    assert middleware.is_direct and isinstance(middleware.store, DelayStore)
    message = actor.send_with_options(args=("x",), delay=1200)
    info = middleware.get(message)
    assert info is not None and info.envelope is not None
    assert info.envelope.hash_field == message.options["redis_message_id"]
    client = broker.client
    assert client.llen(f"dq-{namespace}:direct") == client.llen(f"dq-{namespace}:direct.DQ") == 0
    worker = dramatiq.Worker(broker, worker_timeout=100, worker_threads=1)
    worker.start()
    try:
        wait_for(lambda: runs == ["x"], timeout=15)
        time.sleep(0.3)
        assert runs == ["x"]
        wait_for(lambda: client.hlen(f"dq-{namespace}:direct.msgs") == 0, timeout=5)  # acked cleanly
    finally:
        worker.stop(timeout=5000)
        broker.close()
    assert math.isclose(middleware.threshold.total_seconds(), 1.0)


def test_a_pipeline_stage_for_a_queue_only_another_service_declares_goes_to_the_broker(
    redis_server: Any, namespace: str
) -> None:
    """RedisBroker (and RabbitMQ) take a message for a queue this process never declared, served by another
    service. A producer is told the store cannot park it; a pipeline's next stage, sent where Dramatiq swallows
    the error, goes to the broker as plain Dramatiq sends it, rather than being lost."""
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(client=redis_server.client(), namespace=f"dq-{namespace}")  # type: ignore[no-untyped-call]
    middleware = DelayMiddleware(namespace=namespace, threshold=1, promote_in_workers=False)
    broker.add_middleware(middleware)
    stage = dramatiq.actor(broker=broker, queue_name="local", actor_name="stage")(lambda: None)
    theirs = {"queue_name": "elsewhere", "actor_name": "theirs", "args": (), "kwargs": {}}
    with pytest.raises(QueueNotFound):
        broker.enqueue(dramatiq.Message(**theirs, options={}), delay=5000)
    client = broker.client
    worker = dramatiq.Worker(broker, worker_timeout=100, worker_threads=1)
    worker.start()
    try:
        next_stage = dramatiq.Message(**theirs, options={"delay": 5000, "pipe_ignore": True})
        dramatiq.pipeline([stage.message(), next_stage], broker=broker).run()
        wait_for(lambda: client.llen(f"dq-{namespace}:elsewhere.DQ") == 1, timeout=15)
    finally:
        worker.stop(timeout=5000)
        client.delete(*client.keys(f"dq-{namespace}:*"))
        broker.close()
    assert middleware.store.stats().parked == 0


@pytest.mark.parametrize(("configured", "expected"), [(None, 900), (3600, 900), (120, 120)])
def test_sqs_threshold_defaults_to_and_never_exceeds_900_seconds(
    client: redis.Redis, configured: float | None, expected: int
) -> None:
    from dramatiq_sqs import SQSBroker

    # Creating the boto3 resource makes no request; nothing is sent in this test.
    broker = SQSBroker(namespace="unused", endpoint_url="http://127.0.0.1:9", region_name="us-east-1")
    middleware = DelayMiddleware(client=client, threshold=configured)
    broker.add_middleware(middleware)
    # Installed by hand rather than by declaring an actor: dramatiq-sqs before 0.4 creates the queue in SQS
    # when an actor is declared, and nothing here may reach a server.
    middleware.install(broker)
    assert middleware.threshold == timedelta(seconds=expected)


# -- recurring schedules -------------------------------------------------------------------------------------------


def test_a_schedule_runs_its_actor_at_every_occurrence_once(app: App) -> None:
    schedule = app.middleware.schedule(app.actors["record"], "* * * * * */2", args=("cron",), name="tick")
    assert app.middleware.schedules == {"tick": schedule}
    # Two workers on one broker: two promoters offer every occurrence.
    workers = [dramatiq.Worker(app.broker, worker_timeout=100, worker_threads=1) for _ in range(2)]
    for worker in workers:
        worker.start()
    try:
        # The next occurrence is parked in the cycle after one was promoted: wait for that too.
        wait_for(lambda: len(app.ran("cron")) >= 3 and app.middleware.store.stats().parked == 1, timeout=20)
    finally:
        for worker in workers:
            worker.stop(timeout=5000)
    runs = app.ran("cron")
    due_times = app.middleware.store.schedules()
    # Each promotion is one occurrence (parked once whatever the number of promoters), and each ran once.
    assert len(runs) == app.middleware.store.stats().counters["promoted"]
    assert due_times["tick"] > max(runs), "the next occurrence is already parked"
    # Created at its due time, so that AgeLimit (max_age) counts from when it was meant to run.
    parked = app.middleware.parked_message(occurrence_id(app.middleware.namespace, "tick", due_times["tick"]))
    assert parked is not None and parked.message_timestamp == due_times["tick"]


def test_bad_schedules_are_refused_when_declared(app: App) -> None:
    record = app.actors["record"]
    with pytest.raises(ConfigurationError, match="not a valid cron expression"):
        app.middleware.schedule(record, "every morning")
    with pytest.raises(ConfigurationError, match="unknown time zone"):
        app.middleware.schedule(record, "0 9 * * *", timezone="Nowhere/Special")
    app.middleware.schedule(record, "0 9 * * *", args=("a",))
    with pytest.raises(ConfigurationError, match="give this one a name"):
        app.middleware.schedule(record, "0 10 * * *", args=("b",))
    # Arguments the encoder cannot carry fail here, not in a worker at the first occurrence.
    with pytest.raises(TypeError):
        app.middleware.schedule(record, "0 11 * * *", args=(object(),), name="unencodable")
    assert set(app.middleware.schedules) == {record.actor_name}
