"""Fast tests of the Celery adapter against the session's real redis-server (no worker processes)."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from celery import Celery
from celery.utils.time import maybe_iso8601, maybe_make_aware
from kombu import Connection

from delay_broker import ConfigurationError, DelayStore, Envelope
from delay_broker.celery import TRANSPORT_REDIS, build_promoter, cancel, install, parse_options
from delay_broker.celery.config import CHECKS, CeleryOptions
from delay_broker.celery.messages import parse_celery_time
from delay_broker.embedded import EmbeddedRedis

from .celery_apps import celery_app, make_app, store_of
from .helpers import celery_envelope


@pytest.fixture
def unique() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture
def app(redis_server: EmbeddedRedis, unique: str) -> Iterator[Celery]:
    with celery_app(redis_server, unique) as app:
        yield app


# -- options -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"treshold": 5}, "unknown delay_broker option"),
        ({"threshold": "60"}, "'threshold' must be a number"),
        ({"threshold": -1}, "'threshold' must be finite"),
        ({"threshold": True}, "'threshold' must be a number"),
        ({"redis_url": "http://x"}, "unsupported Redis URL .* use redis://"),
        ({"redis_url": "redis://host:99999/0"}, "not a valid Redis URL"),
        ({"redis_url": "redis://host/abc"}, "database must be a number"),
        ({"batch": 0}, "'batch' must be an integer"),
        ({"lease": 0}, "'lease' must be finite and > 0"),
        ({"namespace": "a{b}"}, "namespace"),
        ({"queues": "celery"}, "'queues' must be a list"),
        ({"promoter": "yes"}, "'promoter' must be True or False"),
        ({"metrics_port": "9100"}, "'metrics_port' must be an integer"),
        ({"metrics_port": 70000}, "'metrics_port' must be an integer"),
        ({"max_payload_bytes": 0}, "'max_payload_bytes' must be an integer"),
        ({"pack_after": 5}, "'pack_after' must be finite and >= 10"),
        ({"pack_after": "300"}, "'pack_after' must be a number"),
        ({"promote_ahead": -1}, "'promote_ahead' must be finite and >= 0"),
        ({"promote_ahead": 61}, "'promote_ahead' must be at most 60 s"),
        ("threshold=5", "must be a dict"),
    ],
)
def test_bad_options_are_refused_with_a_clear_message(raw: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_options(raw)


def test_every_option_is_checked_and_takes_its_default() -> None:
    """The table of checks covers every field of CeleryOptions (a field without one would be refused as unknown),
    and each check takes the field's default back as it is."""
    fields = dataclasses.fields(CeleryOptions)
    assert list(CHECKS) == [field.name for field in fields]
    for field in fields:
        assert parse_options({field.name: field.default}) == CeleryOptions(), field.name


def test_default_thresholds_per_transport() -> None:
    options = parse_options({})
    assert (options.threshold_for("sqs"), options.threshold_for("redis"), options.threshold_for("amqp")) == (
        900,
        60,
        60,
    )
    assert parse_options({"threshold": 5}).threshold_for("sqs") == 5
    assert parse_options({"max_payload_bytes": 4_000_000}).store_options()["max_payload_bytes"] == 4_000_000
    assert parse_options({}).store_options()["pack_after"] == 300
    assert parse_options({"pack_after": None}).store_options()["pack_after"] is None


