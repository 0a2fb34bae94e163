"""The store on a real redis-server: parking, cancelling, rescheduling, claiming and dead letters."""

from __future__ import annotations

import dataclasses
import math
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from fractions import Fraction

import pytest
import redis

from delay_broker import (
    ConfigurationError,
    DelayBrokerError,
    DelayStore,
    Envelope,
    InvalidDelay,
    InvalidMessage,
    ListTarget,
    NotReplicated,
    ParkRequest,
    PayloadTooLarge,
    Promoter,
    StoreUnavailable,
)
from delay_broker.deliverers import DirectLists
from delay_broker.operations import MessageFilter, Operations
from delay_broker.records import Requeued

from .helpers import envelope, wait_for

READY = "ready"


def routes(ready_key: str) -> DirectLists:
    return DirectLists({READY: ListTarget(ready_key)})


def promote(store: DelayStore, ready_key: str) -> int:
    return store.promote_direct(routes(ready_key).direct_routes(), 1000, "test").promoted


def store_keys(client: redis.Redis, store: DelayStore) -> list[bytes]:
    return sorted(client.scan_iter(match=store.keys.pattern))


def test_message_is_invisible_before_its_delay_and_ready_after(store, client, ready_key):
    store.park("job-1", envelope(b"payload-1"), delay=1.0)
    assert promote(store, ready_key) == 0
    assert client.llen(ready_key) == 0
    time.sleep(1.05)
    assert promote(store, ready_key) == 1
    assert client.rpop(ready_key) == b"payload-1"
    assert store.get("job-1") is None


def test_relative_delay_uses_the_redis_clock(store, client):
    redis_now_s, micros = client.time()
    result = store.park("job", envelope(), delay=timedelta(hours=6))
    expected = redis_now_s * 1000 + micros // 1000 + 6 * 3600 * 1000
    assert expected <= result.due_ms <= expected + 1000


def test_absolute_due_time_is_taken_as_given(store):
    due = datetime(2031, 5, 1, 12, 0, tzinfo=timezone.utc)
    assert store.park("job", envelope(), due=due).due_ms == int(due.timestamp() * 1000)
    info = store.get("job")
    assert info is not None and info.state == "due" and info.due_ms == int(due.timestamp() * 1000)


@pytest.mark.parametrize(
    ("delay", "message"),
    [
        (math.nan, "NaN"),
        (math.inf, "infinite"),
        (-math.inf, "infinite"),
        (-1, "negative"),
        (-0.001, "negative"),
        (timedelta(seconds=-5), "negative"),
        (timedelta(microseconds=-1), "negative"),  # not rounded up to an accepted 0 ms
        ("60", "number of seconds"),
        (None, "exactly one"),
        (True, "number of seconds"),
        ([1], "number of seconds"),
        (1e300, "latest supported"),
        (timedelta(days=999_999_999), "latest supported"),
    ],
)
def test_invalid_delays_are_refused_and_nothing_is_written(store, client, delay, message):
    with pytest.raises(InvalidDelay, match=message):
        store.park("job", envelope(), delay=delay)
    assert store_keys(client, store) == []


def test_numeric_types_beyond_float_are_accepted(store):
    assert store.park("a", envelope(), delay=Decimal("1.5")).outcome == "new"
    assert store.park("b", envelope(), delay=Fraction(1, 3)).outcome == "new"


def test_naive_datetimes_are_refused_aware_ones_in_any_zone_accepted(store, client):
    with pytest.raises(InvalidDelay, match="timezone-aware"):
        store.park("job", envelope(), due=datetime(2030, 1, 1))
    assert store_keys(client, store) == []
    plus_two = timezone(timedelta(hours=2))
    due = datetime(2030, 1, 1, 14, 0, tzinfo=plus_two)
    assert store.park("job", envelope(), due=due).due_ms == int(
        datetime(2030, 1, 1, 12, tzinfo=timezone.utc).timestamp() * 1000
    )


@pytest.mark.parametrize(
    ("bad_id", "message"),
    [("", "1 to 512"), (None, "string"), (42, "string"), (b"x", "string"), ("x" * 513, "1 to 512")],
)
def test_invalid_ids_are_refused(store, client, bad_id, message):
    with pytest.raises(InvalidMessage, match=message):
        store.park(bad_id, envelope(), delay=1)
    assert store_keys(client, store) == []


def test_payload_over_the_limit_is_refused(client, namespace):
    small = DelayStore(client, namespace=namespace, max_payload_bytes=100)
    small.park("fits", envelope(b"x" * 100), delay=1)
    with pytest.raises(PayloadTooLarge, match="101 bytes, over the limit of 100"):
        small.park("too-big", envelope(b"x" * 101), delay=1)
    with pytest.raises(InvalidMessage, match="bytes"):
        small.park("text", Envelope(route=READY, payload="text"), delay=1)  # type: ignore[arg-type]
    assert small.get("too-big") is None and small.get("fits") is not None


