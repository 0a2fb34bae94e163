"""Celery's remote control for parked tasks, without worker processes: the ``scheduled`` entries of parked tasks,
the bound on a reply, and the handlers a worker's mailbox node runs (against the session's real redis-server)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.utils.collections import AttributeDict
from celery.worker import state as worker_state
from celery.worker.control import Panel
from kombu.asynchronous.timer import Timer

from delay_broker import DelayStore, Envelope
from delay_broker.celery import parse_options
from delay_broker.celery.bootstep import ControlStep, PromoterStep
from delay_broker.celery.config import CeleryOptions
from delay_broker.celery.control import CLAIM_TTL, RecordsBroadcasts, install_control
from delay_broker.celery.inspection import NOTE_ID, parked_entries, scheduled_entry
from delay_broker.celery.messages import encode_amqp
from delay_broker.claims import claim
from delay_broker.embedded import EmbeddedRedis

from .celery_apps import celery_app, make_app, store_of


@pytest.fixture
def unique() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture
def app(redis_server: EmbeddedRedis, unique: str) -> Iterator[Celery]:
    with celery_app(redis_server, unique) as app:
        yield app


def worker_node(app: Celery, hostname: str) -> Any:
    """A worker's mailbox node as Celery's Pidbox makes it (Celery's command registry, the worker's state), with an
    empty timer: the worker holds no ETA task of its own."""
    state = AttributeDict(app=app, hostname=hostname, consumer=SimpleNamespace(timer=Timer()), tset=set)
    return app.control.mailbox.Node(hostname, state=state, handlers=Panel.data)


def ask(node: Any, method: str, ticket: str | None = None, **body: Any) -> Any:
    """What the node answers to a broadcast (kombu's message body; a ticket with a reply address asks a reply)."""
    reply_to = {"exchange": "reply.celery.pidbox", "routing_key": "client"} if ticket else None
    node.reply = lambda *args, **kwargs: None  # the reply itself is kombu's to send: here it is returned
    return node.dispatch(method=method, arguments=body.pop("arguments", {}), reply_to=reply_to, ticket=ticket, **body)


def options_of(app: Celery) -> CeleryOptions:
    return parse_options(app.conf.broker_transport_options["delay_broker"])


def installed(app: Celery, server: EmbeddedRedis) -> DelayStore:
    """The app's store, once the worker bootstep's control is installed for the app in this process."""
    store = store_of(app, server)
    install_control(app, store, options_of(app), 1.0)
    return store


# -- the entries ---------------------------------------------------------------------------------------------------


def test_a_parked_task_reads_as_celery_s_scheduled_entry(app: Celery, redis_server: EmbeddedRedis) -> None:
    due = datetime(2031, 5, 4, 3, 2, 1, tzinfo=timezone.utc)
    result = app.tasks["t.add"].apply_async((2, 3), {"z": "Zürich"}, eta=due, priority=7)
    info = store_of(app, redis_server).get(result.id)
    assert info is not None
    entry = scheduled_entry(info)
    assert entry is not None
    assert entry["eta"] == due.isoformat() and entry["priority"] == 7 and entry["parked"] is True
    request = entry["request"]
    assert (request["id"], request["name"], request["type"]) == (result.id, "t.add", "t.add")
    assert (request["args"], request["kwargs"]) == ([2, 3], {"z": "Zürich"})
    assert request["delivery_info"] == {
        "exchange": "",
        "routing_key": app.conf.task_default_queue,
        "priority": 7,
        "redelivered": False,
    }
    assert (request["hostname"], request["time_start"], request["acknowledged"], request["worker_pid"]) == (
        None,
        None,
        False,
        None,
    )
    json.dumps(entry)  # what the worker replies must serialize as it is


def test_a_pickled_task_is_shown_by_its_reprs_never_unpickled(redis_server: EmbeddedRedis, unique: str) -> None:
    app = make_app(redis_server, unique)
    app.conf.task_serializer = "pickle"
    app.conf.accept_content = ["json", "pickle"]
    try:
        result = app.tasks["t.add"].apply_async((2, 3), {"label": "secret"}, countdown=60)
        info = store_of(app, redis_server).get(result.id)
        assert info is not None and info.envelope is not None
        entry = scheduled_entry(info)
        assert entry is not None
        assert (entry["request"]["args"], entry["request"]["kwargs"]) == ("(2, 3)", "{'label': 'secret'}")
    finally:
        app.close()


def test_an_amqp_record_and_a_large_body_read_as_entries(store: DelayStore) -> None:
    body = json.dumps([["x" * 5000], {}, {}]).encode()
    headers = {"id": "amqp-1", "task": "t.big", "shadow": "t.alias", "argsrepr": "('xxx...',)", "kwargsrepr": "{}"}
    payload = encode_amqp(
        body,
        {"content_type": "application/json", "application_headers": headers, "priority": 3},
        exchange="tasks",
        routing_key="big",
    )
    store.park("amqp-1", Envelope(route="tasks:big", payload=payload, framework="celery", name="t.big"), delay=60)
    store.park("other", Envelope(route="q", payload=b"{}", framework="dramatiq", name="actor"), delay=60)
    infos = {info.id: info for info in store.list_messages("due")}
    entry = scheduled_entry(infos["amqp-1"])
    assert entry is not None and scheduled_entry(infos["other"]) is None
    request = entry["request"]
    assert (request["name"], request["type"], request["args"], request["kwargs"]) == (
        "t.alias",
        "t.big",
        "('xxx...',)",
        "{}",
    )
    assert request["delivery_info"]["exchange"] == "tasks" and request["delivery_info"]["routing_key"] == "big"
    assert entry["priority"] == 3


def test_a_reply_lists_at_most_the_limit_and_says_how_many_more(app: Celery, redis_server: EmbeddedRedis) -> None:
    store = store_of(app, redis_server)
    results = [app.tasks["t.add"].apply_async((n, n), countdown=100 + n) for n in range(5)]
    entries = parked_entries(store, 3)
    assert [entry["request"]["id"] for entry in entries[:3]] == [result.id for result in results[:3]]
    note = entries[3]
    assert len(entries) == 4 and note["more"] == 2 and note["request"]["id"] == NOTE_ID
    assert "2 more parked task(s) not listed (inspect_limit 3)" in note["request"]["name"]
    assert [entry["request"]["id"] for entry in parked_entries(store, 5)] == [result.id for result in results]
    assert [entry["more"] for entry in parked_entries(store, 0)] == [5]


# -- the handlers ---------------------------------------------------------------------------------------------------


def test_one_worker_per_broadcast_answers_with_the_parked_tasks(app: Celery, redis_server: EmbeddedRedis) -> None:
    installed(app, redis_server)
    parked = app.tasks["t.add"].apply_async((1, 2), countdown=60)
    first, second = worker_node(app, "one@host"), worker_node(app, "two@host")
    assert isinstance(first, RecordsBroadcasts)
    replies = [ask(node, "scheduled", ticket="ticket-1") for node in (first, second)]
    assert [[entry["request"]["id"] for entry in reply] for reply in replies] == [[parked.id], []]
    assert [entry["request"]["id"] for entry in ask(second, "dump_schedule", ticket="ticket-2")] == [parked.id]
    assert ask(first, "scheduled") == [], "no reply asked: nothing to list"


def test_a_worker_of_an_app_without_delay_broker_answers_as_celery_does(
    app: Celery, redis_server: EmbeddedRedis, unique: str
) -> None:
    installed(app, redis_server)
    app.tasks["t.add"].apply_async((1, 2), countdown=60)
    plain = Celery(f"plain{unique}", broker=redis_server.url, set_as_current=False)
    try:
        node = worker_node(plain, "plain@host")
        assert not isinstance(node, RecordsBroadcasts)
        assert ask(node, "scheduled", ticket="ticket-plain") == []
    finally:
        plain.close()


def test_registering_again_keeps_celery_s_command_and_its_metadata(app: Celery, redis_server: EmbeddedRedis) -> None:
    installed(app, redis_server)
    scheduled = Panel.data["scheduled"]
    installed(app, redis_server)
    assert Panel.data["scheduled"] is scheduled and Panel.data["dump_schedule"] is scheduled
    wrapped = scheduled.delay_broker_wraps
    assert getattr(wrapped, "delay_broker_wraps", None) is None and wrapped.__module__ == "celery.worker.control"
    assert Panel.meta["revoke"].variadic == "task_id" and Panel.meta["scheduled"].type == "inspect"
    assert ControlStep in app.steps["worker"] and PromoterStep in app.steps["worker"], "install() adds both steps"
    stamped = Panel.data.get("revoke_by_stamped_headers")  # Celery 5.3+: left to Celery as it is
    assert stamped is None or stamped.__module__ == "celery.worker.control"


def test_a_revoke_received_by_workers_cancels_the_parked_task_once(
    app: Celery, redis_server: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    store = installed(app, redis_server)
    add = app.tasks["t.add"]
    one, two, three, kept = (add.apply_async((1, 2), countdown=60) for _ in range(4))
    nodes = [worker_node(app, f"w{n}@host") for n in range(3)]
    try:
        with caplog.at_level("INFO", logger="delay_broker.celery"):
            for node in nodes:
                ask(node, "revoke", arguments={"task_id": [one.id, two.id]})
        cancelled = [record for record in caplog.records if "revoke cancelled" in record.getMessage()]
        assert len(cancelled) == 1 and "2 parked task(s)" in cancelled[0].getMessage()
        assert store.get(one.id) is None and store.get(two.id) is None
        assert {one.id, two.id} <= set(worker_state.revoked), "Celery's own revoke still happens"
        ask(nodes[0], "terminate", arguments={"task_id": three.id, "signal": "TERM"})
        assert store.get(three.id) is None and three.id in worker_state.revoked
        # Sent to some workers only: the others would still run it, so it stays parked (as on the producer side).
        ask(nodes[1], "revoke", arguments={"task_id": kept.id}, destination=["w1@host"])
        assert store.get(kept.id) is not None and kept.id in worker_state.revoked
    finally:
        for task_id in (one.id, two.id, three.id, kept.id):
            worker_state.revoked.discard(task_id)


def test_a_worker_whose_store_is_away_answers_as_celery_does(redis_server: EmbeddedRedis, unique: str) -> None:
    app = make_app(redis_server, unique)
    try:
        store = DelayStore.from_url("redis://127.0.0.1:1/0", namespace=f"n-{unique}", socket_timeout=0.2)
        install_control(app, store, options_of(app), 1.0)
        node = worker_node(app, "alone@host")
        assert ask(node, "scheduled", ticket="ticket-away") == []
        ask(node, "revoke", arguments={"task_id": "gone"})  # logged, never raised: Celery's revoke happened
        assert "gone" in worker_state.revoked
    finally:
        worker_state.revoked.discard("gone")
        app.close()


def test_a_claim_is_taken_once_until_it_expires(store: DelayStore) -> None:
    assert claim(store, "inspect:t", CLAIM_TTL) is True
    assert claim(store, "inspect:t", CLAIM_TTL) is False
    assert 0 < store.client.pttl(store.keys.claim("inspect:t")) <= CLAIM_TTL * 1000
    with pytest.raises(ValueError):
        claim(store, "", 1.0)
