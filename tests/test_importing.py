"""``delay-broker import``'s machinery against the session's redis-server: a Redis list read, moved through the
staging list, every step interrupted and run again; the AMQP source's bookkeeping; and the command itself on a
Dramatiq RedisBroker app (plain Dramatiq messages in ``<queue>.DQ``).
"""

from __future__ import annotations

import json
import sys
import types
import uuid
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
import redis
from click.testing import CliRunner
from dramatiq.brokers.redis import RedisBroker

from delay_broker import DelayStore, Envelope
from delay_broker.cli import cli
from delay_broker.dramatiq import DelayMiddleware
from delay_broker.embedded import EmbeddedRedis
from delay_broker.importing import AmqpSource, Delivery, Found, Importer, Item, RedisListSource
from delay_broker.importing.model import DUE_SOON

HOUR_MS = 3_600_000


def entry(id: str, due_ms: int | None, size: int = 0) -> bytes:
    return json.dumps({"id": id, "due": due_ms, "pad": "x" * size}).encode()


def classify(value: bytes, _: bytes | None) -> Found | str:
    try:
        data = json.loads(value)
    except ValueError:
        return "unreadable"
    if data["due"] is None:
        return "not delayed"
    return Found(data["id"], data["due"], Envelope(route="ready", payload=value, framework="raw"))


@pytest.fixture
def queue_key(client: redis.Redis) -> Iterator[str]:
    key = f"import-test:{uuid.uuid4().hex[:10]}"
    yield key
    client.delete(key, f"delay_broker:import:{key}", f"{key}.msgs")


def source(client: redis.Redis, key: str, **options: Any) -> RedisListSource:
    options.setdefault("producers_push", "head")
    options.setdefault("batch", 4)
    return RedisListSource(client, key, key, classify, **options)


def fill(client: redis.Redis, key: str, store: DelayStore) -> dict[str, bytes]:
    """Ten entries pushed as kombu pushes them (LPUSH): six due in an hour, two due now, a ready one, garbage."""
    now = store.now_ms()
    entries = {f"late-{n}": entry(f"late-{n}", now + HOUR_MS + n) for n in range(6)}
    entries.update({f"soon-{n}": entry(f"soon-{n}", now + 500) for n in range(2)})
    entries["ready"] = entry("ready", None)
    entries["junk"] = b"\xff not json"
    for value in entries.values():
        client.lpush(key, value)
    return entries


def late(batch: list[Item], store: DelayStore) -> list[Item]:
    """The items an import with a threshold of a minute moves."""
    now = store.now_ms()
    return [item for item in batch if isinstance(item.found, Found) and item.found.due_ms > now + 60_000]


def staged(client: redis.Redis, key: str) -> list[bytes]:
    return list(client.lrange(f"delay_broker:import:{key}", 0, -1))


def test_a_dry_run_reports_and_changes_nothing(client: redis.Redis, store: DelayStore, queue_key: str) -> None:
    fill(client, queue_key, store)
    before = client.lrange(queue_key, 0, -1)
    report = Importer(store, 60_000).run(source(client, queue_key))
    assert (report.examined, report.moved, report.already) == (10, 6, 0)
    assert report.left == {DUE_SOON: 2, "not delayed": 1, "unreadable": 1}
    assert report.first_due_ms is not None and report.last_due_ms == report.first_due_ms + 5
    assert client.lrange(queue_key, 0, -1) == before and store.stats().parked == 0 and not staged(client, queue_key)


def test_an_import_moves_what_is_due_later_and_leaves_the_rest_in_order(
    client: redis.Redis, store: DelayStore, queue_key: str
) -> None:
    entries = fill(client, queue_key, store)
    before = client.lrange(queue_key, 0, -1)
    report = Importer(store, 60_000, dry_run=False).run(source(client, queue_key))
    assert (report.examined, report.moved, report.already, report.refused) == (10, 6, 0, {})
    late = {entries[f"late-{n}"] for n in range(6)}
    assert client.lrange(queue_key, 0, -1) == [value for value in before if value not in late]  # same order
    assert not staged(client, queue_key)
    for n in range(6):
        info = store.get(f"late-{n}")
        assert info is not None and info.envelope is not None and info.envelope.payload == entries[f"late-{n}"]
        assert info.due_ms == json.loads(entries[f"late-{n}"])["due"]
    again = Importer(store, 60_000, dry_run=False).run(source(client, queue_key))
    assert (again.examined, again.moved) == (4, 0)