def test_park_many_is_validated_as_a_whole_before_writing(store, client):
    requests = [ParkRequest(f"job-{n}", envelope(), delay=1) for n in range(5)]
    requests.append(ParkRequest("bad", envelope(), delay=math.nan))
    with pytest.raises(InvalidDelay):
        store.park_many(requests)
    assert store_keys(client, store) == []


def test_park_many_parks_thousands_in_chunks(store):
    results = store.park_many(ParkRequest(f"job-{n}", envelope(), delay=60) for n in range(2500))
    assert len(results) == 2500 and {r.outcome for r in results} == {"new"}
    assert store.stats().parked == 2500


def test_park_many_made_of_calls_sent_while_the_next_is_built_loses_nothing_when_the_scripts_are_gone(store, client):
    """A batch of several calls overlaps them: each is built while the server runs the one before. The server's
    script cache flushed: the first call is refused (NOSCRIPT) after it was sent, and is made again whole."""
    store.park("first", envelope(), delay=60)  # the scripts loaded, then forgotten
    client.script_flush()
    ids = [f"job-{n}" for n in range(2500)]
    results = store.park_many([ParkRequest(id, envelope(id.encode()), delay=60) for id in ids])
    assert [result.id for result in results] == ids and {result.outcome for result in results} == {"new"}
    stats = store.stats()
    assert stats.parked == 2501 and stats.counters["parked"] == 2501
    assert store.get("job-2499").envelope.payload == b"job-2499"


def test_a_refused_batch_of_several_calls_says_why_as_one_call_does_and_writes_nothing(store, client):
    client.set(store.keys.due, "not a sorted set")
    with pytest.raises(DelayBrokerError, match="WRONGTYPE") as one:
        store.park_many([ParkRequest(f"job-{n}", envelope(), delay=60) for n in range(10)])
    with pytest.raises(DelayBrokerError, match="WRONGTYPE") as many:
        store.park_many([ParkRequest(f"job-{n}", envelope(), delay=60) for n in range(2500)])
    assert type(many.value) is type(one.value) and str(many.value) == str(one.value)
    client.delete(store.keys.due)
    assert store.stats().parked == 0 and store.get("job-0") is None
    assert client.ping(), "the connection a refused call was sent on serves again"


def test_fifo_within_one_millisecond(store, client, ready_key):
    due = datetime.now(timezone.utc) - timedelta(seconds=1)
    ids = [f"job-{n:04d}" for n in range(300)]
    store.park_many([ParkRequest(id, envelope(id.encode()), due=due) for id in reversed(ids)])
    promote(store, ready_key)
    popped = [client.rpop(ready_key).decode() for _ in ids]
    assert popped == list(reversed(ids))


def test_fifo_holds_however_many_parks_came_before(store, client, ready_key):
    # 1,023 parks of another due time first: a store-wide counter of 1,024 slots would wrap between the next two.
    store.park_many([ParkRequest(f"other-{n}", envelope(b"other"), delay=3600) for n in range(1023)])
    due = datetime.now(timezone.utc) - timedelta(seconds=1)
    store.park("first", envelope(b"first"), due=due)
    store.park("second", envelope(b"second"), due=due)
    batch = [f"job-{n:04d}" for n in range(1100)]  # past the millisecond's 1,024 slots
    store.park_many([ParkRequest(id, envelope(id.encode()), due=due) for id in batch])
    assert promote(store, ready_key) + promote(store, ready_key) == 1102
    popped = [client.rpop(ready_key) for _ in range(1102)]
    expected = [b"first", b"second", *(id.encode() for id in batch)]
    assert popped[:1023] == expected[:1023], "parking order, for the 1,024 slots of a millisecond"
    assert sorted(popped) == sorted(expected), "past them: every message, in an order of their own"


def test_retries_requeues_and_reschedules_go_after_what_is_due_at_the_same_time(store, client, ready_key):
    store.park_many([ParkRequest(f"other-{n}", envelope(b"other"), delay=3600) for n in range(1023)])
    store.park_many([ParkRequest(id, envelope(id.encode()), delay=0) for id in ("a", "b")])
    claim = store.claim(10, 30, "p")
    store.nack(claim.lease_deadline_ms, [("a", "boom", "dead"), ("b", "boom", "dead")])
    assert store.requeue_dead(["a", "b"]).count == 2
    due = store.get("a").due_ms
    store.park("c", envelope(b"c"), due=datetime.fromtimestamp(due / 1000, timezone.utc))
    store.park("d", envelope(b"d"), delay=60)
    store.reschedule("d", due=datetime.fromtimestamp(due / 1000, timezone.utc))
    assert [info.id for info in store.list_messages("due", count=4)] == ["a", "b", "c", "d"]


def test_keep_mode_deduplicates(store):
    first = store.park("job", envelope(b"first"), delay=60)
    again = store.park("job", envelope(b"second"), delay=3600, on_conflict="keep")
    assert again.outcome == "kept" and again.due_ms == first.due_ms
    assert store.get("job").envelope.payload == b"first"


def test_replace_mode_debounces(store):
    store.park("job", envelope(b"first"), delay=60)
    later = store.park("job", envelope(b"second"), delay=3600)
    assert later.outcome == "replaced"
    info = store.get("job")
    assert info.due_ms == later.due_ms and info.envelope.payload == b"second"
    assert store.stats().parked == 1