def test_the_promoter_sends_tasks_ahead_and_workers_never_park_what_it_sent(
    app: Celery, redis_server: EmbeddedRedis
) -> None:
    """A worker's promoter sends each task ``promote_ahead`` before its eta (the worker holds it until then); the
    step that parks what workers receive leaves alone a task due within that plus RECEIPT_SLACK, whatever the
    threshold (1 s here): one promoted ahead is never parked again."""
    from delay_broker.celery.config import RECEIPT_SLACK
    from delay_broker.celery.messages import TaskInfo
    from delay_broker.celery.parking import Parker

    promoter = build_promoter(app)
    assert promoter.ahead == 1.0
    assert build_promoter(app, promote_ahead=0).ahead == 0
    parker = Parker(store_of(app, redis_server), threshold=1.0)
    soon = TaskInfo("t", "task", datetime.now(timezone.utc) + timedelta(seconds=3), None)
    later = dataclasses.replace(soon, eta=datetime.now(timezone.utc) + timedelta(seconds=RECEIPT_SLACK + 3))
    assert parker.due_if_parked(soon) == soon.eta, "a producer parks it: 3 s is past the threshold"
    assert parker.due_if_parked(soon, at_least=1.0 + RECEIPT_SLACK) is None, "a worker receiving it holds it"
    assert parker.due_if_parked(later, at_least=1.0 + RECEIPT_SLACK) == later.eta


def test_install_adds_the_promoter_and_the_step_that_parks_what_workers_receive(app: Celery) -> None:
    from delay_broker.celery.bootstep import PromoterStep
    from delay_broker.celery.received import ParkOnReceipt

    assert PromoterStep in app.steps["worker"] and ParkOnReceipt in app.steps["consumer"]


def test_install_fails_at_once_on_bad_configuration(redis_server: EmbeddedRedis) -> None:
    app = Celery("bad", broker=redis_server.url, set_as_current=False)
    with pytest.raises(ConfigurationError, match="unknown delay_broker option"):
        install(app, thresold=5)
    amqp_app = Celery("bad2", broker="amqp://guest@127.0.0.1:1//", set_as_current=False)
    before = (amqp_app.conf.broker_transport, amqp_app.conf.broker_transport_options)
    with pytest.raises(ConfigurationError, match="needs a 'redis_url'"):
        install(amqp_app)
    assert (amqp_app.conf.broker_transport, amqp_app.conf.broker_transport_options) == before, "nothing changed"


def test_transport_refuses_bad_options_when_created(redis_server: EmbeddedRedis) -> None:
    connection = Connection(
        redis_server.url, transport=TRANSPORT_REDIS, transport_options={"delay_broker": {"threshold": "1h"}}
    )
    with pytest.raises(ConfigurationError, match="'threshold' must be a number"):
        connection.transport  # noqa: B018 - creating the transport is what validates


# -- due times ---------------------------------------------------------------------------------------------------


def test_naive_eta_is_read_exactly_as_the_worker_reads_it() -> None:
    naive = "2030-01-01T12:00:00"
    # What celery.worker.request.Request does with the app timezone (Europe/Berlin here):
    worker_view = maybe_make_aware(maybe_iso8601(naive), "Europe/Berlin")
    ours = parse_celery_time(naive)
    assert ours is not None and ours == worker_view
    assert ours == datetime(2030, 1, 1, 12, tzinfo=timezone.utc)  # Celery 5 reads naive values as UTC
    aware = parse_celery_time("2030-01-01T12:00:00+01:00")
    assert aware == datetime(2030, 1, 1, 11, tzinfo=timezone.utc)
    assert parse_celery_time("not a date") is None


@pytest.mark.parametrize(
    "value",
    [
        "2030-01-01T12:00:00.123456+00:00",  # what Celery writes: eta.isoformat()
        "2030-01-01T12:00:00+05:30",
        "2030-01-01T12:00:00.500000",
        "2030-01-01T12:00:00Z",  # not isoformat's own text: dateutil reads it
        "2030-01-01 12:00:00",
        "20300101T120000",
        "2030-01-01T12:00:00.123+00:00",
        "2030-01-01",
    ],
)
def test_every_eta_text_gives_the_instant_celery_reads(value: str) -> None:
    ours = parse_celery_time(value)
    try:
        celery_view = maybe_make_aware(maybe_iso8601(value), timezone.utc)
    except ValueError:  # Celery 5.3 reads with datetime.fromisoformat, which Python 3.10 limits to isoformat's text
        assert ours is None, "a text this Celery's workers cannot read is not parked"
        return
    assert ours is not None and ours == celery_view and ours.utcoffset() == celery_view.utcoffset()