def test_killed_after_taking_the_next_run_parks_what_was_taken(
    client: redis.Redis, store: DelayStore, queue_key: str
) -> None:
    fill(client, queue_key, store)
    first = source(client, queue_key, batch=6)  # the newest six: two of them due in an hour
    batch = next(first.scan())
    movers = late(batch, store)
    taken = first.take(movers)  # ... and the process dies here
    assert len(taken) == len(movers) > 0 and len(staged(client, queue_key)) == len(taken)
    assert store.stats().parked == 0
    dry = Importer(store, 60_000).run(source(client, queue_key))
    assert dry.recovered == len(taken) and any("interrupted" in note for note in dry.notes)
    report = Importer(store, 60_000, dry_run=False).run(source(client, queue_key))
    assert report.recovered == len(taken) and report.moved == 6 and report.already == 0
    assert store.stats().parked == 6 and not staged(client, queue_key) and client.llen(queue_key) == 4


def test_killed_after_parking_the_next_run_parks_nothing_twice(
    client: redis.Redis, store: DelayStore, queue_key: str
) -> None:
    fill(client, queue_key, store)
    first = source(client, queue_key, batch=6)
    importer = Importer(store, 60_000, dry_run=False)
    batch = next(first.scan())
    taken = first.take(late(batch, store))
    results = importer._park_each(taken)  # parked, not released: the process dies here
    assert all(not isinstance(result, str) and result.outcome == "new" for result in results.values())
    # The parked copy changes meanwhile (a reschedule): the next run must keep it, not park the queue's again.
    moved_id = next(item.found.id for item in taken if isinstance(item.found, Found))
    assert store.reschedule(moved_id, delay=7200) is not None
    due = store.get(moved_id).due_ms  # type: ignore[union-attr]
    report = importer.run(source(client, queue_key))
    assert report.already == len(taken) and report.moved == 6 - len(taken) and report.recovered == len(taken)
    assert store.stats().parked == 6 and not staged(client, queue_key)
    assert store.get(moved_id).due_ms == due  # type: ignore[union-attr]


def test_an_entry_a_consumer_took_meanwhile_is_not_parked(
    client: redis.Redis, store: DelayStore, queue_key: str
) -> None:
    entries = fill(client, queue_key, store)
    src = source(client, queue_key, batch=20)
    batch = next(src.scan())
    client.lrem(queue_key, 1, entries["late-0"])  # a worker popped it between the read and the take
    assert len(src.take(late(batch, store))) == 5
    report = Importer(store, 60_000, dry_run=False).run(source(client, queue_key))
    assert report.recovered == 5 and store.get("late-0") is None


def test_a_message_the_store_refuses_goes_back_and_is_reported(
    client: redis.Redis, namespace: str, queue_key: str
) -> None:
    small = DelayStore(client, namespace=namespace, max_payload_bytes=200)
    now = small.now_ms()
    client.lpush(queue_key, entry("fits", now + HOUR_MS), entry("too-large", now + HOUR_MS, size=400))
    report = Importer(small, 60_000, dry_run=False).run(source(client, queue_key))
    assert report.moved == 1 and set(report.refused) == {"too-large"}
    assert client.lrange(queue_key, 0, -1) == [entry("too-large", now + HOUR_MS, size=400)]
    assert not staged(client, queue_key)


def test_ids_with_payloads_in_a_hash_leave_with_their_payload(
    client: redis.Redis, store: DelayStore, queue_key: str
) -> None:
    """Dramatiq's layout: the list holds ids (RPUSHed), ``<key>.msgs`` the messages."""
    now = store.now_ms()
    for n in range(5):
        client.hset(f"{queue_key}.msgs", f"rid-{n}", entry(f"m-{n}", now + HOUR_MS if n % 2 else now))
        client.rpush(queue_key, f"rid-{n}")
    client.rpush(queue_key, "dangling")

    def by_payload(_: bytes, payload: bytes | None) -> Found | str:
        assert payload is not None
        return classify(payload, None)

    src = RedisListSource(
        client, queue_key, queue_key, by_payload, producers_push="tail", payloads=f"{queue_key}.msgs", batch=2
    )
    report = Importer(store, 60_000, dry_run=False).run(src)
    assert report.moved == 2 and report.left[DUE_SOON] == 3 and sum(report.left.values()) == 4
    assert client.lrange(queue_key, 0, -1) == [b"rid-0", b"rid-2", b"rid-4", b"dangling"]
    assert sorted(client.hkeys(f"{queue_key}.msgs")) == [b"rid-0", b"rid-2", b"rid-4"]


class FakeQueue:
    """A queue's deliveries in memory: what the AMQP source asks of a client."""

    name = "fake"

    def __init__(self, bodies: list[bytes]) -> None:
        self.ready = list(enumerate(bodies, start=1))
        self.unacked: dict[int, bytes] = {}
        self.acked: list[int] = []

    def count(self) -> int:
        return len(self.ready)

    def consumers(self) -> int:
        return 0

    def get(self) -> Delivery | None:
        if not self.ready:
            return None
        tag, body = self.ready.pop(0)
        self.unacked[tag] = body
        return Delivery(tag, body, {}, "", "fake")

    def ack(self, tags: list[int]) -> None:
        for tag in tags:
            del self.unacked[tag]
            self.acked.append(tag)

    def requeue_all(self) -> None:
        self.ready = sorted(self.unacked.items()) + self.ready
        self.unacked = {}