@pytest.mark.parametrize("id", ["job", str(uuid.UUID(int=7))], ids=["ordinary", "packed"])
def test_a_park_repeated_counts_one_message_parked_and_the_rest_replaced(store, ready_key, id):
    # A producer whose park got no answer parks again: 'parked' must still match what is promoted.
    store.park(id, envelope(b"first"), delay=3600)
    store.park(id, envelope(b"again"), delay=3600)
    store.park_many([ParkRequest(id, envelope(b"third"), delay=0)])
    assert store.stats().counters == {"parked": 1, "replaced": 2}
    assert promote(store, ready_key) == 1
    store.park(id, envelope(b"next"), delay=0)
    assert len(store.claim(10, 30, "p").messages) == 1
    store.park(id, envelope(b"retried"), delay=0)  # a Dramatiq retry re-parks a message under way: it came back
    assert store.stats().counters == {"parked": 3, "replaced": 2, "promoted": 2}


def test_cancel(store, client, ready_key):
    store.park("job", envelope(), delay=0)
    assert store.cancel("job") is True
    assert store.cancel("job") is False
    assert store.cancel("never-parked") is False
    assert promote(store, ready_key) == 0
    assert client.exists(store.keys.due, store.keys.msg, store.keys.dead) == 0
    assert store.stats().counters["cancelled"] == 1


def test_reschedule_later_and_to_now(store, client, ready_key):
    store.park("job", envelope(b"p"), delay=timedelta(days=30))
    assert promote(store, ready_key) == 0
    later = store.reschedule("job", delay=timedelta(days=60))
    assert later is not None and later > store.get("job").due_ms - 1
    now = store.reschedule("job", delay=0)
    assert now is not None
    assert promote(store, ready_key) == 1
    assert client.rpop(ready_key) == b"p"
    assert store.reschedule("job", delay=0) is None


def test_a_rewrite_keeps_the_record_format_an_older_release_wrote(store, client):
    """A rolling upgrade: a JSON-header record rewritten by a new release (the CLI moving a Celery task's eta)
    stays JSON, or the older release's promoters would dead-letter it. New records are written as configured."""
    DelayStore(client, namespace=store.keys.namespace, record_version=1).park("old", envelope(b"v1"), delay=60)
    info = store.get("old")
    assert info is not None and info.envelope is not None and info.envelope.version == 1
    store.reschedule("old", delay=120, envelope=dataclasses.replace(info.envelope, payload=b"rewritten"))
    assert client.hget(store.keys.msg, "old").startswith(b'{"v":1,')
    assert store.get("old").envelope.payload == b"rewritten"
    store.park("new", envelope(b"v2"), delay=60)
    assert client.hget(store.keys.msg, "new").startswith(b"\x02")


def test_a_rewrite_read_before_the_id_was_parked_again_is_refused(store):
    """A Celery retry parks its task id again: a reschedule that rewrites the envelope it read before that (the
    eta) must not write the old body over the new one, which would be lost and the old run twice."""
    store.park("task", envelope(b"first"), delay=60)
    read = store.get("task")
    assert read is not None and read.envelope is not None
    store.park("task", envelope(b"retry"), delay=90)
    rewritten = dataclasses.replace(read.envelope, payload=b"first, moved")
    assert store.reschedule("task", delay=5, envelope=rewritten, expected=read) is None
    assert store.get("task").envelope.payload == b"retry"
    current = store.get("task")
    assert store.reschedule("task", delay=5, envelope=rewritten, expected=current) is not None
    assert store.get("task").envelope.payload == b"first, moved"
    headers_only = store.list_messages("due", headers_only=True)[0]
    with pytest.raises(ValueError, match="read whole"):
        store.reschedule("task", delay=5, expected=headers_only)


def test_reschedule_to_an_absolute_time(store):
    store.park("job", envelope(), delay=60)
    due = datetime(2040, 1, 1, tzinfo=timezone.utc)
    assert store.reschedule("job", due=due) == int(due.timestamp() * 1000)
    with pytest.raises(InvalidDelay):
        store.reschedule("job", delay=-1)


def test_list_and_stats(store):
    now_ms = int(time.time() * 1000)
    store.park("overdue", envelope(name="tasks.late"), due=datetime.now(timezone.utc) - timedelta(seconds=5))
    store.park("soon", envelope(), delay=30)
    store.park("hour", envelope(), delay=1800)
    store.park("month", envelope(), delay=timedelta(days=30))
    page = store.list_messages("due")
    assert [info.id for info in page] == ["overdue", "soon", "hour", "month"]
    assert page[0].envelope.name == "tasks.late"
    assert [i.id for i in store.list_messages("due", offset=1, count=2)] == ["soon", "hour"]
    assert [i.id for i in store.list_messages("due", start_ms=now_ms, end_ms=now_ms + 3_600_000)] == [
        "soon",
        "hour",
    ]
    stats = store.stats()
    assert (stats.parked, stats.inflight, stats.dead, stats.overdue) == (4, 0, 0, 1)
    assert 4000 <= stats.oldest_overdue_age_ms <= 15000
    assert stats.histogram == [1, 1, 0, 1], "overdue messages are counted apart from the histogram"
    assert stats.counters["parked"] == 4


