"""Parks from threads parking at once share round trips (store/batching.py), each caller answered alone."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
import redis

from delay_broker import DelayStore, Envelope, InvalidDelay, StoreUnavailable
from delay_broker.embedded import EmbeddedRedis


class CountingConnection(redis.Connection):
    """Counts the round trips a client makes (a pipeline is one)."""

    sent: list[int]

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        self.sent.append(1)
        super().send_packed_command(command, check_health)


def counting_store(server: EmbeddedRedis, namespace: str, **options: Any) -> tuple[DelayStore, list[int]]:
    sent: list[int] = []
    connection_class = type("Counting", (CountingConnection,), {"sent": sent})
    pool = redis.ConnectionPool(connection_class=connection_class, host="127.0.0.1", port=server.port)
    return DelayStore(redis.Redis(connection_pool=pool), namespace=namespace, **options), sent


def park_together(store: DelayStore, ids: list[str], delays: dict[str, float]) -> dict[str, Any]:
    """Each id parked by a thread of its own, all released at once; each thread's result or error."""
    start = threading.Barrier(len(ids))
    answers: dict[str, Any] = {}

    def park(id: str) -> None:
        start.wait()
        try:
            answers[id] = store.park(id, Envelope("ready", id.encode()), delay=delays.get(id, 3600))
        except Exception as error:
            answers[id] = error

    threads = [threading.Thread(target=park, args=(id,)) for id in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return answers


def test_parks_made_at_once_share_round_trips_and_each_is_answered(redis_server, namespace):
    store, sent = counting_store(redis_server, namespace)
    store.park(str(uuid.uuid4()), Envelope("ready", b"w"), delay=3600)  # layout, clock, pack_one loaded
    store.park("warm-up", Envelope("ready", b"w"), delay=3600)  # park_one loaded
    ids = [str(uuid.uuid4()) for _ in range(16)] + [f"plain-{n}" for n in range(16)]
    sent.clear()
    answers = park_together(store, ids, {})
    assert all(answers[id].outcome == "new" and answers[id].id == id for id in ids)
    assert len(sent) < len(ids), f"{len(sent)} round trips for {len(ids)} parks made at once"
    for id in ids:
        info = store.get(id)
        assert info is not None and info.envelope is not None and info.envelope.payload == id.encode()
    assert store.stats().parked == len(ids) + 2


def test_each_caller_gets_its_own_outcome_and_error(redis_server, namespace):
    store, _ = counting_store(redis_server, namespace, max_delay=7200)
    held = str(uuid.uuid4())
    store.park(held, Envelope("ready", b"before"), delay=3600)
    too_far = str(uuid.uuid4())
    ids = [held, too_far, *(str(uuid.uuid4()) for _ in range(10))]
    answers = park_together(store, ids, {too_far: 86400})
    assert answers[held].outcome == "replaced", "left to park.lua by its batch, for its caller alone"
    assert isinstance(answers[too_far], InvalidDelay) and "beyond max_delay" in str(answers[too_far])
    assert all(answers[id].outcome == "new" for id in ids[2:])
    assert store.get(too_far) is None and store.get(held).envelope.payload == held.encode()


def test_a_lone_producer_sends_one_call_per_park(redis_server, namespace):
    store, sent = counting_store(redis_server, namespace)
    store.park(str(uuid.uuid4()), Envelope("ready", b"w"), delay=3600)  # layout, clock, pack_one loaded
    sent.clear()
    for _ in range(20):
        store.park(str(uuid.uuid4()), Envelope("ready", b"x"), delay=3600)
    assert len(sent) == 20


def test_a_round_trip_that_fails_fails_each_of_its_parks(namespace):
    with EmbeddedRedis() as server:
        store, _ = counting_store(server, namespace)
        store.park("warm-up", Envelope("ready", b"w"), delay=3600)
        server.stop(kill=True)
        ids = [str(uuid.uuid4()) for _ in range(8)]
        answers = park_together(store, ids, {})
    assert all(isinstance(answers[id], StoreUnavailable) for id in ids)


@pytest.mark.parametrize("threads", [2, 8])
def test_parks_from_many_threads_in_rounds_lose_nothing(redis_server, namespace, threads):
    store = DelayStore(redis_server.client(), namespace=namespace)
    per_thread = 200
    made: list[list[str]] = [[] for _ in range(threads)]

    def producer(n: int) -> None:
        for _ in range(per_thread):
            id = str(uuid.uuid4())
            assert store.park(id, Envelope("ready", b"x"), delay=60 if len(made[n]) % 2 else 3600).outcome == "new"
            made[n].append(id)

    workers = [threading.Thread(target=producer, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert sum(len(ids) for ids in made) == threads * per_thread
    stats = store.stats()
    assert stats.parked == threads * per_thread and stats.counters["parked"] == threads * per_thread