def test_the_amqp_source_acknowledges_only_what_is_parked_and_returns_the_rest_in_order(store: DelayStore) -> None:
    now = store.now_ms()
    bodies = [entry(f"a-{n}", now + HOUR_MS if n % 3 else None) for n in range(10)]
    queue = FakeQueue(bodies)
    report = Importer(store, 60_000, dry_run=False).run(
        AmqpSource(queue, lambda delivery: classify(delivery.body, None), batch=3)
    )
    assert report.moved == 6 and queue.acked == [2, 3, 5, 6, 8, 9]
    assert [body for _, body in queue.ready] == [bodies[n] for n in (0, 3, 6, 9)]  # in their order
    dry = FakeQueue(bodies)
    Importer(store, 60_000).run(AmqpSource(dry, lambda delivery: classify(delivery.body, None)))
    assert [body for _, body in dry.ready] == bodies and not dry.acked


# -- the command on a Dramatiq RedisBroker app ---------------------------------------------------------------------


@pytest.fixture
def dramatiq_app(redis_server: EmbeddedRedis, namespace: str) -> Iterator[tuple[str, RedisBroker, RedisBroker]]:
    """An app module (``MODULE:broker``, with the middleware) and a plain broker on the same Redis namespace."""
    broker_ns = f"bns-{uuid.uuid4().hex[:8]}"
    with_middleware = RedisBroker(url=redis_server.url, namespace=broker_ns)  # type: ignore[no-untyped-call]
    with_middleware.add_middleware(DelayMiddleware(namespace=namespace, threshold=60))
    plain = RedisBroker(url=redis_server.url, namespace=broker_ns)  # type: ignore[no-untyped-call]
    for broker in (with_middleware, plain):
        dramatiq.actor(broker=broker, queue_name="mail", actor_name="send_mail")(lambda n: None)
    module = types.ModuleType(f"import_app_{uuid.uuid4().hex[:8]}")
    module.broker = with_middleware  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        yield f"{module.__name__}:broker", with_middleware, plain
    finally:
        del sys.modules[module.__name__]
        with_middleware.flush_all()
        plain.client.delete(f"delay_broker:import:{broker_ns}:mail.DQ")
        with_middleware.close()
        plain.close()


def test_the_command_moves_plain_dramatiq_delays_after_a_dry_run(
    dramatiq_app: tuple[str, RedisBroker, RedisBroker], namespace: str
) -> None:
    path, broker, plain = dramatiq_app
    actor = plain.get_actor("send_mail")
    sent = [actor.send_with_options(args=(n,), delay=HOUR_MS if n % 4 else 5_000) for n in range(40)]
    runner = CliRunner()
    dry = runner.invoke(cli, ["import", "--dramatiq", path, "--json"], catch_exceptions=False)
    assert dry.exit_code == 0, dry.output
    data = json.loads(dry.output)
    assert data["dry_run"] and data["threshold_seconds"] == 60
    [queue] = data["queues"]
    assert (queue["queue"], queue["examined"], queue["moved"]) == ("mail.DQ", 40, 30)
    assert queue["left"] == {"due within the threshold": 10} and queue["first_due"].endswith("Z")
    middleware = broker.middleware[-1]
    assert isinstance(middleware, DelayMiddleware) and middleware.store.stats().parked == 0
    done = runner.invoke(cli, ["import", "--dramatiq", path, "--yes"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    assert "Moved 30 message(s) due more than 60 s from now" in done.output
    assert middleware.store.stats().parked == 30 and plain.client.llen(f"{plain.namespace}:mail.DQ") == 10
    for message in sent:
        info = middleware.get(message.message_id)
        if message.args[0] % 4:
            assert info is not None and info.due_ms == message.options["eta"]
            parked = middleware.parked_message(message.message_id)
            assert parked is not None and parked.queue_name == "mail" and "eta" not in parked.options
        else:
            assert info is None


def test_the_command_refuses_unclear_input(dramatiq_app: tuple[str, RedisBroker, RedisBroker]) -> None:
    path, _, _ = dramatiq_app
    runner = CliRunner()
    assert runner.invoke(cli, ["import"]).exit_code == 2
    assert runner.invoke(cli, ["import", "--dramatiq", path, "--celery", "x:y"]).exit_code == 2
    unknown = runner.invoke(cli, ["import", "--dramatiq", path, "--queue", "nope"])
    assert unknown.exit_code == 1 and "declares no queue nope" in unknown.output