def test_claim_ack_and_lease_ownership(store):
    store.park_many([ParkRequest(f"job-{n}", envelope(), delay=0) for n in range(3)])
    claim = store.claim(10, lease=30, promoter_id="p1")
    assert [m.id for m in claim.messages] == ["job-0", "job-1", "job-2"]
    assert store.stats().inflight == 3
    assert store.get("job-0").state == "inflight"
    assert store.ack(claim.lease_deadline_ms + 1, ["job-0"]) == 0, "a stale lease token must not ack"
    assert store.ack(claim.lease_deadline_ms, ["job-0", "job-1", "job-2"]) == 3
    stats = store.stats()
    assert (stats.parked, stats.inflight) == (0, 0) and stats.counters["promoted"] == 3


def test_expired_lease_goes_back_and_old_holder_cannot_ack(store):
    store.park("job", envelope(), delay=0)
    first = store.claim(10, lease=0.05, promoter_id="p1")
    assert len(first.messages) == 1
    time.sleep(0.1)
    second = store.claim(10, lease=30, promoter_id="p2")
    assert [m.id for m in second.messages] == ["job"]
    assert second.messages[0].due_ms == first.messages[0].due_ms, "a recovered message keeps its due time"
    assert store.ack(first.lease_deadline_ms, ["job"]) == 0
    assert store.ack(second.lease_deadline_ms, ["job"]) == 1


def test_a_message_parked_again_while_in_flight_counts_as_promoted_once(store):
    # A Dramatiq retry re-parks the same id while the promoter that delivered it still holds the lease.
    store.park("job", envelope(), delay=0)
    claim = store.claim(10, lease=30, promoter_id="p")
    assert store.park("job", envelope(b"retry"), delay=60).outcome == "replaced"
    assert store.ack(claim.lease_deadline_ms, ["job"]) == 0, "the lease is gone with the re-park"
    stats = store.stats()
    assert stats.counters["promoted"] == 1 and stats.parked == 1 and stats.inflight == 0


def test_an_id_twice_in_one_batch_is_parked_as_by_two_calls_in_order(store):
    def batch(first: bytes, second: bytes) -> list[ParkRequest]:
        return [ParkRequest("twice", envelope(first), delay=60), ParkRequest("twice", envelope(second), delay=90)]

    kept = store.park_many(batch(b"first", b"second"), on_conflict="keep")
    assert [r.outcome for r in kept] == ["new", "kept"] and kept[1].due_ms == kept[0].due_ms
    assert store.get("twice").envelope.payload == b"first"
    assert store.cancel("twice")
    replaced = store.park_many(batch(b"first", b"second"))
    assert [r.outcome for r in replaced] == ["new", "replaced"]
    info = store.get("twice")
    assert info.envelope.payload == b"second" and info.due_ms == replaced[1].due_ms
    assert store.stats().parked == 1


def test_nack_backoff_dead_letter_and_requeue(store, client, ready_key):
    store.park("job", envelope(b"p"), delay=0)
    for attempt in range(1, 3):
        claim = store.claim(10, lease=30, promoter_id="p")
        assert [m.id for m in claim.messages] == ["job"], f"attempt {attempt}"
        assert store.nack(claim.lease_deadline_ms, [("job", "broker said no", "retry")]) == ["retried"]
        info = store.get("job")
        assert info.state == "due" and info.attempts == attempt and info.error == "broker said no"
        # Read off the stored due time, not by claiming at once: a stall longer than the 50 ms backoff would
        # let that claim succeed.
        assert info.due_ms >= claim.now_ms + 50 * 2 ** (attempt - 1), "retried only after a backoff"
        wait_for(lambda: store.stats().overdue == 1, timeout=5)  # due again after the backoff
    claim = store.claim(10, lease=30, promoter_id="p")
    assert store.nack(claim.lease_deadline_ms, [("job", "broker said no", "retry")]) == ["dead"]
    info = store.get("job")
    assert info.state == "dead" and "after 3 attempts" in info.error and info.envelope.payload == b"p"
    assert [i.id for i in store.list_messages("dead")] == ["job"]
    assert store.stats().dead == 1
    assert store.requeue_dead(["job"]).count == 1
    info = store.get("job")
    assert info.state == "due" and info.attempts == 0 and info.error is None
    assert promote(store, ready_key) == 1 and client.rpop(ready_key) == b"p"


def test_release_gives_back_without_counting_an_attempt(store):
    store.park("job", envelope(), delay=0)
    claim = store.claim(10, lease=30, promoter_id="p")
    assert store.nack(claim.lease_deadline_ms, [("job", "stopping", "release")]) == ["released"]
    info = store.get("job")
    assert info.state == "due" and info.attempts == 0 and info.due_ms == claim.messages[0].due_ms