@pytest.mark.parametrize("tz", [None, "Europe/Berlin", "America/New_York"])
def test_countdown_and_eta_give_the_right_due_time(redis_server: EmbeddedRedis, unique: str, tz: str | None) -> None:
    app = make_app(redis_server, unique, tz=tz)
    store = store_of(app, redis_server)
    try:
        add = app.tasks["t.add"]
        before = time.time()
        by_countdown = add.apply_async((1, 2), countdown=120)
        eta = datetime.now(timezone.utc) + timedelta(hours=5)
        by_aware_eta = add.apply_async((1, 2), eta=eta)
        naive_eta = datetime.now(timezone.utc).replace(microsecond=0, tzinfo=None) + timedelta(days=2)
        by_naive_eta = add.apply_async((1, 2), eta=naive_eta)
        by_send_task = app.send_task("t.add", (1, 2), countdown=300)
        by_signature = add.s(1, 2).set(countdown=600).apply_async()
        expected = {
            by_countdown.id: before + 120,
            by_aware_eta.id: eta.timestamp(),
            by_naive_eta.id: naive_eta.replace(tzinfo=timezone.utc).timestamp(),
            by_send_task.id: before + 300,
            by_signature.id: before + 600,
        }
        for task_id, due in expected.items():
            info = store.get(task_id)
            assert info is not None and info.state == "due" and info.due_ms is not None, task_id
            assert abs(info.due_ms / 1000 - due) < 2, (task_id, info.due_ms / 1000 - due)
        short = add.apply_async((1, 2), countdown=0.5)
        assert store.get(short.id) is None
    finally:
        app.close()


# -- parking and promotion on the Redis transport ------------------------------------------------------------------


def test_promotion_pushes_exactly_the_published_message(app: Celery, redis_server: EmbeddedRedis, unique: str) -> None:
    store = store_of(app, redis_server)
    client = redis_server.client()
    low = app.tasks["t.add"].apply_async((1, 2), countdown=60)
    high = app.tasks["t.add"].apply_async((3, 4), countdown=60, priority=7)
    queue = f"p{unique}:q-{unique}"
    assert client.llen(queue) == 0
    stored = {task_id: store.get(task_id) for task_id in (low.id, high.id)}
    assert store.reschedule(low.id, delay=0) is not None and store.reschedule(high.id, delay=0) is not None
    promoter = build_promoter(app)
    promoter.step()
    assert client.lrange(queue, 0, -1) == [stored[low.id].envelope.payload]  # type: ignore[union-attr]
    assert client.lrange(f"{queue}\x06\x166", 0, -1) == [stored[high.id].envelope.payload]  # type: ignore[union-attr]


def test_undeclared_route_is_dead_lettered(app: Celery, redis_server: EmbeddedRedis, unique: str) -> None:
    store = store_of(app, redis_server)
    store.park("crafted", Envelope(route="elsewhere", payload=b"{}", framework="celery"), delay=0)
    build_promoter(app).step()
    info = store.get("crafted")
    assert info is not None and info.state == "dead"
    assert not redis_server.client().exists("elsewhere", f"p{unique}:elsewhere")


def test_cancel_and_revoke_remove_parked_tasks(app: Celery, redis_server: EmbeddedRedis) -> None:
    store = store_of(app, redis_server)
    add = app.tasks["t.add"]
    one, two, three = (add.apply_async((1, 2), countdown=60) for _ in range(3))
    assert cancel(app, one.id) is True and cancel(app, one.id) is False
    app.control.revoke(two.id)
    three.revoke()
    assert store.get(one.id) is None and store.get(two.id) is None and store.get(three.id) is None