def test_purge_dead(store):
    store.park_many([ParkRequest(f"job-{n}", envelope(), delay=0) for n in range(3)])
    claim = store.claim(10, lease=30, promoter_id="p")
    store.nack(claim.lease_deadline_ms, [(m.id, "bad", "dead") for m in claim.messages])
    assert store.purge_dead(["job-0"]) == 1
    assert store.purge_dead() == 2
    assert store.stats().dead == 0 and store.get("job-1") is None


def kill(store: DelayStore, ids: list[str]) -> None:
    """Dead-letter ``ids``, parked due now, as a promoter does when their delivery fails for good."""
    store.park_many([ParkRequest(id, envelope(), delay=0) for id in ids])
    claim = store.claim(len(ids), lease=30, promoter_id="p")
    store.nack(claim.lease_deadline_ms, [(m.id, "bad", "dead") for m in claim.messages])


def test_requeue_and_purge_of_all_leave_letters_dead_since(store):
    kill(store, ["old-0", "old-1"])
    time.sleep(0.005)
    asked_at = store.now_ms()
    time.sleep(0.005)
    kill(store, ["new"])
    assert store.requeue_dead(dead_by_ms=asked_at).count == 2
    assert [info.id for info in store.list_messages("dead")] == ["new"]
    kill(store, ["old-0", "old-1"])  # dead again, after the question
    assert store.purge_dead(dead_by_ms=asked_at) == 0
    assert store.purge_dead() == 3


def test_requeue_of_all_ends_while_a_promoter_kills_them_again(store):
    """Dead for a queue no promoter knows: each requeued letter dies again at once. Requeuing all used to follow
    them down the dead set and never end (2.6 million requeues of 20,000 letters in 40 s)."""
    count = 20_000
    store.park_many([ParkRequest(f"job-{n}", envelope(route="nowhere"), delay=0) for n in range(count)])
    promoters = [Promoter(store, routes(f"{store.keys.namespace}:ready"), batch=1000, max_idle=0.05) for _ in range(2)]
    for promoter in promoters:
        promoter.start()
    try:
        wait_for(lambda: store.stats().dead == count, timeout=60)
        result: list[Requeued] = []
        worker = threading.Thread(target=lambda: result.append(store.requeue_dead()), daemon=True)
        worker.start()
        worker.join(60)
        assert not worker.is_alive(), "requeue_dead() did not end"
        assert result[0].count == count
        assert store.stats().counters.get("requeued") == count
    finally:
        for promoter in promoters:
            promoter.stop()


def test_requeue_all_dead(store):
    store.park_many([ParkRequest(f"job-{n}", envelope(), delay=0) for n in range(5)])
    claim = store.claim(10, lease=30, promoter_id="p")
    store.nack(claim.lease_deadline_ms, [(m.id, "bad", "dead") for m in claim.messages])
    assert store.requeue_dead().count == 5
    assert store.stats().parked == 5


def test_missing_payload_and_corrupt_envelopes_are_dead_lettered(store, client, ready_key):
    store.park("good-1", envelope(b"1"), delay=0)
    store.park("good-2", envelope(b"2"), delay=0)
    score = client.zscore(store.keys.due, "good-1")
    client.zadd(store.keys.due, {"no-payload": score, "not-json": score, "no-header": score, "bad-route": score})
    client.hset(store.keys.msg, "not-json", b"{oops\npayload")
    client.hset(store.keys.msg, "no-header", b"just bytes")
    client.hset(store.keys.msg, "bad-route", envelope(route="somewhere-else").encode())
    result = store.promote_direct(routes(ready_key).direct_routes(), 100, "p")
    assert (result.promoted, result.dead_lettered) == (2, 4)
    assert sorted(client.lrange(ready_key, 0, -1)) == [b"1", b"2"]
    reasons = {info.id: info.error for info in store.list_messages("dead")}
    assert "missing payload" in reasons["no-payload"]
    assert "not a JSON object" in reasons["not-json"]
    assert "no header line" in reasons["no-header"]
    assert "unknown route" in reasons["bad-route"]
    assert store.get("not-json").raw == b"{oops\npayload", "a corrupt envelope is kept for inspection"


def test_keys_of_the_wrong_type_give_a_clear_error(store, client):
    client.set(store.keys.due, "not a sorted set")
    with pytest.raises(DelayBrokerError, match="WRONGTYPE"):
        store.park("job", envelope(), delay=1)


def test_redis_down_at_park_time_raises_store_unavailable(redis_server, namespace):
    dead_client = redis.Redis(port=1, socket_connect_timeout=0.2)
    with pytest.raises(StoreUnavailable, match="Redis unavailable"):
        DelayStore(dead_client, namespace=namespace).park("job", envelope(), delay=1)


def test_clients_that_decode_responses_are_refused(redis_server):
    with pytest.raises(DelayBrokerError, match="decode_responses"):
        DelayStore(redis_server.client(decode_responses=True))


def test_all_keys_share_one_hash_tag(store, client):
    store.park("job", envelope(), delay=0)
    claim = store.claim(1, lease=30, promoter_id="p")
    store.nack(claim.lease_deadline_ms, [("job", "x", "dead")])
    keys = store_keys(client, store)
    assert keys and all(f"{{{store.keys.namespace}}}".encode() in key for key in keys)


def test_requeue_all_passes_over_dead_letters_with_nothing_to_requeue(store, client):
    client.zadd(store.keys.dead, {f"empty-{n}": n for n in range(1500)})  # the oldest, with no payload
    store.park_many([ParkRequest(f"job-{n}", envelope(), delay=0) for n in range(3)])
    claim = store.claim(10, lease=30, promoter_id="p")
    store.nack(claim.lease_deadline_ms, [(m.id, "bad", "dead") for m in claim.messages])
    result = store.requeue_dead()
    assert result.count == 3 and sorted(result.not_requeued) == sorted(f"empty-{n}" for n in range(1500))
    assert store.stats().dead == 1500 and store.stats().parked == 3


def test_reschedule_refuses_a_wrong_type_key_before_changing_anything(store, client):
    store.park("job", envelope(b"old"), delay=3600)
    before = client.zscore(store.keys.due, "job")
    client.set(store.keys.wake, "not a list")
    with pytest.raises(DelayBrokerError, match="WRONGTYPE"):
        store.reschedule("job", delay=0, envelope=envelope(b"new"))
    assert client.zscore(store.keys.due, "job") == before
    assert store.get("job").envelope.payload == b"old"


def test_a_durable_store_does_not_claim_on_a_master_without_its_replicas(store: DelayStore, client: redis.Redis):
    durable = DelayStore(client, namespace=store.keys.namespace, replicas=1, replica_timeout=0.05)
    store.park_many([ParkRequest(f"m{n}", envelope(), delay=0) for n in range(3)])
    with pytest.raises(NotReplicated, match="not claiming: the master has 0 of 1"):
        durable.claim(10, lease=0.05, promoter_id="p")
    stats = store.stats()
    assert (stats.parked, stats.inflight, stats.dead) == (3, 0, 0), "nothing held, nothing counted"
    assert all(store.get(f"m{n}").attempts == 0 for n in range(3))  # type: ignore[union-attr]


def test_a_sharded_namespace_lists_pages_by_offset_in_due_order(client: redis.Redis, namespace: str):
    """Each shard's first offset + count entries are read as (score, id) only, and the page's own messages whole:
    the pages are those of one sorted list, deep ones too."""
    store = DelayStore(client, namespace=namespace, shards=4)
    now = store.now_ms()
    ids = [f"p-{n:03d}" for n in range(300)]
    store.park_many(
        [ParkRequest(id, envelope(id.encode()), due=datetime.fromtimestamp((now + 60_000 + n) / 1000, tz=timezone.utc))
         for n, id in enumerate(ids)]
    )  # fmt: skip
    assert len({store.shard_for(id) for id in ids}) == 4
    for offset, count in ((0, 10), (37, 25), (250, 100), (299, 5), (300, 5)):
        page = store.list_messages("due", offset=offset, count=count)
        assert [info.id for info in page] == ids[offset : offset + count]
        assert all(info.envelope is not None and info.envelope.payload == info.id.encode() for info in page)
    window = store.list_messages("due", start_ms=now + 60_100, end_ms=now + 60_149, offset=10, count=20)
    assert [info.id for info in window] == ids[110:130]
    client.delete(*(key for space in store.shards for key in space.all()))


def test_the_shard_count_is_recorded_once_and_followed_by_stores_that_took_the_default(
    client: redis.Redis, namespace: str
):
    early = DelayStore(client, namespace=namespace)  # no count given, none recorded: one shard for now
    assert len(early.shards) == 1
    sharded = DelayStore(client, namespace=namespace, shards=4)
    sharded.park_many([ParkRequest(f"s{n}", envelope(), delay=60) for n in range(20)])
    early.refresh_layout()
    assert len(early.shards) == 4 and early.stats().parked == 20 and early.get("s7") is not None
    with pytest.raises(ConfigurationError, match="has 4 shard"):
        DelayStore(client, namespace=namespace, shards=1).stats()
    one = f"{namespace}-one"
    DelayStore(client, namespace=one, shards=1).stats()
    with pytest.raises(ConfigurationError, match="has 1 shard"):
        DelayStore(client, namespace=one, shards=4).stats()
    client.delete(
        *(key for space in sharded.shards for key in space.all()), *DelayStore(client, namespace=one).keys.all()
    )


def test_a_store_given_no_count_records_one_shard_when_it_first_parks(client: redis.Redis, namespace: str):
    """Else a producer deployed before `shards=4` parks into shard 0 for ever while the new ones park the same id
    into its home shard: dedup and debounce would each make a second copy, run twice."""
    ids = [f"order-{n}" for n in range(20)]
    late = DelayStore(client, namespace=namespace)  # no count yet: one shard for now
    assert len(late.shards) == 1
    first = DelayStore(client, namespace=namespace)
    first.park(ids[0], envelope(b"v1"), delay=60)  # records one shard
    with pytest.raises(ConfigurationError, match="has 1 shard"):
        DelayStore(client, namespace=namespace, shards=4).stats()
    other = f"{namespace}-other"
    early = DelayStore(client, namespace=other)
    assert len(early.shards) == 1
    sharded = DelayStore(client, namespace=other, shards=4)
    assert len(sharded.shards) == 4  # recorded before `early` parks: taken by it
    early.park_many([ParkRequest(id, envelope(b"early"), delay=60) for id in ids])
    assert len(early.shards) == 4
    kept = sharded.park_many([ParkRequest(id, envelope(b"later"), delay=60) for id in ids], on_conflict="keep")
    assert {result.outcome for result in kept} == {"kept"} and sharded.stats().parked == len(ids)
    client.delete(*first.keys.all(), *(key for space in sharded.shards for key in space.all()))