def test_a_task_that_expires_before_it_is_due_is_parked_and_logged_at_info(
    app: Celery, redis_server: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="delay_broker.celery"):
        result = app.tasks["t.add"].apply_async((1, 2), countdown=60, expires=30)
    assert store_of(app, redis_server).get(result.id) is not None
    lines = [record for record in caplog.records if "expires at" in record.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO and result.id in lines[0].getMessage()


def test_revoke_of_some_workers_only_keeps_the_task_parked(app: Celery, redis_server: EmbeddedRedis) -> None:
    store = store_of(app, redis_server)
    task = app.tasks["t.add"].apply_async((1, 2), countdown=60)
    app.control.revoke(task.id, destination=["someone@host"])
    app.control.revoke(task.id, pattern="nobody-matches@*", matcher="glob")
    assert store.get(task.id) is not None


def test_a_pickled_revoke_is_never_unpickled_and_says_the_task_stays_parked(
    app: Celery, redis_server: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    app.conf.task_serializer = "pickle"
    app.conf.accept_content = ["json", "pickle"]
    task = app.tasks["t.add"].apply_async((1, 2), countdown=60)
    with caplog.at_level(logging.WARNING, logger="delay_broker.celery"):
        app.control.inspect(timeout=0.1).revoked()  # other control commands say nothing
        assert not caplog.records
        task.revoke()
    assert store_of(app, redis_server).get(task.id) is not None
    assert [record.getMessage() for record in caplog.records if "revoke broadcast is pickled" in record.getMessage()]


def test_disabled_adapter_leaves_celery_alone(redis_server: EmbeddedRedis, unique: str) -> None:
    app = make_app(redis_server, unique, enabled=False)
    try:
        task = app.tasks["t.add"].apply_async((1, 2), countdown=60)
        assert store_of(app, redis_server).get(task.id) is None
        assert redis.Redis.from_url(redis_server.url).llen(f"p{unique}:q-{unique}") == 1
    finally:
        client = redis_server.client()
        client.delete(*client.scan_iter(f"p{unique}:*"))
        app.close()


def test_prioritised_routes_follow_the_transport_separator(client: redis.Redis, namespace: str) -> None:
    from delay_broker.celery.delivery import AllowedRoutes, VirtualRepublisher, redis_priority_routes
    from delay_broker.celery.stores import RouteBook

    routes, sep = redis_priority_routes({"q"}, {"sep": ":", "priority_steps": [0, 5]})
    assert (routes, sep) == ({"q", "q:5"}, ":")
    assert redis_priority_routes({"q"}, {})[0] == {"q", "q\x06\x163", "q\x06\x166", "q\x06\x169"}
    allowed = AllowedRoutes(routes, RouteBook(DelayStore(client, namespace=namespace)))
    publisher = VirtualRepublisher(lambda: None, allowed, sep)
    assert publisher._matches("q", "q:5") and not publisher._matches("q", "q\x06\x165")
    assert not VirtualRepublisher(lambda: None, allowed)._matches("q", "q:5"), "SQS has no priority lists"


# -- recurring schedules -------------------------------------------------------------------------------------------


def test_a_schedule_parks_each_occurrence_as_celery_would_send_it(
    app: Celery, redis_server: EmbeddedRedis, unique: str
) -> None:
    from delay_broker.celery import schedule, schedules_of
    from delay_broker.cron import occurrence_id

    store = store_of(app, redis_server)
    client = redis_server.client()
    queue = f"p{unique}:q-{unique}"
    created = schedule(app, "0 9 * * *", app.tasks["t.add"], args=(2, 3), timezone="Europe/Paris", priority=7)
    assert schedules_of(app) == {"t.add": created}
    promoter = build_promoter(app)
    promoter.step()  # the first look parks the next 09:00 in Paris; nothing is sent now
    assert client.llen(queue) == 0 and client.llen(f"{queue}\x06\x166") == 0
    due_ms = store.schedules()["t.add"]
    assert due_ms is not None and datetime.fromtimestamp(due_ms / 1000, ZoneInfo("Europe/Paris")).hour == 9
    info = store.get(occurrence_id(store.keys.namespace, "t.add", due_ms))
    assert info is not None and info.state == "due" and info.envelope is not None
    message = json.loads(info.envelope.payload)
    headers = message["headers"]
    assert headers["task"] == "t.add" and headers["id"] == info.id
    assert headers["eta"] == datetime.fromtimestamp(due_ms / 1000, timezone.utc).isoformat()
    assert message["properties"]["priority"] == 7

    # When due it is delivered like any parked task: straight into the (priority) queue, once.
    assert store.reschedule(info.id, delay=0) is not None
    promoter.step()
    assert client.lrange(f"{queue}\x06\x166", 0, -1) == [info.envelope.payload]
    assert store.get(info.id) is None


def test_a_schedule_s_relative_expires_counts_from_each_occurrence(app: Celery, redis_server: EmbeddedRedis) -> None:
    # Occurrences are built a period ahead: counted from the build, as Celery counts it from the send, every
    # occurrence expired before it was due and was discarded by the worker. Beat sends at the due time.
    from delay_broker.celery import schedule
    from delay_broker.cron import occurrence_id

    @app.task(name="t.expiring", shared=False, expires=30)
    def expiring() -> None: ...

    store = store_of(app, redis_server)
    schedule(app, "0 9 * * *", "t.add", args=(1, 2), expires=600)
    schedule(app, "0 9 * * *", "t.expiring")
    schedule(app, "0 9 * * *", "t.add", name="fixed", expires=datetime(2100, 1, 1, tzinfo=timezone.utc))
    build_promoter(app).step()
    expected = {"t.add": timedelta(seconds=600), "t.expiring": timedelta(seconds=30)}
    for name, after in expected.items():
        due_ms = store.schedules()[name]
        assert due_ms is not None
        info = store.get(occurrence_id(store.keys.namespace, name, due_ms))
        assert info is not None and info.envelope is not None
        headers = json.loads(info.envelope.payload)["headers"]
        assert datetime.fromisoformat(headers["expires"]) == datetime.fromtimestamp(due_ms / 1000, timezone.utc) + after
    fixed_ms = store.schedules()["fixed"]
    info = store.get(occurrence_id(store.keys.namespace, "fixed", fixed_ms))  # type: ignore[arg-type]
    assert info is not None and info.envelope is not None
    assert json.loads(info.envelope.payload)["headers"]["expires"].startswith("2100-01-01T00:00:00")


def test_bad_celery_schedules_are_refused_when_declared(app: Celery) -> None:
    from delay_broker.celery import schedule

    with pytest.raises(ConfigurationError, match="not a valid cron expression"):
        schedule(app, "hourly", "t.add")
    with pytest.raises(ConfigurationError, match="set by the schedule"):
        schedule(app, "0 * * * *", "t.add", countdown=5)
    with pytest.raises(ConfigurationError, match="a Celery task or a task name"):
        schedule(app, "0 * * * *", 42)
    schedule(app, "0 * * * *", "t.add", args=(1, 1))
    with pytest.raises(ConfigurationError, match="give this one a name"):
        schedule(app, "30 * * * *", "t.add", args=(2, 2))


def test_a_broker_that_cannot_be_reached_is_an_outage_not_a_failed_attempt(client: redis.Redis, namespace: str) -> None:
    # kombu reports it as its own OperationalError once its connection retries are spent: a promoter counting
    # that as a failed attempt dead-lettered every task due during a minute-long RabbitMQ restart.
    from delay_broker.celery.delivery import AllowedRoutes, AmqpRepublisher
    from delay_broker.celery.messages import encode_amqp
    from delay_broker.celery.stores import RouteBook
    from delay_broker.embedded import free_port
    from delay_broker.errors import TargetUnavailable
    from delay_broker.records import ClaimedMessage

    url = f"amqp://guest:guest@127.0.0.1:{free_port()}//"  # nothing listens there
    allowed = AllowedRoutes({"celery"}, RouteBook(DelayStore(client, namespace=namespace)))
    deliverer = AmqpRepublisher(lambda: Connection(url, transport="pyamqp", connect_timeout=1), allowed)
    payload = encode_amqp(b"[]", {"application_headers": {"id": "t-1", "task": "t"}}, "", "celery")
    envelope = Envelope(route="celery", payload=payload, framework="celery", name="t")
    with pytest.raises(TargetUnavailable):
        deliverer.deliver(ClaimedMessage("t-1", 0, envelope.encode(1), envelope))


def test_a_task_sent_from_a_running_task_goes_to_the_broker_when_the_store_cannot_take_it(app: Celery) -> None:
    # Inside a worker Celery turns a publish error into Reject(requeue=False): a retry (or a chain's next step)
    # the store refused was lost. It is published with its eta instead, as Celery alone would; a producer
    # outside any task is still told.
    from celery._state import _task_stack

    from delay_broker.celery.messages import TaskInfo
    from delay_broker.celery.parking import Parker
    from delay_broker.embedded import free_port
    from delay_broker.errors import StoreUnavailable

    @app.task(name="sender", bind=True, shared=False)
    def sender(self: Any) -> None: ...

    down = DelayStore.from_url(f"redis://127.0.0.1:{free_port()}/0", namespace="n", socket_connect_timeout=0.5)
    parker = Parker(down, threshold=1)
    due = datetime.now(timezone.utc) + timedelta(hours=1)
    info = TaskInfo("t-1", "retried", due, None, 1)
    with pytest.raises(StoreUnavailable):
        parker.park(info, due, "celery", b"{}", {"queue": "celery"})
    _task_stack.push(sender)
    try:
        assert parker.park(info, due, "celery", b"{}", {"queue": "celery"}) is False, "the transport publishes it"
    finally:
        _task_stack.pop()


def test_an_amqps_broker_keeps_tls(redis_server: EmbeddedRedis) -> None:
    # kombu's amqps:// transport is what turns TLS on: our plain AMQP transport in its place logged in over TCP.
    from delay_broker.celery import TRANSPORT_AMQP, TRANSPORT_AMQPS, validate

    app = Celery("tls", broker="amqps://guest:guest@127.0.0.1:1//")
    app.conf.broker_transport_options = {"delay_broker": {"redis_url": redis_server.url}}
    app.conf.broker_transport = TRANSPORT_AMQP
    with pytest.raises(ConfigurationError, match=r"amqps:// needs TLS.*AmqpSSLTransport"):
        validate(app)
    app.conf.broker_transport = TRANSPORT_AMQPS
    with app.connection_for_write() as connection:
        assert connection.transport.client.ssl, "TLS on, as kombu's own amqps:// transport does"
    app.close()


def test_a_task_sent_from_a_running_task_is_not_left_in_the_store_when_no_replica_confirmed_it(
    app: Celery, redis_server: EmbeddedRedis, unique: str
) -> None:
    # NotReplicated: the park is on the master, unconfirmed. The transport then publishes the task itself: the
    # copy in the store must be taken back first, or both run (a retry ran twice in a helper's failover test).
    from celery._state import _task_stack

    from delay_broker.celery.messages import TaskInfo
    from delay_broker.celery.parking import Parker
    from delay_broker.errors import NotReplicated

    @app.task(name="sender", bind=True, shared=False)
    def sender(self: Any) -> None: ...

    store = DelayStore(redis_server.client(), namespace=f"nr-{unique}", replicas=1, replica_timeout=0.05)
    parker = Parker(store, threshold=1)
    parker.routes._recorded.add("celery")  # as if recorded before: the park itself is what is not confirmed
    due = datetime.now(timezone.utc) + timedelta(hours=1)
    try:
        with pytest.raises(NotReplicated):  # a producer is told, and may send it again (same id: one copy)
            parker.park(TaskInfo("sent", "t", due, None, 0), due, "celery", b"{}", {"queue": "celery"})
        _task_stack.push(sender)
        try:
            retried = TaskInfo("retried", "t", due, None, 1)
            assert parker.park(retried, due, "celery", b"{}", {"queue": "celery"}) is False, "published instead"
        finally:
            _task_stack.pop()
        assert store.get("retried") is None, "the unconfirmed copy was taken back"
    finally:
        store.client.delete(*store.keys.all())


def test_a_reschedule_that_meets_a_retry_parked_meanwhile_moves_the_retry(store: DelayStore) -> None:
    """A retry parks its task id again between the reschedule's read and its write: the write is refused (it
    would put the old body over the new), and the reschedule reads again and moves the retry."""
    from delay_broker.celery.messages import reschedule_parked

    store.park("task", celery_envelope("tasks.add", "task"), delay=60)
    read = store.get
    raced: list[bool] = []

    def get_then_retry(id: str) -> Any:
        info = read(id)
        if not raced:
            raced.append(True)
            store.park("task", celery_envelope("tasks.retried", "task"), delay=90)
        return info

    store.get = get_then_retry  # type: ignore[method-assign]
    try:
        due = (datetime.now(timezone.utc) + timedelta(hours=2)).replace(microsecond=0)
        moved = reschedule_parked(store, "task", due)
    finally:
        del store.get
    assert moved == int(due.timestamp() * 1000), "still parked: moved, not reported gone"
    info = store.get("task")
    assert info is not None and info.envelope is not None
    headers = json.loads(info.envelope.payload)["headers"]
    assert headers["task"] == "tasks.retried" and maybe_iso8601(headers["eta"]) == due, "the retry, moved"


def test_the_core_moves_a_celery_task_s_eta_without_importing_the_adapter(
    redis_server: EmbeddedRedis, store: DelayStore, namespace: str
) -> None:
    """delay-broker reschedule and the dashboard run in processes that never import delay_broker.celery, and the
    core imports no adapter: the adapter's rescheduler is found through its entry point, and moves the eta."""
    store.park("task", celery_envelope("tasks.add", "task"), delay=3600)
    due = (datetime.now(timezone.utc) + timedelta(minutes=5)).replace(microsecond=0)
    code = (
        "import sys, redis\n"
        "from datetime import datetime\n"
        "from delay_broker import DelayStore\n"
        "from delay_broker.operations import reschedule_one\n"
        f"store = DelayStore(redis.Redis.from_url({redis_server.url!r}), namespace={namespace!r})\n"
        "assert not any(name.startswith('delay_broker.celery') for name in sys.modules), 'imported up front'\n"
        f"print(reschedule_one(store, 'task', datetime.fromisoformat({due.isoformat()!r}), 'celery'))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == int(due.timestamp() * 1000)
    info = store.get("task")
    assert info is not None and info.envelope is not None
    assert maybe_iso8601(json.loads(info.envelope.payload)["headers"]["eta"]) == due, "the eta moved with it"


def test_a_retry_of_a_task_revoked_while_it_ran_is_discarded_not_parked(store: DelayStore) -> None:
    """Plain Celery publishes the retry and a worker discards it on delivery, from its memory of the revoke. A
    parked retry would come due after that memory is gone (a worker restart) and run: it is discarded here."""
    from celery.worker import state

    from delay_broker.celery.messages import TaskInfo
    from delay_broker.celery.parking import Parker

    due = datetime.now(timezone.utc) + timedelta(hours=1)
    parker = Parker(store, threshold=1.0)
    state.revoked.add("revoked-task")
    try:
        info = TaskInfo("revoked-task", "tasks.add", due, None, retries=1)
        assert parker.park(info, due, "celery", b"retry", {}) is True
        assert store.get("revoked-task") is None
    finally:
        state.revoked.discard("revoked-task")
    assert parker.park(TaskInfo("other", "tasks.add", due, None), due, "celery", b"kept", {}) is True
    assert store.get("other") is not None