def test_promotion_lateness_is_counted_store_wide_on_both_paths(client, namespace):
    store = DelayStore(client, namespace=namespace, shards=2)
    past = datetime.now(timezone.utc) - timedelta(seconds=5)
    for n in range(6):
        store.park(f"late-{n}", Envelope(route="ready", payload=b"x"), due=past)
    store.park("on-time", Envelope(route="ready", payload=b"x"), delay=0)
    direct = DirectLists({"ready": ListTarget(f"{namespace}:ready")})
    promoted = sum(store.promote_direct(direct.direct_routes(), 3, "p", shard=shard).promoted for shard in (0, 1))
    for shard in (0, 1):
        claim = store.claim(100, 30, "p", shard=shard)
        store.ack(claim.lease_deadline_ms, [m.id for m in claim.messages], shard=shard)
        promoted += len(claim.messages)
    assert promoted == 7
    buckets = dict(store.promotion_lateness())
    assert list(buckets) == ["10", "100", "1000", "10000", "60000", "more"]
    assert sum(buckets.values()) == 7
    assert buckets["10000"] == 6, "five seconds late"


@pytest.mark.parametrize("values", [True, False])
def test_lateness_counted_by_bucket_is_what_each_message_says(client, namespace, values):
    """Without per-message lateness (no listener wants it) promote_list.lua counts the taken messages by
    bucket with a ZCOUNT per edge: the same counts, dead letters left out, as reading each message's score."""
    store = DelayStore(client, namespace=namespace)
    now = datetime.now(timezone.utc)
    lates = [0.5, 0.5, 2, 2, 2, 20, 20, 90]  # seconds past due: buckets 1000, 10000, 60000, more
    for n, late in enumerate(lates):
        store.park(f"m{n}", Envelope(route="ready", payload=b"x"), due=now - timedelta(seconds=late))
    store.park("lost", Envelope(route="nowhere", payload=b"x"), due=now - timedelta(seconds=2))
    result = store.promote_direct({"ready": ListTarget(f"{namespace}:ready")}, 1000, "p", lateness=values)
    assert (result.promoted, result.dead_lettered) == (8, 1)
    assert len(result.lateness_ms) == (8 if values else 0)
    counts = dict(store.promotion_lateness())
    assert counts == {"10": 0, "100": 0, "1000": 2, "10000": 3, "60000": 2, "more": 1}


def test_promotion_takes_exactly_the_due_messages_and_spells_each_hash_field_as_parked(client, namespace):
    """promote_list.lua takes the due messages (removed by rank: the user here may) and spells a 16-byte hash
    field back as its UUID text: the ids it pushes are those parked, whatever their bytes (0x00, 0x7f, 0x80, 0xff
    at every position), and what is not due stays parked."""
    store = DelayStore(client, namespace=namespace)
    fields = [str(uuid.UUID(bytes=bytes([value]) * 16)) for value in (0x00, 0x01, 0x7F, 0x80, 0xFF)]
    fields += [str(uuid.UUID(bytes=bytes(range(16)))), str(uuid.UUID(bytes=bytes(range(255, 239, -1))))]
    fields += [str(uuid.uuid4()) for _ in range(50)]
    now = datetime.now(timezone.utc)
    for n, field in enumerate(fields):
        parked = Envelope(route="q", payload=field.encode(), hash_field=field)
        store.park(f"m{n}", parked, due=now - timedelta(milliseconds=n))
    store.park("later", Envelope(route="q", payload=b"later", hash_field=str(uuid.uuid4())), delay=3600)
    target = ListTarget(f"{namespace}:q", mode="hash", hash_key=f"{namespace}:q.msgs")
    assert store.promote_direct({"q": target}, 1000, "p").promoted == len(fields)
    assert sorted(client.lrange(f"{namespace}:q", 0, -1)) == sorted(field.encode() for field in fields)
    assert client.hgetall(f"{namespace}:q.msgs") == {field.encode(): field.encode() for field in fields}
    assert [info.id for info in store.iter_all()] == ["later"]


@pytest.mark.parametrize("shards", [1, 3])
def test_listings_can_leave_payloads_in_redis(client: redis.Redis, namespace: str, shards: int):
    # What `ls`, `dead ls` and the dashboard show is the header: a page of 1 MB messages must not cost Redis
    # (and a maxmemory set near the data) another megabyte per message in its reply.
    store = DelayStore(client, namespace=namespace, shards=shards, max_payload_bytes=2_000_000)
    big = b"p" * 1_000_000
    store.park_many(
        [
            ParkRequest(f"m{n}", Envelope(route="emails", payload=big, name="send", framework="raw"), delay=60)
            for n in range(5)
        ]
    )
    store.park("corrupt", envelope(), delay=61)
    client.hset(store.shards[store.shard_for("corrupt")].msg, "corrupt", b"no header line")
    for infos in (
        store.list_messages(headers_only=True),
        Operations(store).find(MessageFilter(queue="emails"), headers_only=True).messages,
    ):
        infos = [info for info in infos if info.id != "corrupt"]
        assert sorted(info.id for info in infos) == [f"m{n}" for n in range(5)]
        for info in infos:
            assert info.payload_omitted and info.raw is not None and len(info.raw) < 100
            assert info.envelope is not None and info.envelope.payload == b""
            assert (info.envelope.route, info.envelope.name, info.envelope.framework) == ("emails", "send", "raw")
    [corrupt] = [info for info in store.list_messages(headers_only=True) if info.id == "corrupt"]
    assert corrupt.raw == b"no header line" and corrupt.envelope is None, "a corrupt envelope is shown whole"
    whole = store.list_messages(count=1)[0]
    assert not whole.payload_omitted and whole.envelope is not None and whole.envelope.payload == big
    assert Operations(store).count(MessageFilter(queue="emails")).matched == 5


def test_a_reader_opened_before_the_application_sees_the_shards_it_records(client: redis.Redis, namespace: str):
    # A dashboard or an exporter deployed while the namespace is still empty: it took one shard; it must not
    # show a quarter of the backlog (and cancel a quarter of what it is asked to) for ever.
    reader = DelayStore(client, namespace=namespace)
    assert reader.stats().parked == 0 and len(reader.shards) == 1
    producer = DelayStore(client, namespace=namespace, shards=4)
    ids = [f"job-{n}" for n in range(40)]
    producer.park_many([ParkRequest(id, envelope(), delay=3600) for id in ids])
    wait_for(lambda: reader.stats().parked == 40, timeout=5, what="the reader to see every shard")
    assert len(reader.shards) == 4 and all(reader.get(id) is not None for id in ids)
    assert reader.cancel_many(ids) == 40 and producer.stats().parked == 0


def test_an_id_given_twice_to_cancel_is_counted_once(store):
    store.park("a", envelope(), delay=60)
    assert store.cancel_each(["a", "b", "a"]) == [True, False, False]
    store.park("a", envelope(), delay=60)
    assert store.cancel_many(["a", "a"]) == 1 and store.get("a") is None


def test_withdraw_takes_back_its_own_copy_but_never_stops_a_retry_of_a_run_in_flight(store):
    # After a park that raised StoreUnavailable, the adapters ask whether to send the message some other way.
    store.park("job", envelope(b"unconfirmed"), delay=3600)
    assert store.withdraw("job", b"unconfirmed") is True and store.get("job") is None, "taken back: send it"
    store.park("run", envelope(b"run 1"), delay=0)
    claim = store.claim(10, 30, "p")
    assert [message.id for message in claim.messages] == ["run"]
    assert store.withdraw("run", b"run 1") is False, "this very message is being promoted: it runs from there"
    # A retry reuses its message's id while the run it retries may still be in flight: that is not its copy.
    assert store.withdraw("run", b"run 2, the retry") is True
    assert store.get("run").state == "inflight"


def test_promotion_ahead_takes_what_is_due_that_much_later_and_counts_lateness_from_then(client, namespace):
    """``ahead``: a message counts as due that long before its due time (for consumers that hold a message until
    its own due time), on both promotion paths; the next look is then, and lateness is measured against it."""
    store = DelayStore(client, namespace=namespace)
    store.park("soon", Envelope(route="ready", payload=b"x"), delay=0.8)
    store.park("later", Envelope(route="ready", payload=b"x"), delay=30)
    targets = {"ready": ListTarget(f"{namespace}:ready")}

    assert store.promote_direct(targets, 100, "p").promoted == 0, "not due yet"
    result = store.promote_direct(targets, 100, "p", ahead=2.0)
    assert (result.promoted, client.llen(f"{namespace}:ready")) == (1, 1)
    assert -200 <= result.lateness_ms[0] <= 1300, "promoted 2 s ahead of 0.8 s: up to 1.2 s early, counted late"
    assert result.next_due_ms is not None
    assert 26_000 <= result.next_due_ms - result.now_ms <= 28_000, "the next look: 30 s less 2 s ahead"

    store.park("claimed", Envelope(route="ready", payload=b"x"), delay=0.8)
    assert store.claim(100, 30, "p").messages == []
    claim = store.claim(100, 30, "p", ahead=2.0)
    assert [message.id for message in claim.messages] == ["claimed"]
    assert claim.ahead_ms == 2000
    assert claim.next_wake_ms is not None and claim.next_wake_ms <= claim.lease_deadline_ms, "lease expiry in time"

    for bad in (-0.1, 61.0):
        with pytest.raises(ValueError, match="ahead must be between 0 and 60"):
            store.promote_direct(targets, 100, "p", ahead=bad)
